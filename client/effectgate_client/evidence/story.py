"""What a verified bundle proves, in plain words, from its events (``checks`` has held
every row to them): who asked for what, who approved which exact arguments and when,
what was attempted with which idempotency key, what the runner said the provider
answered, and who reconciled it on what evidence.

Text that people, runners or models wrote (comments, notes, arguments) is printed with
control, invisible and bidirectional characters shown as ``[U+XXXX]``, so that a
terminal shows what the bundle holds and nothing else.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from .checks import Report, intent_hash

# Line and paragraph separators, controls and format characters (the bidirectional
# overrides, zero-width joiners...).
_HIDDEN = {"Cc", "Cf", "Zl", "Zp", "Co", "Cn", "Cs"}


def shown(text: Any, *, limit: int = 400) -> str:
    value = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, sort_keys=True)
    out = []
    for char in value:
        if unicodedata.category(char) in _HIDDEN or (char.isspace() and char != " "):
            out.append(f"[U+{ord(char):04X}]")
        else:
            out.append(char)
    joined = "".join(out)
    return joined if len(joined) <= limit else joined[: limit - 3] + "..."


def _data(event: dict[str, Any]) -> dict[str, Any]:
    data = event.get("data")
    return data if isinstance(data, dict) else {}


def _quoted(text: Any) -> str:
    return f'"{shown(text)}"' if text else "no comment"


def _evidence(evidence: Any) -> str:
    if not isinstance(evidence, dict) or not evidence:
        return "no evidence recorded"
    parts = []
    for name, value in sorted(evidence.items()):
        parts.append(f"{shown(name, limit=60)} {_quoted(value)}")
    return "evidence: " + "; ".join(parts)


def _answer(row: dict[str, Any] | None) -> str:
    if not isinstance(row, dict) or not isinstance(row.get("outcome"), dict):
        return ""
    outcome = row["outcome"]
    parts = []
    if outcome.get("downstream_id"):
        parts.append(f"downstream reference {shown(outcome['downstream_id'], limit=120)}")
    if outcome.get("detail"):
        parts.append(f"detail {_quoted(outcome['detail'])}")
    if "result" in outcome:
        parts.append(f"result {shown(outcome['result'], limit=200)}")
    if "cost" in outcome:
        parts.append(f"cost {shown(outcome['cost'], limit=40)}")
    return ("; " + ", ".join(parts)) if parts else ""


def _narrate(event: dict[str, Any], bundle: dict[str, Any]) -> str | None:
    """One event in words, or None for those the story leaves out (heartbeats)."""
    data = _data(event)
    kind, actor, at = event["kind"], shown(event["actor"], limit=120), event["at"]
    moved = f" -> {event['to']}" if event["to"] != event["from"] else ""

    def get(name: str, limit: int = 120) -> str:
        return shown(data.get(name), limit=limit)

    said = _narrate_approval(kind, data, get, actor, bundle)
    if said is None:
        said = _narrate_attempt(kind, data, get, actor, bundle)
    if said is None:
        said = _narrate_reconciliation(kind, data, get, actor)
    if said is None:
        if kind == "heartbeat":
            return None
        said = f"{kind} by {actor}" + (f": {shown(data, limit=200)}" if data else "")
    return f"{shown(at, limit=40)}  {said}{moved}"


Get = Any


def _narrate_approval(
    kind: str, data: dict[str, Any], get: Get, actor: str, bundle: dict[str, Any]
) -> str | None:
    if kind == "approval_requested":
        terms = data["terms"] if isinstance(data.get("terms"), dict) else {}
        need = terms.get("approvals_required", 1)
        return (
            f"{actor} asked for approval {get('approval')} ({shown(need)} approval"
            f"{'' if need == 1 else 's'} needed, until {shown(terms.get('expires_at', '?'))}), "
            f"because: {_quoted(data.get('reason'))}"
        )
    if kind == "decision":
        verb = "APPROVED" if data.get("decision") == "approve" else "REJECTED"
        return (
            f"{actor} {verb} {get('approval')} (approval {get('approvals')} of "
            f"{get('approvals_required')}), saying {_quoted(data.get('comment'))}"
        )
    if kind == "granted":
        via = (
            f"by standing grant {get('standing_grant')}"
            if data.get("standing_grant")
            else f"on the approving decisions of user ids {get('deciders')}"
        )
        ours = data.get("intent_hash") == bundle["operation"].get("intent_hash")
        whose = "this operation's intent" if ours else "ANOTHER intent than this operation's"
        return (
            f"grant {get('grant')} given {via}, bound to {whose} {get('intent_hash')}, "
            f"usable until {get('expires_at')}"
        )
    if kind == "rejected":
        return f"{actor} rejected it: {_quoted(data.get('reason') or data.get('comment'))}"
    if kind == "grant_revoked":
        return f"{actor} revoked grant {get('grant')}: {_quoted(data.get('reason'))}"
    if kind == "grant_invalid":
        return f"the grant could not be used ({get('problem', 400)}); {get('approval')} opened"
    return None


def _narrate_attempt(
    kind: str, data: dict[str, Any], get: Get, actor: str, bundle: dict[str, Any]
) -> str | None:
    attempts = {a.get("number"): a for a in bundle["attempts"] if isinstance(a, dict)}
    if kind == "claimed":
        key = bundle["operation"].get("idempotency_key")
        key = key or bundle["unrecorded"].get("operation.idempotency_key", "?")
        return (
            f"{actor} claimed attempt {get('attempt')}, to call the provider with "
            f"idempotency key {shown(key, limit=120)} (lease until {get('lease_until')})"
        )
    if kind == "outcome":
        code = f", code {get('code', 80)}" if data.get("code") else ""
        answer = _answer(attempts.get(data.get("attempt")))
        return f"{actor} reported attempt {get('attempt')}: {get('kind')}{code}{answer}"
    if kind == "lease_expired":
        return f"attempt {get('attempt')}'s lease expired with no outcome: the effect may exist"
    if kind == "late_outcome":
        return f"{actor} reported attempt {get('attempt')} late: {get('outcome', 400)}"
    return None


def _narrate_reconciliation(kind: str, data: dict[str, Any], get: Get, actor: str) -> str | None:
    if kind in ("probe", "reconciled"):
        by = "a lookup" if data.get("source") == "probe" else actor
        ref = f", downstream reference {get('downstream_id')}" if data.get("downstream_id") else ""
        extra = ""
        if data.get("declared_by"):
            extra = f" ({get('declared_by')} declared it, {get('confirmed_by')} confirmed)"
        return f"{by} answered: {get('result')}{ref}{extra}; {_evidence(data.get('evidence'))}"
    if kind == "late_success":
        return (
            f"{actor}: attempt {get('attempt')} succeeded after all (downstream reference "
            f"{get('downstream_id')})"
        )
    if kind == "resolution_proposed":
        return (
            f"{actor} declared it did not happen (resolution {get('resolution')}): "
            f"{_quoted(data.get('note'))}; a second person must confirm"
        )
    if kind == "resolution_disputed":
        return f"{actor} disputed resolution {get('resolution')}: {_quoted(data.get('note'))}"
    if kind == "snoozed":
        return (
            f"{actor} answered still unknown, to look again at {get('snoozed_until')}; "
            f"{_evidence(data.get('evidence'))}"
        )
    if kind == "note":
        return f"{actor} noted: {_quoted(data.get('note'))}"
    return None


SECTIONS = (
    ("Who approved", {"approval_requested", "decision", "granted", "rejected", "approval_expired",
                      "approval_escalated", "grant_revoked", "grant_invalid", "superseded"}),
    ("What was attempted, and what the provider answered",
     {"claimed", "outcome", "lease_expired", "late_outcome", "outcome_conflict", "budget_exhausted",
      "cancelled", "compensation"}),
    ("How it was reconciled", {"probe", "reconciled", "resolution_proposed",
                               "resolution_disputed", "snoozed", "note", "late_success",
                               "reopened", "inbound_evidence"}),
)  # fmt: skip


def story(report: Report) -> str:
    """The plain words of a bundle that verified."""
    bundle = report.bundle
    op = bundle["operation"]
    events = bundle["events"]
    checkpoint = report.checkpoint
    lines: list[str] = []
    first, last = events[0], events[-1]
    leaves = sorted(e["leaf_index"] for e in events)
    if checkpoint is not None:
        lines.append(
            f"Verified: the {len(events)} events of operation {op['id']} are leaves "
            f"{leaves[0]}..{leaves[-1]} of the log {shown(checkpoint.origin)}, whose "
            f"checkpoint of {checkpoint.size} entries "
            f"(signed {checkpoint.time.isoformat() if checkpoint.time else '?'}, key id "
            f"{checkpoint.key_id.hex()}) the given key signed; every hash, link and proof "
            "holds, and every row agrees with the events."
        )
    for witnessed in report.witnessed:
        lines.append(
            f"The witness's checkpoint of {witnessed.size} entries is a prefix of it: the "
            "history the witness saw is unchanged."
        )
    lines += ["", "What was asked"]
    registered = _data(first)
    contract = bundle.get("contract")
    what = ""
    if isinstance(contract, dict):
        body = contract["contract"]
        approval = body.get("approval", {}) if isinstance(body.get("approval"), dict) else {}
        what = (
            f" (contract version {contract['version']}: {shown(body.get('effect_class'))}, "
            f"approval {shown(approval.get('mode', '?'))})"
        )
    lines.append(
        f"{first['at']}  {shown(first['actor'], limit=120)} registered {op['id']}: tool "
        f"{shown(op['tool'])}{what}, on behalf of {shown(op['principal'])}, operation key "
        f"{shown(registered.get('operation_key'))}."
    )
    recomputed = intent_hash(tool=op["tool"], arguments=op["arguments"], principal=op["principal"])
    lines.append(
        f"  The exact arguments, whose intent hash {recomputed} every approval below is "
        "bound to (recomputed here from the tool, the arguments and the principal):"
    )
    lines.append(
        "    " + shown(json.dumps(op["arguments"], ensure_ascii=False, sort_keys=True), limit=4000)
    )
    key = op.get("idempotency_key")
    if key:
        lines.append(f"  Idempotency key, the same on every attempt: {shown(key, limit=120)}.")
    for title, kinds in SECTIONS:
        said = [
            line for line in (_narrate(e, bundle) for e in events if e["kind"] in kinds) if line
        ]
        if said:
            lines += ["", title, *said]
    standing = _standing(bundle)
    if standing:
        lines += ["", "Standing grants that approved it", *standing]
    others = [e for e in events[1:] if not any(e["kind"] in kinds for _, kinds in SECTIONS)]
    other = [line for line in (_narrate(e, bundle) for e in others) if line]
    if other:
        lines += ["", "Other events", *other]
    lines += ["", f"Where it stands: {last['to']} (since {last['at']}, event seq {last['seq']})."]
    unrecorded = bundle["unrecorded"]
    if unrecorded:
        lines += ["", "Not proven (recorded by no event; the server's word only):"]
        lines += [f"  {name}: {shown(value)}" for name, value in sorted(unrecorded.items())]
    return "\n".join(lines) + "\n"


def _standing(bundle: dict[str, Any]) -> list[str]:
    lines = []
    for event in bundle["related_events"]:
        data = _data(event)
        at, actor = event["at"], shown(event["actor"], limit=120)
        grant = event["stream"].removeprefix("sgr:")
        if event["kind"] == "standing_grant_issued":
            lines.append(f"{at}  {actor} issued standing grant {grant}: {shown(data.get('terms'))}")
        elif event["kind"] == "standing_grant_signed":
            lines.append(f"{at}  {actor} signed standing grant {grant}")
        elif event["kind"] == "standing_grant_activated":
            lines.append(
                f"{at}  standing grant {grant} in force, signed by people {data.get('signed_by')}"
            )
        elif event["kind"] == "standing_grant_used":
            lines.append(
                f"{at}  use {data.get('uses')} of standing grant {grant} approved intent "
                f"{data.get('intent_hash')} (grant {data.get('grant')})"
            )
    return lines
