"""Approval policy evaluation: does this intent need a person? (docs/api.md, Approvals)

Pure functions over the contract's ``approval`` block and the frozen arguments; no
Django import. The result says which rules matched so the approver sees why.
"""

from dataclasses import dataclass, field
from typing import Any

OPERATORS = {"eq", "ne", "gt", "gte", "lt", "lte", "in"}
# What a rule does when the operation omits its argument: "match" (the default, also of
# every rule stored without the key) asks a person; "skip" lets the rule pass.
WHEN_MISSING = ("match", "skip")
_MISSING = object()


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """RFC 6901 JSON pointer to reference tokens ("" is the whole document)."""
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError(f"JSON pointer must start with '/': {pointer!r}")
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/"))


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at ``pointer``, or ``_MISSING`` (see ``is_missing``)."""
    value = document
    for token in parse_pointer(pointer):
        if isinstance(value, dict):
            if token not in value:
                return _MISSING
            value = value[token]
        elif isinstance(value, list):
            if not (token.isascii() and token.isdigit()) or (
                len(token) > 1 and token.startswith("0")
            ):
                return _MISSING
            index = int(token)
            if index >= len(value):
                return _MISSING
            value = value[index]
        else:
            return _MISSING
    return value


def is_missing(value: Any) -> bool:
    return value is _MISSING


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _comparable(a: Any, b: Any) -> bool:
    return (_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str))


def json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: numbers by value (1 == 1.0), booleans never numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if _is_number(a) and _is_number(b):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def skips_when_missing(rule: dict[str, Any]) -> bool:
    """Whether the rule passes an operation that omits its argument (``"when_missing":
    "skip"``); a rule without the key matches it."""
    return rule.get("when_missing", "match") == "skip"


def rule_matches(rule: dict[str, Any], arguments: Any) -> bool:
    """Whether one rule asks for approval.

    A rule on an absent argument matches, whatever its operator, unless it says
    ``"when_missing": "skip"``: the policy cannot tell what the operation will do, so a
    person decides. So does an ordering comparison between values of different types (a
    string amount against a numeric limit).
    """
    actual = resolve_pointer(arguments, rule["path"])
    if is_missing(actual):
        return not skips_when_missing(rule)
    op, expected = rule["op"], rule["value"]
    if op == "eq":
        return json_equal(actual, expected)
    if op == "ne":
        return not json_equal(actual, expected)
    if op == "in":
        return any(json_equal(actual, item) for item in expected)
    if not _comparable(actual, expected):
        return True
    return {
        "gt": actual > expected,
        "gte": actual >= expected,
        "lt": actual < expected,
        "lte": actual <= expected,
    }[op]


@dataclass(frozen=True)
class PolicyResult:
    required: bool
    mode: str
    matched_rules: list[dict[str, Any]] = field(default_factory=list)
    runner_reason: str | None = None
    # The paths of the matched rules whose argument the operation omits.
    absent_paths: frozenset[str] = frozenset()

    @property
    def reason(self) -> str:
        """One sentence for the approver: why a person is asked."""
        parts = []
        if self.mode == "always":
            parts.append("The tool's contract requires approval for every operation.")
        for rule in self.matched_rules:
            shown = f"{rule['path']} {rule['op']} {rule['value']!r}"
            if rule["path"] in self.absent_paths:
                parts.append(
                    f"Rule matched: {shown}: {rule['path']} is absent, so a person decides."
                )
            else:
                parts.append(f"Rule matched: {shown}.")
        if self.runner_reason is not None:
            parts.append(f"The runner asked for approval: {self.runner_reason}")
        return " ".join(parts)


def evaluate(
    approval: dict[str, Any],
    arguments: Any,
    *,
    runner_requested: bool = False,
    runner_reason: str | None = None,
) -> PolicyResult:
    """Decide whether an operation needs approval before its first attempt.

    A runner may ask for approval where the policy would not; it can never lower the
    policy.
    """
    mode = approval["mode"]
    matched: list[dict[str, Any]] = []
    absent: frozenset[str] = frozenset()
    if mode == "always":
        required = True
    elif mode == "rules":
        matched = [rule for rule in approval["rules"] if rule_matches(rule, arguments)]
        absent = frozenset(
            rule["path"] for rule in matched if is_missing(resolve_pointer(arguments, rule["path"]))
        )
        required = bool(matched)
    else:
        required = False
    reason = (runner_reason or "no reason given") if runner_requested else None
    return PolicyResult(
        required=required or runner_requested,
        mode=mode,
        matched_rules=matched,
        runner_reason=reason,
        absent_paths=absent,
    )
