"""Policies people write in Cedar, over Effectgate's vocabulary (docs/policies.md).

Principal ``Runner::"<runner name>"`` (attribute ``owner``: its owner's username),
action ``Action::"register"`` (an operation is registered) or ``Action::"activate"``
(a contract version would activate by itself), resource ``Tool::"<tool name>"``
(attributes ``name``, ``effect_class``, ``owner``: the owning runner's name). The
context of ``register``: ``arguments`` (the frozen arguments as a record, typed from the
tool's input schema, sensitive fields left out), ``effect_class``, ``principal`` (the
run's principal), ``run`` (``tool_calls``, ``spend``, ``turns`` so far) and ``time``
(``date``, ``weekday``, ``hour``, ``minute``, ``unix``) in ``POLICY_TIME_ZONE``. The
context of ``activate``: ``first_version``, ``effect_class``, ``version``.

Each policy is one Cedar statement with an ``@id``. ``forbid`` refuses; ``permit`` with
``@approval("required")`` asks for a person on the terms of its annotations; a plain
``permit`` changes nothing (it records that it matched, in shadow mode). A policy that
cannot be evaluated for an operation (an argument it reads is absent) asks a person,
unless it says ``@when_missing("skip")``.

Pure: the caller hands in the contracts, the policies and the facts. Nothing here reads
a database, a file or the network; texts and values are bounded before Cedar sees them.
"""

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

import cedarpy

from .errors import PolicyInvalid
from .schema import ACTIVATE, DECIMAL_LIMIT, REGISTER, arguments_record, decimal_value, schema_for

ACTIONS = (REGISTER, ACTIVATE)

MAX_TEXT = 20_000
MAX_MESSAGE = 500
POLICY_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,79}")
GROUP_NAME = re.compile(r"[^\x00-\x1f\x7f]{1,150}")
DURATION = re.compile(r"([1-9][0-9]{0,6})([smhd])")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_TTL_S = 30 * 86400
MAX_WINDOW_S = 366 * 86400
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

# The annotations a policy may carry; any other is refused (a typo must not silently
# turn a rule off).
ASKING = {"approvals_required", "group", "request_ttl", "grant_ttl", "second_factor"}
WINDOWED = {"window", "max_count", "max_sum", "sum_of", "group_by"}
ANNOTATIONS = {"id", "message", "approval", "when_missing", *ASKING, *WINDOWED}


class Kind(StrEnum):
    """What a policy does when it matches."""

    FORBID = "forbid"
    REQUIRE = "require"  # a permit with @approval("required")
    PERMIT = "permit"


@dataclass(frozen=True)
class Requirement:
    """What a policy that asks for approval asks: the strictest of all that match, and
    of the contract, applies (``strictest``)."""

    approvals_required: int = 1
    groups: tuple[str, ...] = ()
    request_ttl_s: int | None = None
    grant_ttl_s: int | None = None
    second_factor: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "approvals_required": self.approvals_required,
            "groups": list(self.groups),
            "request_ttl_s": self.request_ttl_s,
            "grant_ttl_s": self.grant_ttl_s,
            "second_factor": self.second_factor,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Requirement":
        return cls(
            approvals_required=int(data.get("approvals_required", 1)),
            groups=tuple(data.get("groups", ())),
            request_ttl_s=data.get("request_ttl_s"),
            grant_ttl_s=data.get("grant_ttl_s"),
            second_factor=bool(data.get("second_factor", False)),
        )


def strictest(requirements: Iterable[Requirement]) -> Requirement:
    """The most any of them asks: the largest quorum, every group, the shortest
    lifetimes, a second factor if any asks one."""
    found = list(requirements)
    if not found:
        return Requirement()

    def shortest(values: Iterable[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return min(known) if known else None

    return Requirement(
        approvals_required=max(r.approvals_required for r in found),
        groups=tuple(sorted({g for r in found for g in r.groups})),
        request_ttl_s=shortest(r.request_ttl_s for r in found),
        grant_ttl_s=shortest(r.grant_ttl_s for r in found),
        second_factor=any(r.second_factor for r in found),
    )


@dataclass(frozen=True)
class Window:
    """A limit over time (``@window`` with ``@max_count`` and/or ``@max_sum`` of
    ``@sum_of``, grouped by ``@group_by``): the policy asks for a person only when the
    operations it matched in the window, this one included, pass a bound."""

    seconds: int
    max_count: int | None
    max_sum: Decimal | None
    sum_of: str
    group_by: str  # "" (everything the policy matches), "principal", "tool", "runner" or a pointer


@dataclass(frozen=True)
class Policy:
    """One policy version, parsed and checked: what the engine needs to apply it."""

    policy_id: str
    text: str
    effect: str  # "forbid" or "permit"
    actions: frozenset[str]
    tools: frozenset[str] | None  # the tools its resource names; None: any tool
    message: str
    asks: Requirement | None  # a permit with @approval("required")
    when_missing: str  # "match" or "skip"
    window: Window | None = None

    @property
    def kind(self) -> Kind:
        if self.effect == "forbid":
            return Kind.FORBID
        return Kind.REQUIRE if self.asks is not None else Kind.PERMIT


def _duration(value: str, name: str) -> int:
    match = DURATION.fullmatch(value)
    if match is None:
        raise PolicyInvalid(f'@{name}("{value}"): a duration like "90s", "15m", "24h" or "7d".')
    seconds = int(match.group(1)) * SECONDS[match.group(2)]
    if seconds > MAX_TTL_S and name != "window":
        raise PolicyInvalid(f"@{name}: at most 30 days.")
    if name == "window" and seconds > MAX_WINDOW_S:
        raise PolicyInvalid("@window: at most 366 days.")
    return seconds


def _positive(value: str, name: str, *, most: int) -> int:
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= most:
        raise PolicyInvalid(f'@{name}("{value}"): a whole number from 1 to {most}.')
    return int(value)


def _pointer(value: str, name: str) -> str:
    if not value.startswith("/") or len(value) > 200:
        raise PolicyInvalid(
            f'@{name}("{value}"): a JSON pointer into the arguments, like "/amount".'
        )
    return value


def _window(notes: Mapping[str, str]) -> Window | None:
    if not WINDOWED & notes.keys():
        return None
    if "window" not in notes:
        raise PolicyInvalid("@max_count, @max_sum, @sum_of and @group_by need a @window.")
    if "max_count" not in notes and "max_sum" not in notes:
        raise PolicyInvalid("@window needs a bound: @max_count or @max_sum with @sum_of.")
    if ("max_sum" in notes) != ("sum_of" in notes):
        raise PolicyInvalid("@max_sum and @sum_of go together.")
    max_sum = None
    if "max_sum" in notes:
        try:
            max_sum = Decimal(notes["max_sum"])
        except InvalidOperation:
            max_sum = None
        if max_sum is None or not max_sum.is_finite() or max_sum < 0 or max_sum > DECIMAL_LIMIT:
            raise PolicyInvalid(f'@max_sum("{notes["max_sum"]}"): a number of at least 0.')
    group_by = notes.get("group_by", "")
    if group_by not in ("", "principal", "tool", "runner"):
        group_by = _pointer(group_by, "group_by")
    return Window(
        seconds=_duration(notes["window"], "window"),
        max_count=_positive(notes["max_count"], "max_count", most=1_000_000)
        if "max_count" in notes
        else None,
        max_sum=max_sum,
        sum_of=_pointer(notes["sum_of"], "sum_of") if "sum_of" in notes else "",
        group_by=group_by,
    )


def _requirement(notes: Mapping[str, str]) -> Requirement:
    group = notes.get("group")
    if group is not None and not GROUP_NAME.fullmatch(group):
        raise PolicyInvalid("@group names a group of people (1 to 150 visible characters).")
    second = notes.get("second_factor")
    if second not in (None, "required"):
        raise PolicyInvalid('@second_factor is "required" or absent.')
    return Requirement(
        approvals_required=_positive(
            notes.get("approvals_required", "1"), "approvals_required", most=10
        ),
        groups=(group,) if group else (),
        request_ttl_s=_duration(notes["request_ttl"], "request_ttl")
        if "request_ttl" in notes
        else None,
        grant_ttl_s=_duration(notes["grant_ttl"], "grant_ttl") if "grant_ttl" in notes else None,
        second_factor=second == "required",
    )


def _scope_entities(scope: Mapping[str, Any], kind: str) -> frozenset[str] | None:
    """The ids of ``kind`` a scope names (``==`` one, ``in [..]`` several), None for any."""
    op = scope.get("op")
    if op == "All":
        return None
    if op == "is":
        if scope.get("entity_type") != kind or "in" in scope:
            raise PolicyInvalid(f"The scope may name only {kind} entities.")
        return None
    entities = [scope["entity"]] if "entity" in scope else scope.get("entities", [])
    if op not in ("==", "in") or not entities:
        raise PolicyInvalid(f"The scope names {kind} entities with == or in [...].")
    ids = set()
    for entity in entities:
        if not isinstance(entity, dict) or entity.get("type") != kind:
            raise PolicyInvalid(f"The scope may name only {kind} entities.")
        ids.add(str(entity["id"]))
    return frozenset(ids)


def parse(text: str) -> Policy:
    """One policy statement, checked for syntax and vocabulary (not yet against the
    contracts: ``validate``). Raises ``PolicyInvalid`` with Cedar's message."""
    if not isinstance(text, str) or not text.strip():
        raise PolicyInvalid("A policy is one Cedar statement; this one is empty.")
    if len(text) > MAX_TEXT or "\x00" in text:
        raise PolicyInvalid(f"A policy is at most {MAX_TEXT} characters, without NUL.")
    try:
        parsed = json.loads(cedarpy.policies_to_json_str(text))
    except (ValueError, RuntimeError) as exc:
        raise PolicyInvalid(f"Cedar cannot parse the policy: {exc}") from exc
    if parsed.get("templates"):
        raise PolicyInvalid("Templates (?principal, ?resource) are not policies; link them first.")
    statements = list(parsed.get("staticPolicies", {}).values())
    if len(statements) != 1:
        raise PolicyInvalid(
            f"A policy is exactly one Cedar statement; this text has {len(statements)}."
        )
    statement = statements[0]
    notes: dict[str, str] = {k: str(v) for k, v in (statement.get("annotations") or {}).items()}
    unknown = sorted(notes.keys() - ANNOTATIONS)
    if unknown:
        raise PolicyInvalid(
            f"Unknown annotation @{unknown[0]}; a policy may carry "
            + ", ".join(f"@{name}" for name in sorted(ANNOTATIONS))
            + "."
        )
    policy_id = notes.get("id", "")
    if not POLICY_ID.fullmatch(policy_id):
        raise PolicyInvalid(
            'A policy needs an @id("...") of lowercase letters, digits, ".", "_" or "-" '
            "(at most 80, starting with a letter or digit)."
        )
    message = notes.get("message", "")
    if len(message) > MAX_MESSAGE or any(ord(c) < 32 for c in message):
        raise PolicyInvalid(f"@message is one line of at most {MAX_MESSAGE} characters.")
    effect = statement["effect"]
    approval = notes.get("approval")
    if approval not in (None, "required"):
        raise PolicyInvalid('@approval is "required" or absent.')
    if effect == "forbid" and (approval or ASKING & notes.keys() or WINDOWED & notes.keys()):
        raise PolicyInvalid("A forbid refuses; @approval and its terms go on a permit.")
    if approval is None and ASKING & notes.keys():
        raise PolicyInvalid(
            '@approvals_required, @group and the lifetimes need @approval("required").'
        )
    if approval is None and WINDOWED & notes.keys():
        raise PolicyInvalid('A @window asks for a person: it needs @approval("required").')
    when_missing = notes.get("when_missing", "match")
    if when_missing not in ("match", "skip"):
        raise PolicyInvalid('@when_missing is "match" (a person decides) or "skip".')
    _scope_entities(statement["principal"], "Runner")
    actions = _scope_entities(statement["action"], "Action")
    actions = frozenset(ACTIONS) if actions is None else actions
    if not actions <= set(ACTIONS):
        raise PolicyInvalid('The action is Action::"register" or Action::"activate".')
    if ACTIVATE in actions and effect == "permit" and approval:
        raise PolicyInvalid('On Action::"activate" a forbid holds the version for a person.')
    return Policy(
        policy_id=policy_id,
        text=text,
        effect=effect,
        actions=actions,
        tools=_scope_entities(statement["resource"], "Tool"),
        message=message,
        asks=_requirement(notes) if approval else None,
        when_missing=when_missing,
        window=_window(notes) if approval else None,
    )


def validate(text: str, contracts: Mapping[str, dict[str, Any]]) -> Policy:
    """Parse ``text`` and check it against the schema of every tool it can apply to:
    the tools its resource names, or every active tool. A policy that names an argument
    a tool does not have (without ``has``), or compares a string with a number, is
    refused with Cedar's message, naming the tool."""
    policy = parse(text)
    names = sorted(policy.tools) if policy.tools is not None else sorted(contracts)
    if not names:
        names = [""]  # no tool yet: checked against a tool without arguments
    problems: list[str] = []
    for name in names:
        contract = contracts.get(name)
        schema = schema_for(contract["input_schema"] if contract else None)
        result = cedarpy.validate_policies(text, schema)
        if not result.validation_passed:
            where = f"for tool {name}" if contract else "for a tool without arguments"
            problems.extend(f"{where}: {_cedar_message(e)}" for e in result.errors)
    if problems:
        raise PolicyInvalid("Cedar's validator refuses the policy " + problems[0], problems[:20])
    return policy


def _cedar_message(error: Any) -> str:
    return re.sub(r"^\[policy\d+\] ", "", str(error)).replace("for policy `policy0`, ", "")


# ---------------------------------------------------------------------------------------
# Evaluation


@dataclass(frozen=True)
class Facts:
    """What a policy sees of one registration (or, with ``action=ACTIVATE``, of one
    contract version about to activate)."""

    runner: str
    runner_owner: str
    tool: str
    tool_owner: str
    effect_class: str
    input_schema: dict[str, Any]
    arguments: Any = None
    principal: str = ""
    tool_calls: int = 0
    spend: Decimal = Decimal(0)
    turns: int = 0
    now: datetime | None = None  # aware, in the policies' time zone
    action: str = REGISTER
    first_version: bool = False
    version: int = 1


@dataclass(frozen=True)
class Hit:
    """One policy that matched (or could not be evaluated: ``missing``)."""

    policy: Policy
    missing: bool = False

    @property
    def asks(self) -> Requirement:
        return self.policy.asks or Requirement()


@dataclass(frozen=True)
class Verdict:
    """What the policies say of one registration."""

    forbidden: Hit | None = None
    asks: tuple[Hit, ...] = ()
    permits: tuple[Hit, ...] = ()
    # Every forbid that matched, ``forbidden`` first: what each policy did, for the
    # shadow mode and the simulation (``forbidden`` alone decides the registration).
    forbids: tuple[Hit, ...] = ()

    @property
    def requirement(self) -> Requirement | None:
        return strictest(hit.asks for hit in self.asks) if self.asks else None

    def matched(self) -> tuple[Hit, ...]:
        return ((self.forbidden,) if self.forbidden else ()) + self.asks + self.permits


NOTHING = Verdict()


@dataclass
class PolicySet:
    """Policies compiled once for many evaluations (Cedar parses the text once)."""

    policies: Sequence[Policy]
    _compiled: Any = field(default=None, repr=False)
    _permits: "PolicySet | None" = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.policies:
            # One statement per policy, in order: Cedar names them policy0, policy1...
            self._compiled = cedarpy.PolicySet.from_str("\n".join(p.text for p in self.policies))

    def __len__(self) -> int:
        return len(self.policies)

    def evaluate_each(self, facts: Facts) -> Verdict:
        """``evaluate``, and also every permit that matched when a forbid did: Cedar
        names only the forbids behind a denial, which decides a registration but not
        what each policy would do (the shadow mode, the simulation). Costs a second
        evaluation, of the permits alone, only when a forbid matched."""
        verdict = self.evaluate(facts)
        if not verdict.forbids or all(p.effect == "forbid" for p in self.policies):
            return verdict
        if self._permits is None:
            self._permits = PolicySet([p for p in self.policies if p.effect != "forbid"])
        rest = self._permits.evaluate(facts)
        return Verdict(
            forbidden=verdict.forbidden,
            # On a denial Cedar still names the policies it could not evaluate: keep
            # the forbids among them, the permits come again from ``rest``.
            asks=tuple(hit for hit in verdict.asks if hit.policy.effect == "forbid") + rest.asks,
            permits=rest.permits,
            forbids=verdict.forbids,
        )

    def evaluate(self, facts: Facts) -> Verdict:
        relevant = [
            i
            for i, p in enumerate(self.policies)
            if facts.action in p.actions and (p.tools is None or facts.tool in p.tools)
        ]
        if not relevant:
            return NOTHING
        result = cedarpy.is_authorized(_request(facts), self._compiled, _entities(facts))
        matched = {_index(reason) for reason in result.diagnostics.reasons}
        failed = {_index(error) for error in result.diagnostics.errors}
        forbids: list[Hit] = []
        asks: list[Hit] = []
        permits: list[Hit] = []
        for i in relevant:
            policy = self.policies[i]
            if i in matched:
                hit = Hit(policy)
            elif i in failed and policy.when_missing == "match" and policy.kind != Kind.PERMIT:
                hit = Hit(policy, missing=True)
            else:
                continue
            if policy.kind == Kind.FORBID and not hit.missing:
                forbids.append(hit)
            elif policy.kind == Kind.PERMIT:
                permits.append(hit)
            else:
                # A policy asking a person, or a forbid that could not tell: a person decides.
                asks.append(hit)
        return Verdict(
            forbidden=forbids[0] if forbids else None,
            asks=tuple(asks),
            permits=tuple(permits),
            forbids=tuple(forbids),
        )


def _index(diagnostic: str) -> int:
    match = re.search(r"policy(\d+)", str(diagnostic))
    return int(match.group(1)) if match else -1


def _request(facts: Facts) -> dict[str, Any]:
    if facts.action == ACTIVATE:
        context: dict[str, Any] = {
            "first_version": facts.first_version,
            "effect_class": facts.effect_class,
            "version": facts.version,
        }
    else:
        now = facts.now
        assert now is not None
        context = {
            "arguments": arguments_record(facts.input_schema, facts.arguments),
            "effect_class": facts.effect_class,
            "principal": facts.principal,
            "run": {
                "tool_calls": facts.tool_calls,
                "spend": decimal_value(facts.spend) or decimal_value(round(facts.spend, 4)),
                "turns": facts.turns,
            },
            "time": {
                "date": now.date().isoformat(),
                "weekday": WEEKDAYS[now.weekday()],
                "hour": now.hour,
                "minute": now.minute,
                "unix": int(now.timestamp()),
            },
        }
    return {
        "principal": {"type": "Runner", "id": facts.runner},
        "action": {"type": "Action", "id": facts.action},
        "resource": {"type": "Tool", "id": facts.tool},
        "context": context,
    }


def _entities(facts: Facts) -> list[dict[str, Any]]:
    return [
        {
            "uid": {"type": "Runner", "id": facts.runner},
            "attrs": {"owner": facts.runner_owner},
            "parents": [],
        },
        {
            "uid": {"type": "Tool", "id": facts.tool},
            "attrs": {
                "name": facts.tool,
                "effect_class": facts.effect_class,
                "owner": facts.tool_owner,
            },
            "parents": [],
        },
    ]
