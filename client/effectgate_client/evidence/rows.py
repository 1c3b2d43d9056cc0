"""The rows of an evidence bundle held to its events (``checks``, step 6): every field
of the operation, its contract, attempts, approval requests and decisions, grants,
standing grants and resolutions is what an event records, and every event that implies a
row has one. Pure: no network, no clock."""

from __future__ import annotations

import json
import re
from typing import Any

from .checks_form import (
    APPROVAL,
    ATTEMPT,
    ATTEMPT_STATUS_AFTER,
    CONTRACT,
    DECISION,
    GRANT,
    OPERATION,
    REQUEST_OPENED_BY,
    REQUEST_STATUS_AFTER,
    REQUEST_STATUSES_WITHOUT_EVENT,
    RESOLUTION,
    REVIEW,
    STANDING,
    STANDING_KINDS,
    _Checker,
    _event_where,
    _str,
    intent_hash,
    same_time,
    sha256_json,
)


def _data(event: dict[str, Any]) -> dict[str, Any]:
    return _dict_of(event.get("data"))


def _dict_of(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class _Events(list[dict[str, Any]]):
    """The operation's events in seq order, found by kind and one data field through
    indexes built once: a hostile bundle's rows cannot make the checks quadratic."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__(events)
        self._positions = {id(event): position for position, event in enumerate(events)}
        self._by_kind: dict[str, list[int]] = {}
        for position, event in enumerate(events):
            self._by_kind.setdefault(event["kind"], []).append(position)
        self._by_field: dict[str, dict[tuple[str, str], list[int]]] = {}
        # For each position, the next one whose event leaves ``executing``, and whether
        # any later event leaves the status other than ``outcome_unknown``.
        self._next_from_executing: list[int | None] = [None] * (len(events) + 1)
        self._answered_after: list[bool] = [False] * (len(events) + 1)
        for position in range(len(events) - 1, -1, -1):
            event = events[position]
            self._next_from_executing[position] = (
                position
                if event["from"] == "executing"
                else self._next_from_executing[position + 1]
            )
            self._answered_after[position] = (
                event["to"] != "outcome_unknown" or self._answered_after[position + 1]
            )

    def _field(self, name: str) -> dict[tuple[str, str], list[int]]:
        index = self._by_field.get(name)
        if index is None:
            index = {}
            for position, event in enumerate(self):
                data = _data(event)
                if name in data:
                    key = (event["kind"], _key(data[name]))
                    index.setdefault(key, []).append(position)
            self._by_field[name] = index
        return index

    def of(self, *kinds: str, **match: Any) -> list[dict[str, Any]]:
        """The events of ``kinds`` (whose data holds ``match``, one field at most), in
        seq order."""
        if len(match) > 1:
            raise ValueError("one field at most")
        if match:
            ((name, value),) = match.items()
            index = self._field(name)
            positions = [p for kind in kinds for p in index.get((kind, _key(value)), [])]
        else:
            positions = [p for kind in kinds for p in self._by_kind.get(kind, [])]
        return [self[p] for p in sorted(positions)]

    def next_from_executing(self, after: dict[str, Any]) -> dict[str, Any] | None:
        """The first event after ``after`` that leaves ``executing``."""
        position = self._next_from_executing[self._position(after) + 1]
        return None if position is None else self[position]

    def answered_after(self, after: dict[str, Any]) -> bool:
        """Whether an event after ``after`` left the status other than outcome_unknown."""
        return self._answered_after[self._position(after) + 1]

    def _position(self, event: dict[str, Any]) -> int:
        return self._positions[id(event)]


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=True)


def _rows(check: _Checker, bundle: dict[str, Any]) -> None:
    """Step 6."""
    events = _Events(bundle["events"])
    unrecorded = bundle["unrecorded"]
    op = bundle["operation"]
    if not check.shape(
        op, OPERATION, "the operation", optional=("idempotency_key", "effect_class")
    ):
        return
    _operation(check, bundle, op, events, unrecorded)
    _contract(check, bundle, op)
    _attempts(check, bundle, op, events, unrecorded)
    _approvals(check, bundle, events)
    _grants(check, bundle, op, events)
    _standing_grants(check, bundle, op)
    _resolutions(check, bundle, events)
    for name in unrecorded:
        if not re.fullmatch(
            r"operation\.(idempotency_key|effect_class)|attempts\.[1-9][0-9]{0,5}\.outcome", name
        ):
            check.fail(f"unrecorded {name[:60]!r}", "no bundle leaves such a field unrecorded")


def _differs(check: _Checker, where: str, name: str, row: Any, recorded: Any, source: str) -> None:
    if row != recorded:
        check.fail(
            f"{where}, field {name!r}",
            f"it is {_short(row)}, but {source} records {_short(recorded)}",
        )


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _operation(
    check: _Checker,
    bundle: dict[str, Any],
    op: dict[str, Any],
    events: _Events,
    unrecorded: dict[str, Any],
) -> None:
    where = f"the operation {op['id']:.60}"
    first = events[0]
    if first["kind"] != "registered":
        check.fail(where, f"its first event is {first['kind']!r:.40}, not registered")
        return
    registered = _data(first)
    for name in ("tool", "tool_version", "operation_key", "call_id", "intent_hash"):
        _differs(check, where, name, op[name], registered.get(name), "its registered event")
    if "idempotency_key" in registered:
        if "idempotency_key" not in op:
            check.fail(
                where, "lacks its field 'idempotency_key', which its registered event records"
            )
        else:
            _differs(
                check,
                where,
                "idempotency_key",
                op["idempotency_key"],
                registered["idempotency_key"],
                "its registered event",
            )
        if "operation.idempotency_key" in unrecorded:
            check.fail("unrecorded 'operation.idempotency_key'", "its registered event records it")
    elif "idempotency_key" in op or "operation.idempotency_key" not in unrecorded:
        check.fail(
            where,
            "its idempotency key is not recorded by its registered event: it belongs in "
            "unrecorded, not in the row",
        )
    try:
        recomputed = intent_hash(
            tool=op["tool"], arguments=op["arguments"], principal=op["principal"]
        )
    except (ValueError, TypeError, OverflowError, RecursionError):
        recomputed = None
    if recomputed != op["intent_hash"]:
        check.fail(
            f"{where}, field 'arguments' or 'principal'",
            "the intent hash of its tool, arguments and principal is not its intent_hash: "
            "they are not what was registered",
        )
    _differs(check, where, "status", op["status"], events[-1]["to"], "its last event")
    claims = len(events.of("claimed"))
    _differs(check, where, "attempts", op["attempts"], claims, f"its {claims} claimed events")


def _contract(check: _Checker, bundle: dict[str, Any], op: dict[str, Any]) -> None:
    contract = bundle["contract"]
    where = "the contract version"
    registered = [e for e in bundle["related_events"] if e["kind"] == "contract_registered"]
    if contract is None:
        if registered:
            check.fail(where, "it is missing, but its contract_registered event is in the bundle")
        if "effect_class" in op or "operation.effect_class" not in bundle["unrecorded"]:
            check.fail(
                "the operation, field 'effect_class'",
                "no contract version in the bundle records it: it belongs in unrecorded",
            )
        return
    if "effect_class" not in op or "operation.effect_class" in bundle["unrecorded"]:
        check.fail("the operation", "lacks its field 'effect_class', which its contract records")
        return
    if not check.shape(contract, CONTRACT, where):
        return
    _differs(check, where, "tool", contract["tool"], op["tool"], "the operation")
    _differs(check, where, "version", contract["version"], op["tool_version"], "the operation")
    try:
        digest = sha256_json(contract["contract"])
    except (ValueError, TypeError, OverflowError, RecursionError):
        digest = None
    if digest != contract["contract_hash"]:
        check.fail(f"{where}, field 'contract'", "its SHA-256 is not its contract_hash")
    events = [
        e
        for e in registered
        if e["stream"] == f"tool:{contract['tool']}"
        and _data(e).get("version") == contract["version"]
    ]
    if len(events) != 1 or len(registered) != 1:
        check.fail(where, "the bundle does not hold exactly its one contract_registered event")
    else:
        _differs(
            check,
            where,
            "contract_hash",
            contract["contract_hash"],
            _data(events[0]).get("contract_hash"),
            "its contract_registered event",
        )
    effect_class = contract["contract"].get("effect_class")
    _differs(
        check, "the operation", "effect_class", op["effect_class"], effect_class, "its contract"
    )


def _attempts(
    check: _Checker,
    bundle: dict[str, Any],
    op: dict[str, Any],
    events: _Events,
    unrecorded: dict[str, Any],
) -> None:
    """Each attempt from its claimed event and the event that closed it: an outcome
    (its kind, time and the digest of the answer), a lease expiry, or, for an attempt
    overtaken by news of the effect, the event that did so."""
    rows = bundle["attempts"]
    claims = events.of("claimed")
    if len(rows) != len(claims):
        check.fail("the attempts", f"there are {len(rows)}, but {len(claims)} claimed events")
    for position, row in enumerate(rows, start=1):
        where = f"attempt {position}"
        if not check.shape(row, ATTEMPT, where, optional=("outcome",)):
            continue
        if row["number"] != position:
            check.fail(where, f"its number is {row['number']}, not {position}")
            continue
        claimed = events.of("claimed", attempt=position)
        if len(claimed) != 1:
            check.fail(where, "no claimed event (or more than one) records it")
            continue
        if not same_time(row["claimed_at"], claimed[0]["at"]):
            check.fail(
                f"{where}, field 'claimed_at'",
                f"it is {row['claimed_at']:.40}, but its claimed event is dated {claimed[0]['at']}",
            )
        _attempt_end(check, row, where, events, claimed[0], unrecorded)


def _attempt_end(
    check: _Checker,
    row: dict[str, Any],
    where: str,
    events: _Events,
    claimed: dict[str, Any],
    unrecorded: dict[str, Any],
) -> None:
    number = row["number"]
    outcome = events.of("outcome", attempt=number)
    expired = events.of("lease_expired", attempt=number)
    key = f"attempts.{number}.outcome"
    if outcome:
        event, data = outcome[0], _data(outcome[0])
        expected = ATTEMPT_STATUS_AFTER.get(str(data.get("kind")))
        _differs(check, where, "status", row["status"], expected, "its outcome event")
        if not same_time(row["closed_at"], event["at"]):
            check.fail(f"{where}, field 'closed_at'", "it is not the time of its outcome event")
        if "outcome_hash" in data:
            if key in unrecorded or "outcome" not in row:
                check.fail(where, "its outcome event records its answer, but the row lacks it")
            else:
                try:
                    digest = sha256_json(row["outcome"])
                except (ValueError, TypeError, OverflowError, RecursionError):
                    digest = None
                if digest != data["outcome_hash"]:
                    check.fail(
                        f"{where}, field 'outcome'",
                        "its digest is not the outcome_hash its outcome event records: it is "
                        "not the answer the runner posted",
                    )
        elif "outcome" in row or key not in unrecorded:
            check.fail(
                where,
                "its outcome event records no digest of the answer: it belongs in unrecorded",
            )
        return
    if ("outcome" in row and row["outcome"] is not None) or key in unrecorded:
        check.fail(f"{where}, field 'outcome'", "no outcome event of this attempt records one")
    if expired:
        _differs(check, where, "status", row["status"], "lease_expired", "its lease_expired event")
        if not same_time(row["closed_at"], expired[0]["at"]):
            check.fail(
                f"{where}, field 'closed_at'", "it is not the time of its lease_expired event"
            )
        return
    if row["status"] == "executing":
        if row["closed_at"] is not None:
            check.fail(f"{where}, field 'closed_at'", "an executing attempt has not closed")
        return
    # Overtaken: the effect was reported done (a late success of an earlier attempt, a
    # provider's event) while this one executed.
    later = events.next_from_executing(claimed)
    overtaken = later if later and later["kind"] in ("late_success", "inbound_evidence") else None
    if row["status"] != "superseded" or overtaken is None:
        check.fail(
            f"{where}, field 'status'",
            f"it is {row['status']!r:.40}, but no event ended this attempt so",
        )
    elif not same_time(row["closed_at"], overtaken["at"]):
        check.fail(
            f"{where}, field 'closed_at'", f"it is not the time of its {overtaken['kind']} event"
        )


def _approvals(check: _Checker, bundle: dict[str, Any], events: _Events) -> None:
    """Each request from the event that opened it (terms, reason), its settling event
    (status) and its decision events (who, verdict, comment, when); every request an
    event opened has its row."""
    rows = bundle["approvals"]
    seen: set[str] = set()
    for row in rows:
        if not check.shape(row, APPROVAL, "an approval request", optional=("terms", "reason")):
            continue
        where = f"approval request {row['id']:.60}"
        seen.add(row["id"])
        opening = events.of(*REQUEST_OPENED_BY, approval=row["id"])
        if not opening:
            check.fail(where, "no event of the operation opened it")
            continue
        data = _data(opening[0])
        for name in ("terms", "reason"):
            if name in data:
                if name not in row:
                    check.fail(where, f"lacks its field {name!r}, which its opening event records")
                else:
                    _differs(
                        check, where, name, row[name], data[name], f"its {opening[0]['kind']} event"
                    )
            elif name in row:
                check.fail(f"{where}, field {name!r}", "its opening event does not record it")
        settled = events.of(*REQUEST_STATUS_AFTER, approval=row["id"])
        if settled:
            expected = REQUEST_STATUS_AFTER[settled[-1]["kind"]]
            _differs(
                check,
                where,
                "status",
                row["status"],
                expected,
                f"its last {settled[-1]['kind']} event",
            )
        elif row["status"] not in REQUEST_STATUSES_WITHOUT_EVENT:
            check.fail(
                f"{where}, field 'status'", f"it is {row['status']!r:.40}, but no event settled it"
            )
        _decisions(check, row, where, events.of("decision", approval=row["id"]))
    for event in events.of(*REQUEST_OPENED_BY):
        approval = _data(event).get("approval")
        if isinstance(approval, str) and approval not in seen:
            check.fail(
                _event_where(event),
                f"it opened approval request {approval:.60}, which the bundle lacks",
            )


def _decisions(
    check: _Checker, row: dict[str, Any], where: str, recorded: list[dict[str, Any]]
) -> None:
    decisions = row["decisions"]
    if len(decisions) != len(recorded):
        check.fail(
            f"{where}, field 'decisions'",
            f"it lists {len(decisions)}, but {len(recorded)} decision events record them",
        )
    by_actor = {e["actor"]: e for e in recorded}
    for position, decision in enumerate(decisions, start=1):
        place = f"{where}, decision {position}"
        if not check.shape(decision, DECISION, place):
            continue
        event = by_actor.get(f"user:{decision['user']}")
        if event is None:
            check.fail(
                f"{place}, field 'user'", f"no decision event by user:{decision['user']:.60}"
            )
            continue
        data = _data(event)
        _differs(
            check,
            place,
            "decision",
            decision["decision"],
            data.get("decision"),
            "its decision event",
        )
        _differs(
            check, place, "comment", decision["comment"], data.get("comment"), "its decision event"
        )
        if not same_time(decision["at"], event["at"]):
            check.fail(f"{place}, field 'at'", "it is not the time of its decision event")


def _grants(check: _Checker, bundle: dict[str, Any], op: dict[str, Any], events: _Events) -> None:
    seen: set[str] = set()
    for row in bundle["grants"]:
        if not check.shape(row, GRANT, "a grant"):
            continue
        where = f"grant {row['id']:.60}"
        seen.add(row["id"])
        granted = events.of("granted", grant=row["id"])
        if len(granted) != 1:
            check.fail(where, "no granted event (or more than one) gave it")
            continue
        data = _data(granted[0])
        for name in ("approval", "intent_hash"):
            _differs(check, where, name, row[name], data.get(name), "its granted event")
        _differs(
            check,
            where,
            "standing_grant",
            row["standing_grant"],
            data.get("standing_grant"),
            "its granted event",
        )
        if not same_time(row["expires_at"], data.get("expires_at")):
            check.fail(
                f"{where}, field 'expires_at'", "it is not the expiry its granted event records"
            )
        revoked = events.of("grant_revoked", grant=row["id"])
        if revoked and not same_time(row["revoked_at"], revoked[0]["at"]):
            check.fail(
                f"{where}, field 'revoked_at'", "it is not the time of its grant_revoked event"
            )
        if not revoked and row["revoked_at"] is not None:
            check.fail(f"{where}, field 'revoked_at'", "no grant_revoked event revoked it")
    for event in events.of("granted"):
        grant = _data(event).get("grant")
        if isinstance(grant, str) and grant not in seen:
            check.fail(_event_where(event), f"it gave grant {grant:.60}, which the bundle lacks")


def _standing_grants(check: _Checker, bundle: dict[str, Any], op: dict[str, Any]) -> None:
    """Each standing grant that gave one of the operation's grants: its terms and issuer
    from its issued event, its signers from its activation, the use that approved this
    operation's intent; the bundle's other events are only of these streams and kinds."""
    related = bundle["related_events"]
    rows: dict[str, dict[str, Any]] = {}
    for row in bundle["standing_grants"]:
        if check.shape(row, STANDING, "a standing grant"):
            rows[row["id"]] = row
    used_by = {
        g["standing_grant"]: g
        for g in bundle["grants"]
        if isinstance(g, dict) and isinstance(g.get("standing_grant"), str)
    }
    for grant_id in used_by:
        if grant_id not in rows:
            check.fail(
                f"standing grant {grant_id:.60}",
                "a grant of the operation names it, but the bundle lacks it",
            )
    streams: dict[str, list[dict[str, Any]]] = {}
    for event in related:
        streams.setdefault(event["stream"], []).append(event)
    for event in related:
        if event["kind"] == "contract_registered" and event["stream"].startswith("tool:"):
            continue
        stream_of = event["stream"].removeprefix("sgr:")
        if (
            event["kind"] not in STANDING_KINDS
            or stream_of not in rows
            or not event["stream"].startswith("sgr:")
        ):
            check.fail(_event_where(event), "no row of the bundle rests on it")
    for grant_id, row in rows.items():
        where = f"standing grant {grant_id:.60}"
        stream = streams.get(f"sgr:{grant_id}", [])
        issued = [e for e in stream if e["kind"] == "standing_grant_issued"]
        activated = [e for e in stream if e["kind"] == "standing_grant_activated"]
        if len(issued) != 1 or len(activated) != 1:
            check.fail(where, "the bundle lacks its issued or its activated event")
            continue
        _differs(
            check, where, "terms", row["terms"], _data(issued[0]).get("terms"), "its issued event"
        )
        _differs(
            check,
            where,
            "issued_by",
            f"user:{row['issued_by']}",
            issued[0]["actor"],
            "its issued event",
        )
        _differs(
            check,
            where,
            "signed_by",
            row["signed_by"],
            _data(activated[0]).get("signed_by"),
            "its activated event",
        )
        grant = used_by.get(grant_id)
        if grant is None:
            check.fail(where, "no grant of the operation was given by it")
            continue
        used = [
            e
            for e in stream
            if e["kind"] == "standing_grant_used" and _data(e).get("grant") == grant["id"]
        ]
        if len(used) != 1:
            check.fail(where, f"the bundle lacks the use that gave grant {grant['id']:.60}")
            continue
        data = _data(used[0])
        _differs(
            check,
            f"{where}, its use",
            "operation",
            op["id"],
            data.get("operation"),
            "its standing_grant_used event",
        )
        _differs(
            check,
            f"{where}, its use",
            "intent_hash",
            op["intent_hash"],
            data.get("intent_hash"),
            "its standing_grant_used event",
        )


def _resolutions(check: _Checker, bundle: dict[str, Any], events: _Events) -> None:
    seen: set[str] = set()
    for row in bundle["resolutions"]:
        if not check.shape(row, RESOLUTION, "a resolution"):
            continue
        where = f"resolution {row['id']:.60}"
        seen.add(row["id"])
        proposed = events.of("resolution_proposed", resolution=row["id"])
        if len(proposed) != 1:
            check.fail(where, "no resolution_proposed event (or more than one) records it")
            continue
        event = proposed[0]
        _differs(
            check,
            where,
            "declared_by",
            f"user:{row['declared_by']}",
            event["actor"],
            "its resolution_proposed event",
        )
        _differs(
            check,
            where,
            "note",
            row["note"],
            _data(event).get("note"),
            "its resolution_proposed event",
        )
        if not same_time(row["created_at"], event["at"]):
            check.fail(
                f"{where}, field 'created_at'",
                "it is not the time of its resolution_proposed event",
            )
        _review(check, row, where, events, event)
    for event in events.of("resolution_proposed"):
        resolution = _data(event).get("resolution")
        if isinstance(resolution, str) and resolution not in seen:
            check.fail(
                _event_where(event),
                f"it proposed resolution {resolution:.60}, which the bundle lacks",
            )


def _review(
    check: _Checker,
    row: dict[str, Any],
    where: str,
    events: _Events,
    proposed: dict[str, Any],
) -> None:
    review = row["review"]
    confirmed = events.of("reconciled", resolution=row["id"])
    disputed = events.of("resolution_disputed", resolution=row["id"])
    if review is None:
        if confirmed or disputed:
            check.fail(
                f"{where}, field 'review'", "it is empty, but an event answered the resolution"
            )
        return
    place = f"{where}, its review"
    if review.get("decision") == "withdrawn":
        check.shape(review, {"decision": _str}, place)
        if not events.answered_after(proposed) or confirmed or disputed:
            check.fail(
                place,
                "it is withdrawn, but the events do not show the operation answered otherwise",
            )
        return
    if not check.shape(review, REVIEW, place):
        return
    answers = {"confirmed": confirmed, "disputed": disputed}.get(review["decision"])
    if answers is None or len(answers) != 1:
        check.fail(f"{place}, field 'decision'", f"no event records it {review['decision']!r:.40}")
        return
    event = answers[0]
    _differs(
        check, place, "user", f"user:{review['user']}", event["actor"], f"its {event['kind']} event"
    )
    note = (
        _dict_of(_data(event).get("evidence")).get("confirmation")
        if event["kind"] == "reconciled"
        else _data(event).get("note")
    )
    _differs(check, place, "note", review["note"], note, f"its {event['kind']} event")
    if not same_time(review["at"], event["at"]):
        check.fail(f"{place}, field 'at'", f"it is not the time of its {event['kind']} event")
