"""Why a person is asked, in words a reviewer reads ("Amount over €500.00"), from what
the approval request recorded when it opened (its ``context``: the matched contract
rules, the policy mode, the policies that asked, the runner's reason).

Pure: the contract and the request's context in, sentences out. The stored ``reason``
(JSON pointers and operators: "Rule matched: /amount_cents gt 50000.") stays the
record; this is how the console shows it. Values are formatted as the contract's
display says (``display.field_for``), so a limit in cents reads in the currency.
"""

from typing import Any

from approvals.policy import is_missing, resolve_pointer

from .display import describe, field_for

# How each rule operator reads after the argument's label.
OPERATOR_WORDS = {
    "gt": "over",
    "gte": "at least",
    "lt": "under",
    "lte": "at most",
    "eq": "is",
    "ne": "is not",
    "in": "is one of",
}
# At most this many values of an "in" rule are spelled out.
MAX_LISTED = 5


def rule_in_words(contract: dict[str, Any], rule: dict[str, Any], *, absent: bool = False) -> str:
    """One matched contract rule: "Amount over €500.00", "Country is one of DE, FR"."""
    pointer = str(rule.get("path", ""))
    label = field_for(contract, pointer)["label"]
    if absent:
        return f"{label} is not given, so a person decides"
    op = str(rule.get("op", ""))
    value = rule.get("value")
    if op == "in" and isinstance(value, list):
        shown = ", ".join(describe(contract, pointer, item) for item in value[:MAX_LISTED])
        if len(value) > MAX_LISTED:
            shown += f" or {len(value) - MAX_LISTED} more"
    else:
        shown = describe(contract, pointer, value)
    return f"{label} {OPERATOR_WORDS.get(op, op)} {shown}"


def reasons_in_words(
    contract: dict[str, Any], context: dict[str, Any], *, arguments: Any, tool: str
) -> list[str]:
    """Every reason the request recorded, one sentence each, contract first. Empty when
    the context names none (an older or a system-opened request: show its ``reason``)."""
    reasons = []
    if context.get("policy_mode") == "always":
        reasons.append(f"Every {tool} operation needs a person (the tool's contract)")
    for rule in context.get("matched_rules") or []:
        if not isinstance(rule, dict):
            continue
        absent = is_missing(resolve_pointer(arguments, str(rule.get("path", ""))))
        reasons.append(rule_in_words(contract, rule, absent=absent))
    for hit in context.get("policies") or []:
        if not isinstance(hit, dict):
            continue
        said = hit.get("message") or "a person must approve"
        if hit.get("missing"):
            said += " (an argument it reads is not given, so a person decides)"
        if hit.get("figure"):
            said += f" ({hit['figure']})"
        reasons.append(f"Policy {hit.get('policy')}: {said}")
    if context.get("edits"):
        reasons.append("A person changed the arguments when approving the original")
    return reasons


# Top-level arguments that, by their name, carry the agent's own account of why.
REASON_ARGUMENTS = ("reason", "justification", "rationale")


def runner_reason(context: dict[str, Any], contract: dict[str, Any], arguments: Any) -> str:
    """Why the agent wants this: the reason it gave when asking for approval, else an
    argument named for it ("reason": "order never arrived")."""
    asked = context.get("runner_reason")
    if isinstance(asked, str) and asked:
        return asked
    if isinstance(arguments, dict):
        for name in REASON_ARGUMENTS:
            value = arguments.get(name)
            if isinstance(value, str) and value:
                # A sensitive value reads "(sensitive)": it is no reason to show.
                shown = describe(contract, f"/{name}", value)
                return "" if shown == "(sensitive)" else shown
    return ""
