"""The primitives every write of the ledger is made of, and the ledger itself.

- ``event_append`` adds one event to a stream's hash chain (``event_hash``).
- ``lock`` takes an operation's row; ``transition`` moves a locked operation along
  ``machine.TRANSITIONS`` and appends its event and outbox rows in the caller's
  transaction; ``record`` appends an event that changes no state; ``enter`` and
  ``succeed`` are the transitions with their target state's bookkeeping.
- ``outbox_enqueue`` writes webhook messages beside the change they report.
- ``due_each`` is the one loop of every sweep step; ``raise_after_commit`` the one
  ending of a service whose refusal leaves a trace.

Nothing here opens a transaction of its own except ``due_each`` (one per item): the
callers (the other modules of this package) own their transactions.
"""

import fnmatch
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any, TypeVar

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals import selectors as approval_selectors
from approvals import services as approval_services
from approvals.models import ApprovalRequest
from approvals.people import Person

from .. import access, errors, machine, payloads, telemetry
from ..canonical import sha256_hex
from ..eventmac import event_mac
from ..machine import EventKind, Status
from ..models import Attempt, Event, Notice, Operation, OutboxMessage, Runner, WebhookEndpoint
from ..payloads import iso
from ..selectors import operation_refresh
from .notices import notice_write, request_changed
from .rows import insert_all, insert_unless_conflict, save_fields
from .rows import pending as rows_pending
from .terms import approval_terms

GENESIS_HASH = "0" * 64
logger = logging.getLogger(__name__)
AttemptStatus = Attempt.AttemptStatus
T = TypeVar("T")

# ---------------------------------------------------------------------------------------
# Actors and the ledger


@dataclass(frozen=True)
class Actor:
    """Who acts: a runner, a console user, or the system (sweep, probe, claim)."""

    label: str
    user: Person | None = None
    runner: Runner | None = None

    @classmethod
    def of_runner(cls, runner: Runner) -> "Actor":
        return cls(f"runner:{runner.name}", runner=runner)

    @classmethod
    def of_user(cls, user: Person) -> "Actor":
        return cls(f"user:{user.get_username()}", user=user)

    @classmethod
    def system(cls, name: str) -> "Actor":
        return cls(f"system:{name}")


def json_safe(value: Any) -> Any:
    """Event data as plain JSON: timestamps as RFC 3339 strings, decimals as numbers."""
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, Decimal):
        return float(value)
    return value


def event_hashed(event: Event) -> dict[str, Any]:
    """What an event's hash covers, as the hash reads it (evidence bundles carry it)."""
    return {
        "stream": event.stream,
        "seq": event.seq,
        "kind": event.kind,
        "from": event.from_status,
        "to": event.to_status,
        "actor": event.actor,
        "at": iso(event.at),
        "data": event.data,
        "prev": event.prev_hash,
    }


def event_hash(event: Event) -> str:
    """The hash that chains an event to its stream's previous event."""
    return sha256_hex(event_hashed(event))


def event_append(
    *,
    stream: str,
    kind: EventKind,
    actor: Actor,
    operation: Operation | None = None,
    run: Any = None,
    tool_name: str = "",
    from_status: str = "",
    to_status: str = "",
    data: dict[str, Any] | None = None,
    now: datetime | None = None,
    head_saved_by_caller: bool = False,
) -> Event:
    """Append one event to ``stream``; the caller holds the lock of the stream's row.

    An operation's own stream keeps its head on the operation row (``event_seq``,
    ``event_head``), so appending reads no event: the head is advanced in memory and
    written here, or by the caller's UPDATE of the row (``head_saved_by_caller``). Other
    streams (runs, tools, runners, people) read their last event.
    """
    own_stream = operation is not None and stream == operation.id
    if own_stream:
        assert operation is not None
        seq, prev_hash = operation.event_seq + 1, operation.event_head or GENESIS_HASH
    else:
        last = (
            Event.objects.filter(stream=stream).order_by("-seq").values_list("seq", "hash").first()
        )
        seq, prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)
    at = now or timezone.now()

    def build(seq: int, prev_hash: str) -> Event:
        return event_build(
            stream=stream,
            seq=seq,
            prev_hash=prev_hash,
            kind=kind,
            actor=actor,
            operation=operation,
            run=run,
            tool_name=tool_name,
            from_status=from_status,
            to_status=to_status,
            data=data,
            now=at,
        )

    event = build(seq, prev_hash)
    if own_stream:
        assert operation is not None
        if not insert_unless_conflict(event):
            # The head on the row is behind its stream: events were appended by code
            # that did not keep it (the previous release, during an upgrade). Chain onto
            # the stream's real last event; the row's head is corrected below.
            last = (
                Event.objects.filter(stream=stream)
                .order_by("-seq")
                .values_list("seq", "hash")
                .first()
            )
            assert last is not None
            logger.warning(
                "Operation %s: event chain head on the row was at %s, the stream at %s; "
                "appended after the stream's last event.",
                stream,
                operation.event_seq,
                last[0],
            )
            seq = last[0] + 1
            event = build(seq, last[1])
            insert_all(event)
        operation.event_seq, operation.event_head = seq, event.hash
        if not head_saved_by_caller:
            save_fields(operation, ["event_seq", "event_head"])
    else:
        event.save()
    return event


def event_build(
    *,
    stream: str,
    seq: int,
    prev_hash: str,
    kind: EventKind,
    actor: Actor,
    operation: Operation | None,
    run: Any = None,
    tool_name: str = "",
    from_status: str = "",
    to_status: str = "",
    data: dict[str, Any] | None = None,
    now: datetime,
) -> Event:
    """One event, hashed onto ``prev_hash`` and MACed under the event key (when one is
    set), not yet saved (the hot path inserts several in one statement)."""
    event = Event(
        stream=stream,
        seq=seq,
        kind=kind,
        operation=operation,
        run_id=run.pk if run is not None else (operation.run_id if operation is not None else None),
        tool_name=tool_name or (operation.tool_id if operation is not None else ""),
        from_status=from_status,
        to_status=to_status,
        actor=actor.label,
        actor_user=actor.user,
        actor_runner=actor.runner,
        at=now,
        data=json_safe(data or {}),
        prev_hash=prev_hash,
    )
    event.hash = event_hash(event)
    event.mac = event_mac(event.hash)
    return event


# ---------------------------------------------------------------------------------------
# Locking and transitions


# What a transition reads beside the operation row. FOR UPDATE OF self: the joined rows
# are read, not locked (and PostgreSQL refuses to lock the nullable side of a join).
LOCK_RELATED = ("tool_version", "tool", "tool__active_version", "run", "runner")


def lock(operation_id: str) -> Operation:
    return (
        Operation.objects.select_for_update(of=("self",))
        .select_related(*LOCK_RELATED)
        .get(pk=operation_id)
    )


def lock_if_due(**still_due: Any) -> Operation | None:
    """Lock the operation that still matches ``still_due``, skipping one another
    transaction holds (a sweep on another worker, a runner's claim or outcome)."""
    return (
        Operation.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related(*LOCK_RELATED)
        .filter(**still_due)
        .first()
    )


def transition(
    op: Operation,
    *,
    to: Status,
    kind: EventKind,
    actor: Actor,
    now: datetime,
    data: dict[str, Any] | None = None,
    lease: Attempt | None = None,
    **changes: Any,
) -> Event:
    """Move a locked operation to ``to``, saving ``changes`` and the event together.

    Entering ``executing`` takes the attempt that holds the lease (``lease``). The lease
    is the attempt's (kept on its row after it closes, as its history); the operation
    holds a copy only while it executes, so that the sweep finds due leases through one
    index and a claim or an operation body reads the lease from the operation's row.
    Here the copy is taken from the attempt, and dropped on leaving ``executing``.
    """
    source = op.status
    if not machine.can_transition(source, to):
        raise errors.InvalidTransition(f"{source} -> {to} is not an allowed transition.")
    if (to == Status.EXECUTING) != (lease is not None):
        raise ValueError("An attempt's lease is held exactly while executing.")
    op.status = to
    op.status_changed_at = now
    for name, value in changes.items():
        setattr(op, name, value)
    op.lease_until = lease.lease_until if lease is not None else None
    event = event_append(
        stream=op.id,
        kind=kind,
        actor=actor,
        operation=op,
        from_status=source,
        to_status=to,
        data=data,
        now=now,
        head_saved_by_caller=True,
    )
    # Only what a transition changes, the chain's head with it: a full-row UPDATE writes
    # all 34 columns, and any in-memory value with them.
    save_fields(
        op,
        [
            "status",
            "status_changed_at",
            "lease_until",
            "updated_at",
            "event_seq",
            "event_head",
            *changes,
        ],
    )
    outbox_enqueue(op=op, event_type=f"operation.{to}", now=now)
    if to in machine.TERMINAL and telemetry.enabled():
        transaction.on_commit(partial(telemetry.export_operation, op.id))
    return event


def record(
    op: Operation,
    *,
    kind: EventKind,
    actor: Actor,
    now: datetime,
    data: dict[str, Any] | None = None,
) -> Event:
    """An event that changes no state (heartbeat, late outcome, probe)."""
    return event_append(
        stream=op.id,
        kind=kind,
        actor=actor,
        operation=op,
        from_status=op.status,
        to_status=op.status,
        data=data,
        now=now,
    )


def enter(op: Operation, *, to: Status, **kwargs: Any) -> Event:
    """A transition that also prepares the target state's bookkeeping."""
    if to == Status.OUTCOME_UNKNOWN:
        # The first lookup waits a short grace: a request the runner sent just before its
        # lease ran out may still be on its way to the provider, and a lookup that
        # answers "not found" before it lands would allow a second effect.
        # Only a tool with a lookup is ever probed: for the others no lookup is due.
        grace = timedelta(seconds=settings.RECONCILE_FIRST_PROBE_DELAY_S)
        looks_up = op.tool_version.contract["reconcile"]["mode"] == "lookup"
        kwargs.setdefault("next_probe_at", kwargs["now"] + grace if looks_up else None)
        kwargs.setdefault("probes", 0)
    else:
        kwargs.setdefault("next_probe_at", None)
    kwargs.setdefault("snoozed_until", None)
    return transition(op, to=to, **kwargs)


def succeed(
    op: Operation,
    *,
    kind: EventKind,
    actor: Actor,
    now: datetime,
    data: dict[str, Any],
    downstream_id: str = "",
    result: Any = None,
) -> Event:
    """Close an operation as succeeded: the effect happened, whoever says so (the
    runner's outcome, a late one, a reconciliation answer, a provider's event)."""
    return enter(
        op,
        to=Status.SUCCEEDED,
        kind=kind,
        actor=actor,
        now=now,
        data=data,
        result=result if result is not None else op.result,
        downstream_id=downstream_id or op.downstream_id,
        error_code="",
        error_detail="",
        unknown_sticky=False,
    )


def budget_exhaust(op: Operation, *, why: str, actor: Actor, now: datetime, **data: Any) -> str:
    """End an operation that has no attempt or time left, and return the one sentence
    that says so (the operation's ``error_detail`` and the refusal's ``detail``).

    It ends ``budget_exhausted``, or ``outcome_unknown`` where an earlier attempt may
    have had its effect ("unknown is sticky", ``machine.end_without_retry``).
    """
    detail = f"The operation's budget is exhausted: {why}."
    enter(
        op,
        to=machine.end_without_retry(
            effect_class=op.effect_class,
            unknown_sticky=op.unknown_sticky,
            wanted=Status.BUDGET_EXHAUSTED,
        ),
        kind=EventKind.BUDGET_EXHAUSTED,
        actor=actor,
        now=now,
        data={"reason": why, **data},
        error_code="budget_exhausted",
        error_detail=detail,
    )
    return detail


def current_attempt(op: Operation) -> Attempt | None:
    """The executing attempt of a locked operation, locked too."""
    return (
        Attempt.objects.select_for_update()
        .filter(operation=op, number=op.attempts, status=AttemptStatus.EXECUTING)
        .first()
    )


def attempt_supersede(op: Operation, *, now: datetime) -> None:
    """The effect is known to have happened while an attempt still executes: that
    attempt is stale, and its outcome will be answered ``stale_attempt``."""
    attempt = current_attempt(op)
    if attempt is not None:
        attempt.status = AttemptStatus.SUPERSEDED
        attempt.closed_at = now
        attempt.save(update_fields=["status", "closed_at"])


def retry_after_ms(until: datetime, now: datetime) -> int:
    return max(1, int((until - now).total_seconds() * 1000) + 1)


# ---------------------------------------------------------------------------------------
# Approval requests opened and withdrawn by the operation's transitions


def approval_request_open(
    op: Operation,
    *,
    reason: str,
    context: dict[str, Any],
    now: datetime,
    announce: bool = True,
) -> ApprovalRequest:
    """Open a pending request for ``op`` on its contract version's terms; people who may
    decide it are told after commit unless ``announce`` is off (a request approved in the
    same transaction, by a use of a standing grant)."""
    approval = op.tool_version.contract["approval"]
    context["barred_user_ids"] = access.barred_at_open(op, also=context.pop("barred_user_ids", []))
    # The policies that asked (``context["policy_terms"]``, services.policies): the
    # stricter of the contract and them, never less than the contract.
    terms = context.get("policy_terms") or {}
    request = approval_services.request_open(
        operation=op,
        intent_hash=op.intent_hash,
        approvals_required=max(
            approval["approvals_required"], terms.get("approvals_required") or 1
        ),
        request_ttl_s=min(
            approval["request_ttl_s"], terms.get("request_ttl_s") or approval["request_ttl_s"]
        ),
        grant_ttl_s=min(
            approval["grant_ttl_s"], terms.get("grant_ttl_s") or approval["grant_ttl_s"]
        ),
        reason=reason,
        context=context,
        escalate_after_s=approval.get("escalate_after_s"),
        escalate_to=approval.get("escalate_to", ""),
        now=now,
    )
    if announce:
        # People are told from the notice, after commit (services/notices.py).
        notice_write(kind=Notice.Kind.REQUEST_OPENED, request=request, now=now)
    return request


def approval_requested_record(
    op: Operation, request: ApprovalRequest, *, actor: Actor, now: datetime, **extra: Any
) -> None:
    """The operation's ``approval_requested`` event for ``request``: its id, reason and
    the terms it opened with (``approval_opened_terms``), and what ``extra`` adds."""
    record(
        op,
        kind=EventKind.APPROVAL_REQUESTED,
        actor=actor,
        now=now,
        data={
            "approval": request.id,
            "reason": request.reason,
            "terms": approval_opened_terms(op, request),
            **extra,
        },
    )


def approval_opened_terms(op: Operation, request: ApprovalRequest) -> dict[str, Any]:
    """The ``terms`` of the event that opens ``request``, which ``audit verify``
    compares with the request's row (``terms.approval_terms``)."""
    return approval_terms(request, editable=op.tool_version.contract["approval"].get("editable"))


def approval_withdraw_pending(op: Operation, *, now: datetime) -> None:
    latest = approval_selectors.request_latest(op)
    if (
        latest is not None
        and latest.status == ApprovalRequest.RequestStatus.PENDING
        and approval_services.request_withdraw(request=latest, now=now)
    ):
        request_changed(latest, now=now)


# ---------------------------------------------------------------------------------------
# The outbox: webhooks written in the transaction of the change they report


def subscribes(runner: Runner, event_type: str) -> bool:
    """Whether any active endpoint of ``runner`` may want ``event_type``, known from the
    runner row (``Runner.webhook_events``) without a query."""
    return any(fnmatch.fnmatchcase(event_type, pattern) for pattern in runner.webhook_events)


def _subscribed(runner: Runner, event_type: str) -> list[WebhookEndpoint]:
    if not subscribes(runner, event_type):
        return []
    endpoints = WebhookEndpoint.objects.filter(runner_id=runner.pk, is_active=True)
    return [
        endpoint
        for endpoint in endpoints
        if any(fnmatch.fnmatchcase(event_type, pattern) for pattern in endpoint.events)
    ]


def outbox_enqueue(
    *, op: Operation, event_type: str, now: datetime, extra: dict[str, Any] | None = None
) -> int:
    """Write one outbox message per subscribed endpoint; the caller's transaction commits
    them with the change, so a change is never reported without happening or lost."""
    endpoints = _subscribed(op.runner, event_type)
    if not endpoints:
        return 0
    pending = rows_pending()
    if pending is not None:
        # The payload re-reads the operation: what this transaction gathered for it
        # (an outcome batch's deferred rows, ``rows.deferred``) is written first.
        pending.flush()
    payload = {
        "type": event_type,
        "timestamp": iso(now),
        "data": {"operation": payloads.operation(operation_refresh(op)), **(extra or {})},
    }
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            endpoint=endpoint,
            operation=op,
            event_type=event_type,
            payload=json_safe(payload),
            created_at=now,
            next_attempt_at=now,
        )
        for endpoint in endpoints
    )
    return len(endpoints)


def outbox_enqueue_to(
    *,
    runners: Iterable[Runner],
    event_type: str,
    now: datetime,
    data: dict[str, Any],
    operation: Operation | None = None,
) -> int:
    """Write one outbox message per subscribed endpoint of each of ``runners``: a change
    that belongs to no one operation (a standing grant's), told to every runner it
    concerns. ``operation``, when given, is the message's operation (the one the change
    was about, for its own runner)."""
    payload = json_safe({"type": event_type, "timestamp": iso(now), "data": data})
    messages = [
        OutboxMessage(
            endpoint=endpoint,
            operation=operation,
            event_type=event_type,
            payload=payload,
            created_at=now,
            next_attempt_at=now,
        )
        for runner in runners
        for endpoint in _subscribed(runner, event_type)
    ]
    OutboxMessage.objects.bulk_create(messages)
    return len(messages)


def outbox_approval_decided(op: Operation, request: ApprovalRequest, *, now: datetime) -> None:
    request.refresh_from_db()
    request_changed(request, now=now)
    outbox_enqueue(
        op=op,
        event_type="approval.decided",
        now=now,
        extra={"approval": payloads.approval(request)},
    )


# ---------------------------------------------------------------------------------------
# Endings shared by many services


def raise_after_commit(result: T | Exception) -> T:
    """Return ``result``, or raise it if it is a refusal.

    Called after the ``atomic`` block closed: a refusal that must leave a trace (an
    expired lease handled during a claim, a grant found invalid, a conflicting outcome)
    is committed first and raised second, since raising inside the block would undo it.
    """
    if isinstance(result, Exception):
        raise result
    return result


def due_each(due: Iterable[T], handle: Callable[[T], bool]) -> int:
    """The one loop of every sweep step; returns how many items ``handle`` acted on.

    1. ``due`` is read once, without locks (a bounded query of ids).
    2. Each item gets a transaction of its own, so one slow or failing item holds no
       other's lock and what was done before it stays done.
    3. ``handle`` takes its row with SKIP LOCKED and checks again that it is still due
       (``lock_if_due``): another worker, a claim or an outcome may have got there
       first. It answers whether it acted. Safe on many workers at once.
    """
    handled = 0
    for item in list(due):
        with transaction.atomic():
            handled += bool(handle(item))
    return handled
