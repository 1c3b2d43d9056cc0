"""Provable strength: whether a new contract version protects at least as much as the
active one (docs/api.md, Versions and activation).

``weakenings`` lists what keeps a new version from being proven at least as strong; an
empty list lets it activate by itself. The proof covers the contract's settings and
every place in the arguments the active version protects (``subsumption`` compares the
values admitted there). Pure functions over normalized contracts.
"""

import json
from typing import Any

from approvals.policy import json_equal, parse_pointer, skips_when_missing

from ..machine import EFFECT_CLASS_RANK, EffectClass
from .display import humanize, summary_labels
from .paths import Unproven, format_pointer, format_types, locate
from .subsumption import widenings
from .validation import APPROVAL_MODE_RANK, sensitive_paths


def _titled(labels: dict[str, str] | None) -> dict[str, str] | None:
    """The labels that are not the argument's own name in words (an untitled argument
    reads the same whether the schema declares it or not)."""
    if labels is None:
        return None
    return {n: label for n, label in labels.items() if label != humanize(n)}


def weakenings(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Reasons why ``new`` is not proven to protect at least as much as ``old``.

    Empty means proven: the new version may activate by itself. Anything else stays
    inactive until a person allowed to activate tools activates it, so that a leaked
    runner token cannot switch protections off. The proof covers the contract's settings
    (``_setting_weakenings``) and every place in the arguments that the active version
    protects (``_place_weakenings``).
    """
    return _setting_weakenings(old, new) + _place_weakenings(old, new)


def _setting_weakenings(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    reasons = []
    if old.get("display") != new.get("display"):
        # What approvers read: a summary can mislead as well as a weaker rule.
        reasons.append("the display (the summary approvers read) changed")
    elif _titled(summary_labels(old)) != _titled(summary_labels(new)):
        # Without a template the summary names arguments by their schema titles
        # ("Sandbox test, no money moves: 75000" reads as harmless).
        reasons.append("the display (the summary approvers read) changed: an argument's title")
    if (
        EFFECT_CLASS_RANK[EffectClass(new["effect_class"])]
        < EFFECT_CLASS_RANK[EffectClass(old["effect_class"])]
    ):
        reasons.append(f"effect class lowered from {old['effect_class']} to {new['effect_class']}")
    old_a, new_a = old["approval"], new["approval"]
    if APPROVAL_MODE_RANK[new_a["mode"]] < APPROVAL_MODE_RANK[old_a["mode"]]:
        reasons.append(f"approval mode weakened from {old_a['mode']} to {new_a['mode']}")
    elif new_a["mode"] == old_a["mode"] == "rules":
        reasons.extend(_rule_weakenings(old_a["rules"], new_a["rules"]))
    if set(new_a.get("editable", [])) - set(old_a.get("editable", [])):
        reasons.append("more fields a person may edit when approving")
    if new_a.get("escalate_to") and (
        new_a.get("escalate_to") != old_a.get("escalate_to")
        or new_a["escalate_after_s"] < old_a["escalate_after_s"]
    ):
        reasons.append("approval requests are offered to another group, or sooner")
    if new_a["approvals_required"] < old_a["approvals_required"]:
        reasons.append("fewer approvals required")
    for ttl in ("request_ttl_s", "grant_ttl_s"):
        if new_a[ttl] > old_a[ttl]:
            reasons.append(f"longer {ttl}")
    if new["reconcile"]["url"] != old["reconcile"]["url"] and new["reconcile"]["url"]:
        reasons.append("another reconciliation lookup URL")
    console_url = new["reconcile"].get("console_url")
    if console_url and console_url != old["reconcile"].get("console_url"):
        # Support opens this link to find the evidence that settles an unknown outcome,
        # and a "did not happen" lets an irreversible effect run again: a look-alike
        # page misleads a person as a lookup URL misleads the probes. Dropping it hides
        # nothing (support looks the key up by hand, as without one).
        reasons.append("another provider console link (reconcile.console_url)")
    if set(new["retry"]["retryable_codes"]) - set(old["retry"]["retryable_codes"]):
        reasons.append("more retryable codes (automatic retries of possibly processed calls)")
    if old["concurrency_key"] and new["concurrency_key"] != old["concurrency_key"]:
        reasons.append("concurrency key removed or changed")
    if set(sensitive_paths(old["input_schema"])) - set(sensitive_paths(new["input_schema"])):
        reasons.append("a sensitive field is no longer marked x-sensitive")
    old_inbound, new_inbound = old.get("inbound"), new.get("inbound")
    if new_inbound is not None and new_inbound != old_inbound:
        # Inbound events can close unknown operations as succeeded: a new mapping is
        # as sensitive as a new lookup URL.
        reasons.append("another inbound event mapping")
    old_breaker, new_breaker = old.get("breaker"), new.get("breaker")
    if old_breaker is not None and (
        new_breaker is None
        or new_breaker["threshold"] > old_breaker["threshold"]
        or new_breaker["cooldown_s"] < old_breaker["cooldown_s"]
        or set(old_breaker["failure_codes"]) - set(new_breaker["failure_codes"])
    ):
        reasons.append("a weaker circuit breaker")
    return reasons


def _condition(rule: dict[str, Any]) -> dict[str, Any]:
    return {key: rule[key] for key in ("path", "op", "value")}


def _rule_weakenings(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    """Every active rule must be kept, and one that asks a person when its argument is
    absent must still: ``when_missing`` from ``match`` to ``skip`` (a rule without the
    key is ``match``) is a weakening, from ``skip`` to ``match`` a strengthening.

    The conditions are compared as JSON: a rule "eq true" is not the rule "eq 1", which
    never matches a boolean, although Python calls the two dicts equal.
    """
    reasons = []
    for rule in old:
        kept = [other for other in new if json_equal(_condition(rule), _condition(other))]
        shown = f"{rule['path']} {rule['op']} {json.dumps(rule['value'], ensure_ascii=False)}"
        if not kept:
            reasons.append(f"approval rule removed or changed: {shown}")
        elif not skips_when_missing(rule) and all(skips_when_missing(other) for other in kept):
            reasons.append(
                f"approval rule {shown} no longer asks a person when {rule['path']} is "
                'absent (when_missing changed from "match" to "skip")'
            )
    return reasons


def _protected_places(contract: dict[str, Any], *, rules: bool) -> dict[tuple[str, ...], list[str]]:
    """Every place the contract protects, with what protects it, in contract order."""
    places: dict[tuple[str, ...], list[str]] = {}
    if rules and contract["approval"]["mode"] == "rules":
        for rule in contract["approval"]["rules"]:
            places.setdefault(parse_pointer(rule["path"]), []).append("approval rule")
    if contract["concurrency_key"]:
        places.setdefault(parse_pointer(contract["concurrency_key"]), []).append("concurrency key")
    for path in sensitive_paths(contract["input_schema"]):
        places.setdefault(path, []).append("sensitive field")
    return places


def _place_weakenings(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Each place the active version protects must still be there in the new schema,
    with no JSON type the active schema did not admit, and required where it was.

    Rule places need no proof when the new version asks a person for every operation.
    A type may narrow (``number`` to ``integer``): a rule sees only values it saw before.
    """
    reasons = []
    places = _protected_places(old, rules=new["approval"]["mode"] != "always")
    for tokens, roles in places.items():
        pointer = f"{format_pointer(tokens)} ({', '.join(dict.fromkeys(roles))})"
        wildcard = "sensitive field" in roles
        try:
            before = locate(old["input_schema"], tokens, wildcard=wildcard)
        except Unproven as exc:
            reasons.append(
                f"{pointer} cannot be compared: the active version's input_schema does not "
                f"prove it ({exc})"
            )
            continue
        try:
            after = locate(new["input_schema"], tokens, wildcard=wildcard)
        except Unproven as exc:
            reasons.append(f"{pointer} is not in the new input_schema: {exc}")
            continue
        if not after.types <= before.types:
            reasons.append(
                f"{pointer} changes type from {format_types(before.types)} to "
                f"{format_types(after.types)}"
            )
        if before.required and not after.required:
            reasons.append(f"{pointer} is no longer required")
        reasons.extend(
            f"{pointer} admits values the active version refused: {why}"
            for why in widenings(old["input_schema"], new["input_schema"], tokens)
        )
    return reasons
