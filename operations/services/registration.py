"""Registering an intended side effect as an operation (api.md, Operations)."""

import copy
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from .. import errors
from ..canonical import intent_hash
from ..contracts import concurrency_value
from ..machine import EventKind, Status
from ..models import (
    Attempt,
    Operation,
    Run,
    Runner,
    Tool,
    ToolVersion,
)
from . import shadow
from .claims import claim_locked
from .core import (
    GENESIS_HASH,
    Actor,
    approval_request_open,
    approval_requested_record,
    event_append,
    event_build,
    outbox_enqueue,
    subscribes,
)
from .intents import (
    _check_run_budgets,
    _context,
    _freeze,
    _Intent,
    _intent,
    _windows_decide,
)
from .judging import registration_forbidden_record
from .rows import approvals_known_none, db_datetime, insert_all, insert_unless_conflict
from .standing import standing_cover_locked
from .windows import window_entries_insert

# W3C Trace Context, matched in full (a "$" would admit a final newline).
TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


@dataclass
class Registration:
    operation: Operation
    created: bool
    attempt: Attempt | None = None
    claim_error: errors.DomainError | None = None


def _replay(existing: Operation, *, tool_name: str, arguments: Any, principal: str) -> Operation:
    """The same operation_key again: the same operation if the intent is unchanged.

    The arguments are frozen under the contract version the operation was registered
    with, so a newer contract cannot make a faithful replay look like a new intent.
    """
    mismatch = errors.IntentMismatch(
        f"operation_key {existing.operation_key!r} is registered as {existing.id} with "
        "another tool, arguments or principal. Use a new operation_key for a new intent.",
        operation=existing.id,
    )
    if tool_name != existing.tool_id:
        raise mismatch
    try:
        frozen = _freeze(existing.tool_version, arguments)
    except errors.InvalidArguments as exc:
        raise mismatch from exc
    if intent_hash(tool=tool_name, arguments=frozen, principal=principal) != existing.intent_hash:
        raise mismatch
    return existing


def operation_build(
    *,
    runner: Runner,
    run: Run,
    tool: Tool,
    version: ToolVersion,
    operation_key: str,
    frozen: Any,
    digest: str,
    principal: str,
    principal_user_id: int | None,
    status: Status,
    deadline_at: datetime | None,
    now: datetime,
    call_id: str = "",
    turn: int | None = None,
    previous: Operation | None = None,
    edits: list[dict[str, Any]] | None = None,
    traceparent: str = "",
) -> Operation:
    """A new operation, not yet written: what a registration and a person's edited copy
    (``decisions._approve_edited``) both insert. Its effect class and concurrency value
    follow from its contract version and frozen arguments; a ``traceparent`` that is not
    W3C trace context is dropped, whoever sent it."""
    contract = version.contract
    return Operation(
        runner=runner,
        run=run,
        tool=tool,
        tool_version=version,
        effect_class=contract["effect_class"],
        call_id=call_id,
        operation_key=operation_key,
        arguments=frozen,
        intent_hash=digest,
        principal=principal,
        principal_user_id=principal_user_id,
        status=status,
        deadline_at=deadline_at,
        concurrency_value=concurrency_value(contract, frozen),
        turn=turn,
        status_changed_at=now,
        previous=previous,
        edits=edits,
        traceparent=traceparent if TRACEPARENT.fullmatch(traceparent) else "",
    )


def registered_event_data(op: Operation) -> dict[str, Any]:
    """The data of an operation's ``registered`` event, the first of its stream, which
    ``audit verify`` compares with the row: what it is (tool, version, key, intent, the
    idempotency key every attempt carries), its deadline, and where it came from: the
    compensated operation it retries (``retry_of``), or for a person's edited copy the
    original and the changes (``edited_from``, ``edits``). An evidence bundle proves
    what its events hold, so the idempotency key is here and not only on the row."""
    origin: dict[str, Any] = (
        {"retry_of": op.previous_id}
        if op.edits is None
        else {"edited_from": op.previous_id, "edits": op.edits}
    )
    return {
        "tool": op.tool_id,
        "tool_version": op.tool_version.number,
        "operation_key": op.operation_key,
        "call_id": op.call_id,
        "intent_hash": op.intent_hash,
        "idempotency_key": op.idempotency_key,
        "turn": op.turn,
        **origin,
        "deadline_at": op.deadline_at,
    }


def _existing(*, runner: Runner, operation_key: str) -> Operation | None:
    return (
        Operation.objects.select_related("tool_version")
        .filter(runner=runner, operation_key=operation_key)
        .first()
    )


def _replayed(
    existing: Operation, *, tool_name: str, arguments: Any, principal: str
) -> Registration:
    return Registration(
        operation=_replay(existing, tool_name=tool_name, arguments=arguments, principal=principal),
        created=False,
    )


def operation_register(
    *,
    runner: Runner,
    run_id: str,
    tool_name: str,
    operation_key: str,
    arguments: Any,
    call_id: str = "",
    turn: int | None = None,
    approval: dict[str, Any] | None = None,
    claim_lease_s: int | None = None,
    retry_of: str | None = None,
    traceparent: str = "",
) -> Registration:
    """Register one intended side effect, or return the one already registered.

    1. Read the runner's run and the tool's active version (one statement).
    2. Check invoke permission, validate and freeze the arguments, hash the intent, and
       evaluate the approval policy, all before the transaction. A refusal here first
       looks for the ``operation_key``: a runner that crashed after registering gets
       its operation back whatever changed since.
    3. In one transaction: insert the operation (``ON CONFLICT DO NOTHING``: a known
       ``operation_key`` answers the same operation when the intent is the same and
       ``intent_mismatch`` otherwise, before any budget is consulted), then take the
       run's budgets with one conditional UPDATE, last, so that registrations in one
       run hold its row only for the end of their transactions. A registration that
       policies with a ``@window`` matched first locks and reads those windows, to
       know whether it passes a bound (then it waits for a person), and is counted in
       them once written (``services.windows``).

    The common case (no approval, no retry link, no webhook subscriber for the
    operation's first states, no open breaker) is ``_register_lean``: the operation is
    inserted already ``executing`` when claimed inline, its events in one INSERT, and
    the answer is built from what was written. Anything else is ``_register_full``,
    the general path through ``transition`` and ``claim_locked``.
    """
    run, tool, owners = _context(runner=runner, run_id=run_id, tool_name=tool_name)
    try:
        intent = _intent(
            runner=runner,
            run=run,
            tool=tool,
            owners=owners,
            tool_name=tool_name,
            arguments=arguments,
            approval=approval,
            retry_of=retry_of,
        )
    except errors.DomainError as refusal:
        existing = _existing(runner=runner, operation_key=operation_key)
        if existing is None:
            if isinstance(refusal, errors.ForbiddenByPolicy):
                registration_forbidden_record(refusal, runner=runner, run=run, tool_name=tool_name)
            raise
        return _replayed(
            existing, tool_name=tool_name, arguments=arguments, principal=run.principal
        )

    actor = Actor.of_runner(runner)
    with transaction.atomic(durable=True):
        now = timezone.now()
        if intent.windowed:
            # First in the transaction: the windows' locks are the first it takes.
            intent = _windows_decide(intent, now=now)
        deadline_s = intent.version.contract["retry"]["deadline_s"]
        op = operation_build(
            runner=runner,
            run=run,
            tool=intent.tool,
            version=intent.version,
            operation_key=operation_key,
            frozen=intent.frozen,
            digest=intent.digest,
            principal=run.principal,
            principal_user_id=run.principal_user_id,
            status=Status.AWAITING_APPROVAL if intent.approval_required else Status.READY,
            deadline_at=now + timedelta(seconds=deadline_s) if deadline_s else None,
            now=now,
            call_id=call_id,
            turn=turn,
            previous=intent.previous,
            traceparent=traceparent,
        )
        lean = _lean(intent, runner=runner, claim_lease_s=claim_lease_s)
        registration = (
            _register_lean(op, actor=actor, claim_lease_s=claim_lease_s, now=now) if lean else None
        )
        if registration is None:
            # Not lean, or the concurrency key's index refused the lean path's executing
            # copy: ``op`` itself was never changed, and registers ready here.
            registration = _register_full(
                op, intent=intent, actor=actor, claim_lease_s=claim_lease_s, now=now
            )
        if not registration.created:
            return _replayed(
                registration.operation,
                tool_name=tool_name,
                arguments=arguments,
                principal=run.principal,
            )
        if intent.windowed:
            window_entries_insert(registration.operation, intent.windowed, now=now)
        _run_count(run, turn=turn, now=now)
        if intent.shadow is not None:
            # After the commit, outside it (services/shadow.py says why).
            transaction.on_commit(
                partial(
                    shadow.shadow_record,
                    intent.shadow,
                    operation_id=registration.operation.id,
                ),
                robust=True,
            )
    return registration


def _lean(intent: "_Intent", *, runner: Runner, claim_lease_s: int | None) -> bool:
    """Whether a registration takes the lean path: no approval, no retry link, a closed
    breaker, and no webhook subscriber for the states it enters."""
    return (
        not intent.approval_required
        and intent.previous is None
        and intent.tool.breaker_state == Tool.BreakerState.CLOSED
        and not subscribes(runner, f"operation.{Status.READY}")
        and not (claim_lease_s is not None and subscribes(runner, f"operation.{Status.EXECUTING}"))
    )


def _run_count(run: Run, *, turn: int | None, now: datetime) -> None:
    """Count the tool call against the run's budgets, or refuse the registration.

    One conditional UPDATE, the transaction's last statement before COMMIT, so the run's
    row is held only from here to the commit. No row: something the UPDATE checks
    failed; the run is read to say which (and the operation inserted before is rolled
    back with the refusal).
    """
    turn_value = turn or 0
    stamp = db_datetime(now)
    sql = (
        "UPDATE operations_run SET tool_calls = tool_calls + 1, "
        "turns = CASE WHEN turns < %s THEN %s ELSE turns END, updated_at = %s "
        "WHERE id = %s AND status = %s "
        "AND (deadline_at IS NULL OR deadline_at > %s) "
        "AND (max_tool_calls IS NULL OR tool_calls < max_tool_calls) "
        "AND (max_spend IS NULL OR spend < max_spend) "
        "AND (max_turns IS NULL OR %s <= max_turns)"
    )
    params = [turn_value, turn_value, stamp, run.pk, Run.RunStatus.ACTIVE, stamp, turn_value]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        counted = cursor.rowcount == 1
    if not counted:
        _check_run_budgets(Run.objects.get(pk=run.pk), turn=turn, now=now)
        raise errors.RunNotActive(f"Run {run.pk} cannot take another tool call.")


def lean_rows(
    op: Operation, *, actor: Actor, claim_lease_s: int | None, now: datetime
) -> tuple[Operation, Attempt | None, list[Any]]:
    """What the lean path writes for ``op``, built and not written: a copy of ``op`` as
    it ends the request (``executing`` when claimed, its chain head on the row), its
    attempt (when claimed) and its events. ``op`` itself is left untouched, so the
    general path can still register it ``ready``."""
    op = copy.copy(op)
    registered = event_build(
        stream=op.id,
        seq=1,
        prev_hash=GENESIS_HASH,
        kind=EventKind.REGISTERED,
        actor=actor,
        operation=op,
        to_status=Status.READY,
        data=registered_event_data(op),
        now=now,
    )
    events = [registered]
    attempt = None
    if claim_lease_s is not None:
        lease_until = now + timedelta(seconds=claim_lease_s)
        attempt = Attempt(operation=op, number=1, claimed_at=now, lease_until=lease_until)
        # As ``transition`` does: the operation holds its executing attempt's lease.
        op.status, op.attempts, op.lease_until = Status.EXECUTING, 1, attempt.lease_until
        events.append(
            event_build(
                stream=op.id,
                seq=2,
                prev_hash=registered.hash,
                kind=EventKind.CLAIMED,
                actor=actor,
                operation=op,
                from_status=Status.READY,
                to_status=Status.EXECUTING,
                data={"attempt": 1, "lease_until": lease_until},
                now=now,
            )
        )
    op.event_seq, op.event_head = len(events), events[-1].hash
    return op, attempt, events


def _register_lean(
    op: Operation,
    *,
    actor: Actor,
    claim_lease_s: int | None,
    now: datetime,
) -> Registration | None:
    """Insert the operation as it ends the request (``executing`` when claimed), then
    its attempt and its events (one multi-row INSERT); no row is read back.

    It works on a copy of ``op`` (``lean_rows``): None when the concurrency key's
    partial unique index refused the copy as ``executing`` (another operation on the
    same resource holds it), and ``op``, untouched, is registered ``ready`` on the
    general path, whose claim answers the conflict.
    """
    op, attempt, events = lean_rows(op, actor=actor, claim_lease_s=claim_lease_s, now=now)
    if not insert_unless_conflict(op):
        existing = _existing(runner=op.runner, operation_key=op.operation_key)
        if existing is not None:
            return Registration(operation=existing, created=False)
        return None
    insert_all(*([attempt] if attempt is not None else []), *events)
    # Nothing else is written: the answer's approval is known to be none.
    approvals_known_none(op)
    return Registration(operation=op, created=True, attempt=attempt)


def _register_full(
    op: Operation,
    *,
    intent: _Intent,
    actor: Actor,
    claim_lease_s: int | None,
    now: datetime,
) -> Registration:
    """The general path: approval requests, retry links, webhooks, breakers."""
    if not insert_unless_conflict(op):
        existing = _existing(runner=op.runner, operation_key=op.operation_key)
        if existing is None:
            raise errors.IntentMismatch(
                f"operation_key {op.operation_key!r} could not be registered.",
            )
        return Registration(operation=existing, created=False)
    event_append(
        stream=op.id,
        kind=EventKind.REGISTERED,
        actor=actor,
        operation=op,
        to_status=op.status,
        data=registered_event_data(op),
        now=now,
    )
    policy = intent.policy
    required = intent.approval_required
    if required:
        context = intent.request_context()
        terms = intent.requirement
        # A standing grant approves the intent people approved in advance; a runner that
        # asked for a person (``approval.require``) gets one, and so does a policy that
        # asks for a group or a second factor (a standing grant's signers were never
        # checked against them).
        covered = (
            policy.runner_reason is None
            and (terms is None or (not terms.groups and not terms.second_factor))
            and standing_cover_locked(
                op,
                approvals_required=max(
                    intent.version.contract["approval"]["approvals_required"],
                    terms.approvals_required if terms else 1,
                ),
                reason=intent.reason,
                context=context,
                actor=actor,
                now=now,
            )
        )
        if not covered:
            request = approval_request_open(op, reason=intent.reason, context=context, now=now)
            approval_requested_record(op, request, actor=actor, now=now)
    if op.status == Status.AWAITING_APPROVAL or not required:
        # Covered by a standing grant, the operation went ready by a transition, which
        # wrote its webhooks.
        outbox_enqueue(op=op, event_type=f"operation.{op.status}", now=now)
    registration = Registration(operation=op, created=True)
    if claim_lease_s is not None and op.status == Status.READY:
        result = claim_locked(op, runner=op.runner, lease_s=claim_lease_s, now=now)
        if isinstance(result, errors.DomainError):
            registration.claim_error = result
        else:
            registration.attempt = result
    return registration
