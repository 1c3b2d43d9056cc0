"""An operation's evidence bundle (docs/security.md, Evidence bundles): one JSON document
that anyone holding the log's public key can verify offline, with ``effectgate-verify``
(the client distribution), without this server or its database.

The bundle (format ``effectgate-evidence/1``) holds:

- the operation's rows as the ledger holds them (the operation, its contract version,
  attempts, approval requests with their decisions, grants, the standing grants that
  gave any of them, "did not happen" resolutions and their reviews), each limited to
  the fields its events record, so that the verifier can hold every field to an event;
- every event of the operation's stream, and the few events of other streams that the
  rows rest on (the contract version's ``contract_registered``; a standing grant's
  issue, signatures, activation and the use that approved this operation), each with
  its leaf index and inclusion proof (RFC 9162) in the tree of the checkpoint below;
- the latest signed checkpoint (a C2SP signed note), which covers every one of those
  events;
- on request, consistency proofs from smaller tree sizes (a checkpoint a witness kept)
  to the checkpoint's, so that a witness's own checkpoint holds the bundle too;
- ``unrecorded``: what the rows say that no event of theirs records (an idempotency key
  or an outcome from before the events recorded them); the verifier prints it as the
  server's word, never as proven.

Reads only, in one snapshot (REPEATABLE READ on PostgreSQL when called outside a
transaction), so that the rows and the events are of one moment. Refuses
(``NotSealed``) while any of the events is not in the latest checkpoint's tree.
"""

import json
from collections.abc import Iterable
from typing import Any

from django.db import connection, transaction
from django.db.models import Q

from approvals.models import ApprovalRequest, Decision, Grant, StandingGrant

from ..errors import InvalidQuery, NotSealed
from ..machine import EventKind
from ..models import (
    Attempt,
    Checkpoint,
    Event,
    LogLeaf,
    Operation,
    Resolution,
    ResolutionReview,
)
from ..payloads import b64, iso
from ..payloads import checkpoint as checkpoint_body
from ..selectors import checkpoint_latest, consistency_proof, log_range_hashes
from ..services.core import event_hashed
from ..services.terms import approval_terms, standing_grant_terms
from ..tlog import merkle

FORMAT = "effectgate-evidence/1"
# The kinds of a standing grant's stream that the bundle carries: how it came to be in
# force; its uses other than this operation's are left out.
STANDING_OPENING = (
    EventKind.STANDING_GRANT_ISSUED,
    EventKind.STANDING_GRANT_SIGNED,
    EventKind.STANDING_GRANT_ACTIVATED,
)
# Opening events of an approval request (audit.state.REQUEST_OPENED_BY).
REQUEST_OPENED_BY = (EventKind.APPROVAL_REQUESTED, EventKind.GRANT_INVALID, EventKind.RECONCILED)
# At most this many witness sizes are proved to in one bundle.
MAX_WITNESS_SIZES = 16


def evidence_bundle(*, operation: Operation, witness_sizes: Iterable[int] = ()) -> dict[str, Any]:
    """The evidence bundle of ``operation`` (see the module's docstring), with a
    consistency proof from each of ``witness_sizes`` to its checkpoint's size.

    The caller has already decided that whoever asked may see the operation (the
    console through ``selectors.operation_get_for_user``; ``audit export`` is run by an
    operator). Raises ``NotSealed`` while the log does not cover every event yet, and
    ``InvalidQuery`` for a witness size the checkpoint cannot extend.
    """
    sizes = sorted(set(witness_sizes))
    if len(sizes) > MAX_WITNESS_SIZES:
        raise InvalidQuery(f"At most {MAX_WITNESS_SIZES} witness sizes in one bundle.")
    if connection.vendor == "postgresql" and not connection.in_atomic_block:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            return _bundle(operation.pk, sizes)
    with transaction.atomic():
        return _bundle(operation.pk, sizes)


def _bundle(operation_id: str, witness_sizes: list[int]) -> dict[str, Any]:
    op = Operation.objects.select_related("tool_version").get(pk=operation_id)
    events = list(Event.objects.filter(stream=op.pk).order_by("seq"))
    requests = list(
        ApprovalRequest.objects.filter(operation=op)
        .prefetch_related("decisions__user")
        .order_by("created_at", "id")
    )
    grants = list(
        Grant.objects.filter(request__operation=op)
        .select_related("request")
        .order_by("created_at", "id")
    )
    standing = list(
        StandingGrant.objects.filter(pk__in={g.standing_grant_id for g in grants} - {None})
        .select_related("created_by")
        .order_by("pk")
    )
    contract_event = (
        Event.objects.filter(
            stream=f"tool:{op.tool_id}",
            kind=EventKind.CONTRACT_REGISTERED,
            data__version=op.tool_version.number,
        )
        .order_by("seq")
        .first()
    )
    related = [contract_event] if contract_event is not None else []
    related += _standing_events(standing, grants)
    unrecorded: dict[str, Any] = {}
    operation = _operation(op, events, unrecorded)
    if contract_event is None:
        # A contract version registered before its event recorded it: the effect class is
        # the server's word only.
        unrecorded["operation.effect_class"] = operation.pop("effect_class")
    bundle: dict[str, Any] = {
        "format": FORMAT,
        "origin": "",
        "operation": operation,
        "contract": _contract(op) if contract_event is not None else None,
        "attempts": _attempts(op, events, unrecorded),
        "approvals": [_approval(request, op, events) for request in requests],
        "grants": [_grant(grant) for grant in grants],
        "standing_grants": [_standing_grant(grant) for grant in standing],
        "resolutions": _resolutions(op),
        "events": [],
        "related_events": [],
        "checkpoint": None,
        "consistency": [],
        "unrecorded": unrecorded,
    }
    checkpoint, proved = _proved(op, [*events, *related])
    bundle["origin"] = checkpoint.origin
    bundle["events"] = proved[: len(events)]
    bundle["related_events"] = proved[len(events) :]
    bundle["checkpoint"] = checkpoint_body(checkpoint)
    for size in witness_sizes:
        if not 1 <= size <= checkpoint.size:
            raise InvalidQuery(
                f"A witness's checkpoint of size {size} cannot be proved against the latest "
                f"checkpoint, of size {checkpoint.size}: it must be from 1 to {checkpoint.size}."
                + (
                    " A log smaller than a checkpoint it signed lost leaves: run 'audit "
                    "verify --checkpoint' with the witness's note."
                    if size > checkpoint.size
                    else ""
                )
            )
        hashes = consistency_proof(first=size, second=checkpoint.size)
        # The log's own checkpoint of that size, when it signed one: with it the proof is
        # checked even without the witness's copy (which must then have the same root).
        first = Checkpoint.objects.filter(size=size).first()
        bundle["consistency"].append(
            {
                "first": size,
                "second": checkpoint.size,
                "hashes": [b64(h) for h in hashes],
                "first_checkpoint": checkpoint_body(first) if first is not None else None,
            }
        )
    return bundle


def _event(event: Event) -> dict[str, Any]:
    """An event as its hash covers it, with its id and hash."""
    return {"id": event.pk, **event_hashed(event), "hash": event.hash}


def _proved(op: Operation, events: list[Event]) -> tuple[Any, list[dict[str, Any]]]:
    """The latest checkpoint and each event with its leaf index and inclusion proof in
    its tree, every proof from one read of the stored subtree hashes."""
    checkpoint = checkpoint_latest()
    leaves = dict(
        LogLeaf.objects.filter(event_id__in=[e.pk for e in events]).values_list("event_id", "index")
    )
    size = checkpoint.size if checkpoint is not None else 0
    missing = [e for e in events if leaves.get(e.pk, size) >= size]
    if checkpoint is None or missing:
        first = missing[0] if missing else events[0]
        raise NotSealed(
            f"{len(missing) or len(events)} events of {op.pk} are not in a signed checkpoint "
            f"yet (the first: {first.stream} seq {first.seq}). The sealer appends committed "
            "events every AUDIT_SEAL_EVERY_S seconds and signs a checkpoint when a signing "
            "key is set: wait for it, or run 'effectgate audit seal', then export again."
        )
    ranges = [merkle.inclusion_ranges(leaves[e.pk], size) for e in events]
    hashes = iter(log_range_hashes([r for path in ranges for r in path]))
    proved = []
    for event, path in zip(events, ranges, strict=True):
        proved.append(
            {
                **_event(event),
                "leaf_index": leaves[event.pk],
                "inclusion": [b64(next(hashes)) for _ in path],
            }
        )
    return checkpoint, proved


def _registered(events: list[Event]) -> dict[str, Any]:
    first = events[0] if events else None
    if first is None or first.kind != EventKind.REGISTERED or not isinstance(first.data, dict):
        return {}
    return first.data


def _operation(op: Operation, events: list[Event], unrecorded: dict[str, Any]) -> dict[str, Any]:
    """The operation's fields that its events record: its identity and intent (the
    ``registered`` event; the arguments and principal through the intent hash), its
    effect class (its contract version), its status (the last event) and its number of
    attempts (its ``claimed`` events)."""
    row = {
        "id": op.pk,
        "tool": op.tool_id,
        "tool_version": op.tool_version.number,
        "effect_class": op.effect_class,
        "operation_key": op.operation_key,
        "call_id": op.call_id,
        "principal": op.principal,
        "arguments": op.arguments,
        "intent_hash": op.intent_hash,
        "idempotency_key": op.idempotency_key,
        "status": str(op.status),
        "attempts": op.attempts,
    }
    if "idempotency_key" not in _registered(events):
        unrecorded["operation.idempotency_key"] = row.pop("idempotency_key")
    return row


def _contract(op: Operation) -> dict[str, Any]:
    version = op.tool_version
    return {
        "tool": version.tool_id,
        "version": version.number,
        "contract_hash": version.contract_hash,
        "contract": version.contract,
    }


def _attempts(op: Operation, events: list[Event], unrecorded: dict[str, Any]) -> list[Any]:
    """Each attempt: when it was claimed, how it ended and when, and the answer posted
    (held to the digest its ``outcome`` event records)."""
    hashed = {
        e.data.get("attempt"): e.data
        for e in events
        if e.kind == EventKind.OUTCOME and isinstance(e.data, dict) and "outcome_hash" in e.data
    }
    rows = []
    for attempt in Attempt.objects.filter(operation=op).order_by("number"):
        row: dict[str, Any] = {
            "number": attempt.number,
            "status": attempt.status,
            "claimed_at": iso(attempt.claimed_at),
            "closed_at": iso(attempt.closed_at),
            "outcome": attempt.outcome,
        }
        if attempt.outcome is not None and attempt.number not in hashed:
            unrecorded[f"attempts.{attempt.number}.outcome"] = row.pop("outcome")
        rows.append(row)
    return rows


def _opening(request: ApprovalRequest, events: list[Event]) -> Event | None:
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        if event.kind in REQUEST_OPENED_BY and data.get("approval") == request.pk:
            return event
    return None


def _approval(request: ApprovalRequest, op: Operation, events: list[Event]) -> dict[str, Any]:
    """A request: its status, the terms its opening event recorded (left out when that
    event predates them), its reason when the opening event records one, and its
    decisions: who, which verdict, with which comment, when."""
    opening = _opening(request, events)
    data = opening.data if opening is not None and isinstance(opening.data, dict) else {}
    row: dict[str, Any] = {"id": request.pk, "status": request.status}
    if "terms" in data:
        editable = op.tool_version.contract.get("approval", {}).get("editable")
        row["terms"] = approval_terms(request, editable=editable)
    if "reason" in data:
        row["reason"] = request.reason
    row["decisions"] = [
        {
            "user": decision.user.get_username(),
            "decision": decision.decision,
            "comment": decision.comment,
            "at": iso(decision.at),
        }
        for decision in sorted(request.decisions.all(), key=_decision_order)
    ]
    return row


def _decision_order(decision: Decision) -> tuple[Any, int]:
    return decision.at, decision.pk


def _grant(grant: Grant) -> dict[str, Any]:
    return {
        "id": grant.pk,
        "approval": grant.request_id,
        "intent_hash": grant.intent_hash,
        "expires_at": iso(grant.expires_at),
        "standing_grant": grant.standing_grant_id,
        "revoked_at": iso(grant.revoked_at),
    }


def _standing_grant(grant: StandingGrant) -> dict[str, Any]:
    return {
        "id": grant.pk,
        "terms": standing_grant_terms(grant),
        "issued_by": grant.created_by.get_username(),
        "signed_by": sorted(grant.signatures.values_list("user_id", flat=True)),
    }


def _standing_events(standing: list[StandingGrant], grants: list[Grant]) -> list[Event]:
    """How each standing grant came to be in force, and its uses that gave this
    operation's grants."""
    if not standing:
        return []
    used = [g.pk for g in grants if g.standing_grant_id is not None]
    streams = [f"sgr:{grant.pk}" for grant in standing]
    found = Event.objects.filter(stream__in=streams).filter(
        Q(kind__in=STANDING_OPENING) | Q(kind=EventKind.STANDING_GRANT_USED, data__grant__in=used)
    )
    return list(found.order_by("stream", "seq"))


def _resolutions(op: Operation) -> list[dict[str, Any]]:
    """Each "did not happen" declared by a person, and the second person's answer."""
    rows = []
    found = Resolution.objects.filter(operation=op).select_related("declared_by")
    for resolution in found.order_by("created_at", "id"):
        row: dict[str, Any] = {
            "id": resolution.pk,
            "declared_by": resolution.declared_by.get_username(),
            "note": resolution.note,
            "created_at": iso(resolution.created_at),
            "review": None,
        }
        review = ResolutionReview.objects.filter(resolution=resolution).select_related("user")
        answer = review.first()
        if answer is not None:
            row["review"] = {"decision": answer.decision}
            # A withdrawal is written by no event of its own: only its decision is shown.
            if answer.decision != ResolutionReview.Decision.WITHDRAWN:
                row["review"].update(
                    {
                        "user": answer.user.get_username() if answer.user else None,
                        "note": answer.note,
                        "at": iso(answer.at),
                    }
                )
        rows.append(row)
    return rows


def evidence_json(bundle: dict[str, Any]) -> str:
    """The bundle as its file holds it: UTF-8 JSON, indented for people to read."""
    return json.dumps(bundle, indent=1, ensure_ascii=False) + "\n"
