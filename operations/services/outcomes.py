"""Outcomes of attempts, leases and late results (docs/api.md, The state machine)."""

from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from .. import errors, machine
from ..canonical import canonical_json, sha256_hex
from ..machine import EventKind, Status, Verdict
from ..models import (
    Attempt,
    Operation,
    Run,
    Runner,
    Tool,
    ToolVersion,
)
from .breaker import breaker_record_locked
from .core import (
    Actor,
    AttemptStatus,
    approval_withdraw_pending,
    attempt_supersede,
    current_attempt,
    enter,
    lock,
    raise_after_commit,
    record,
    succeed,
)
from .rows import Columns, approvals_known_none, pending, save_fields


def _settle(
    op: Operation,
    *,
    kind: str,
    code: str,
    detail: str,
    actor: Actor,
    now: datetime,
    event_kind: EventKind,
    attempt_number: int,
    retry_after_ms: int | None = None,
    result: Any = None,
    downstream_id: str = "",
    extra: dict[str, Any] | None = None,
) -> None:
    """Apply what a posted outcome does (``machine.classify_outcome``) to an executing
    operation."""
    contract = op.tool_version.contract
    retry = contract["retry"]
    verdict = machine.classify_outcome(
        effect_class=op.effect_class,
        kind=kind,
        code=code or None,
        retryable_codes=retry["retryable_codes"],
    )
    sticky = op.unknown_sticky or (kind == "unknown" and machine.is_write(op.effect_class))
    data = {
        "attempt": attempt_number,
        "kind": kind,
        "code": code,
        "verdict": verdict.value,
        **(extra or {}),
    }
    common = {"actor": actor, "now": now, "kind": event_kind, "unknown_sticky": sticky}
    breaker_record_locked(op, succeeded=kind == "succeeded", code=code, now=now)

    if verdict == Verdict.SUCCEEDED:
        succeed(
            op,
            kind=event_kind,
            actor=actor,
            now=now,
            data=data,
            result=result,
            downstream_id=downstream_id,
        )
    elif verdict == Verdict.FAILED_PERMANENT:
        target = machine.end_without_retry(
            effect_class=op.effect_class, unknown_sticky=sticky, wanted=Status.FAILED_PERMANENT
        )
        enter(op, to=target, data=data, error_code=code, error_detail=detail, **common)
    elif verdict == Verdict.COMPENSATE:
        enter(op, to=Status.COMPENSATING, data=data, error_code=code, error_detail=detail, **common)
    elif verdict == Verdict.RECONCILE:
        enter(
            op, to=Status.OUTCOME_UNKNOWN, data=data, error_code=code, error_detail=detail, **common
        )
    else:
        delay_ms = machine.backoff_delay_ms(
            attempt=op.attempts,
            base_delay_ms=retry["base_delay_ms"],
            max_delay_ms=retry["max_delay_ms"],
        )
        delay_ms = max(delay_ms, retry_after_ms or 0)
        not_before = now + timedelta(milliseconds=delay_ms)
        budget = machine.Budget(
            attempts_used=op.attempts,
            max_attempts=retry["max_attempts"],
            deadline_at=op.deadline_at,
        )
        if machine.retry_possible(budget, not_before=not_before):
            data["not_before"] = not_before
            enter(
                op,
                to=Status.READY,
                data=data,
                not_before=not_before,
                error_code=code,
                error_detail=detail,
                **common,
            )
        else:
            target = machine.end_without_retry(
                effect_class=op.effect_class, unknown_sticky=sticky, wanted=Status.BUDGET_EXHAUSTED
            )
            data["budget"] = "attempts" if op.attempts >= retry["max_attempts"] else "deadline"
            enter(
                op,
                to=target,
                data=data,
                error_code=code,
                error_detail=f"No retry left after attempt {op.attempts}. {detail}".strip(),
                **common,
            )


def lease_expire_locked(op: Operation, *, actor: Actor, now: datetime) -> None:
    """An expired lease with no outcome is an ``unknown`` outcome (code ``lease_expired``):
    the attempt may have reached the provider."""
    attempt = current_attempt(op)
    extra: dict[str, Any] = {}
    if attempt is not None:
        attempt.status = AttemptStatus.LEASE_EXPIRED
        attempt.closed_at = now
        attempt.save(update_fields=["status", "closed_at"])
        # Heartbeat events are sparse (one per HEARTBEAT_EVENT_EVERY): the expiry says
        # how far the lease had been extended, and by how many heartbeats.
        extra = {"lease_until": attempt.lease_until, "heartbeats": attempt.heartbeats}
    _settle(
        op,
        kind="unknown",
        code="lease_expired",
        detail=f"The lease of attempt {op.attempts} expired with no outcome.",
        actor=actor,
        now=now,
        event_kind=EventKind.LEASE_EXPIRED,
        attempt_number=op.attempts,
        extra=extra,
    )


def outcome_body(body: dict[str, Any]) -> dict[str, Any]:
    """The stored form of a posted outcome, for comparing a repeat with the original."""
    return {key: value for key, value in body.items() if value is not None}


_OPERATION = Columns(Operation, "o")
_ATTEMPT = Columns(Attempt, "a")
_VERSION = Columns(ToolVersion, "v")
_TOOL = Columns(Tool, "t")
_ACTIVE = Columns(ToolVersion, "av")


_LOCK_SQL: dict[tuple[str, bool], str] = {}
_PARTS = (_OPERATION, _ATTEMPT, _VERSION, _TOOL, _ACTIVE)


def _lock_sql(*, many: bool) -> str:
    columns = ", ".join(part.sql() for part in _PARTS)  # names from the models' metadata
    where = (
        # A batch's pairs, in one read, locked in the operations' order (two racing
        # batches on the same operations then never wait for each other in a cycle).
        "WHERE (a.operation_id, a.number) IN (SELECT * FROM unnest(%s::text[], %s::int[])) "
        "AND o.runner_id = %s ORDER BY o.id"
        if many
        else "WHERE a.operation_id = %s AND a.number = %s AND o.runner_id = %s"
    )
    sql = (
        f"SELECT {columns}, "  # noqa: S608
        "EXISTS (SELECT 1 FROM approvals_approvalrequest r WHERE r.operation_id = o.id) "
        "FROM operations_attempt a "
        "JOIN operations_operation o ON o.id = a.operation_id "
        "JOIN operations_toolversion v ON v.id = o.tool_version_id "
        "JOIN operations_tool t ON t.name = o.tool_id "
        "LEFT JOIN operations_toolversion av ON av.id = t.active_version_id "
        f"{where}"
    )
    if connection.features.has_select_for_update_of:
        # The operation first, then its attempt, as every other path takes them (lock,
        # then current_attempt: heartbeats, the sweep, claims): PostgreSQL locks in
        # this order, and the opposite one deadlocks with them.
        sql += " FOR UPDATE OF o, a"
    _LOCK_SQL[(connection.vendor, many)] = sql
    return sql


def _built(row: Sequence[Any], runner: Runner, seen: dict[Any, Any]) -> tuple[Operation, Attempt]:
    """The operation and attempt of one row of the locking read, with what came with
    them. Operations of one contract version share its instance, and those of one tool
    share the tool's (``seen``, across a batch's rows): built once, and what the breaker
    learns of one outcome the next one sees."""
    offset = len(_OPERATION) + len(_ATTEMPT)
    op = _OPERATION.build(row[: len(_OPERATION)])
    attempt = _ATTEMPT.build(row[len(_OPERATION) : offset])
    shared = seen.get(("version", row[offset]))
    if shared is None:
        built: list[Any] = []
        for part in (_VERSION, _TOOL, _ACTIVE):
            values = row[offset : offset + len(part)]
            offset += len(part)
            built.append(part.build(values) if values[0] is not None else None)
        version, tool, active = built
        known = seen.get(("tool", tool.name))
        if known is None:
            tool.active_version = (
                version if active is not None and active.pk == version.pk else active
            )
            seen[("tool", tool.name)] = tool
        else:
            tool = known
        shared = seen[("version", version.pk)] = (version, tool)
    else:
        offset += len(_VERSION) + len(_TOOL) + len(_ACTIVE)
    version, tool = shared
    op.tool_version, op.tool, op.runner = version, tool, runner
    attempt.operation = op
    if not row[offset]:
        approvals_known_none(op)
    return op, attempt


def _lock_attempt(*, operation_id: str, number: int, runner: Runner) -> tuple[Operation, Attempt]:
    """The runner's operation and its attempt ``number``, both locked, in one read.

    The access check (the operation is the runner's) is the read's own filter; with the
    operation come its contract version and its tool's active one (the breaker's), and
    whether it ever had an approval request (if not, the answer's approval is none
    without another read).
    """
    sql = _LOCK_SQL.get((connection.vendor, False)) or _lock_sql(many=False)
    with connection.cursor() as cursor:
        cursor.execute(sql, [operation_id, number, runner.pk])
        row = cursor.fetchone()
    if row is None:
        if Operation.objects.filter(pk=operation_id, runner=runner).exists():
            raise errors.NotFound(f"Operation {operation_id} has no attempt {number}.")
        raise errors.NotFound(f"No operation {operation_id!r}.")
    return _built(row, runner, {})


def attempts_lock(
    pairs: Sequence[tuple[str, int]], *, runner: Runner
) -> dict[tuple[str, int], tuple[Operation, Attempt]]:
    """The runner's operations and attempts named by ``pairs`` (operation, number),
    locked in one read (PostgreSQL); a pair that is not there is not in the answer."""
    sql = _LOCK_SQL.get((connection.vendor, True)) or _lock_sql(many=True)
    with connection.cursor() as cursor:
        cursor.execute(sql, [[p[0] for p in pairs], [p[1] for p in pairs], runner.pk])
        rows = cursor.fetchall()
    seen: dict[Any, Any] = {}
    found = {}
    for row in rows:
        op, attempt = _built(row, runner, seen)
        found[(op.id, attempt.number)] = (op, attempt)
    return found


def attempt_record_outcome(
    *,
    operation_id: str,
    number: int,
    body: dict[str, Any],
    runner: Runner,
    run_id: str | None = None,
) -> Operation:
    """Record what an attempt did and classify the operation.

    The same outcome again answers the operation unchanged; a different one for an
    attempt that has one is ``outcome_conflict``. Once something acted on the attempt's
    expired lease, every post is a late outcome: recorded, answered ``stale_attempt``,
    and only a late success changes state. ``run_id`` (an outcome batch's run): an
    operation of another run is not found, as one of another runner.
    """
    actor = Actor.of_runner(runner)
    posted = outcome_body(body)
    with transaction.atomic(durable=True):
        op, attempt = _lock_attempt(operation_id=operation_id, number=number, runner=runner)
        if run_id is not None and op.run_id != run_id:
            raise errors.NotFound(f"No operation {operation_id!r} in run {run_id!r}.")
        result = outcome_record_locked(op, attempt=attempt, posted=posted, actor=actor)
    return raise_after_commit(result)


def outcome_record_locked(
    op: Operation, *, attempt: Attempt, posted: dict[str, Any], actor: Actor
) -> Operation | errors.DomainError:
    """What ``attempt_record_outcome`` does once it holds the operation and its
    attempt: the operation, or the refusal to raise once the trace it wrote commits."""
    now = timezone.now()
    number = attempt.number
    if attempt.status in (AttemptStatus.LEASE_EXPIRED, AttemptStatus.SUPERSEDED):
        return _late_outcome_locked(op, attempt=attempt, body=posted, actor=actor, now=now)
    if attempt.status != AttemptStatus.EXECUTING:
        if canonical_json(attempt.outcome) == canonical_json(posted):
            return op
        record(
            op,
            kind=EventKind.OUTCOME_CONFLICT,
            actor=actor,
            now=now,
            data={
                "attempt": number,
                "recorded": attempt.status,
                "posted": posted["kind"],
                "code": posted.get("code"),
            },
        )
        return errors.OutcomeConflict(
            f"Attempt {number} already ended {attempt.status}. If the effect is now "
            "known to have happened, post a reconciliation."
        )
    return _apply_outcome_locked(op, attempt=attempt, body=posted, actor=actor, now=now)


def _add_spend(op: Operation, cost: Any) -> None:
    if cost:
        amount = Decimal(str(cost))
        gathering = pending()
        if gathering is not None:
            # An outcome batch: the runs' rows last, after every tool's (the breaker's),
            # in the order a single outcome takes them (operation, tool, run).
            gathering.increment(Run, op.run_id, "spend", amount)
            return
        Run.objects.filter(pk=op.run_id).update(spend=F("spend") + amount)


def _apply_outcome_locked(
    op: Operation, *, attempt: Attempt, body: dict[str, Any], actor: Actor, now: datetime
) -> Operation:
    kind = body["kind"]
    attempt.status = {
        "succeeded": AttemptStatus.SUCCEEDED,
        "failed": AttemptStatus.FAILED,
        "unknown": AttemptStatus.UNKNOWN,
    }[kind]
    attempt.outcome = body
    attempt.outcome_code = body.get("code", "")
    attempt.closed_at = now
    save_fields(attempt, ["status", "outcome", "outcome_code", "closed_at"])
    _settle(
        op,
        kind=kind,
        code=body.get("code", "unknown" if kind == "unknown" else ""),
        detail=body.get("detail", ""),
        actor=actor,
        now=now,
        event_kind=EventKind.OUTCOME,
        attempt_number=attempt.number,
        retry_after_ms=body.get("retry_after_ms"),
        result=body.get("result"),
        downstream_id=body.get("downstream_id", ""),
        # The event holds the digest of the whole answer as stored on the attempt (its
        # downstream reference, result and detail included, RFC 8785 canonical JSON), so
        # an evidence bundle proves what the runner said the provider answered without
        # the event repeating a result of any size.
        extra={"outcome_hash": sha256_hex(body)},
    )
    # After _settle, which may lock the tool's row (the breaker): locks go tool, then
    # run, as in a registration whose claim consults the breaker before the budgets.
    _add_spend(op, body.get("cost"))
    return op


def _late_outcome_locked(
    op: Operation, *, attempt: Attempt, body: dict[str, Any], actor: Actor, now: datetime
) -> errors.DomainError:
    record(
        op,
        kind=EventKind.LATE_OUTCOME,
        actor=actor,
        now=now,
        data={"attempt": attempt.number, "outcome": body},
    )
    _add_spend(op, body.get("cost"))
    if body["kind"] == "succeeded" and op.status in machine.LATE_SUCCESS_FROM:
        # The effect happened: that is evidence whatever else went on meanwhile.
        if op.status == Status.EXECUTING:
            attempt_supersede(op, now=now)
        approval_withdraw_pending(op, now=now)
        succeed(
            op,
            kind=EventKind.LATE_SUCCESS,
            actor=actor,
            now=now,
            data={"attempt": attempt.number, "downstream_id": body.get("downstream_id")},
            result=body.get("result"),
            downstream_id=body.get("downstream_id", ""),
        )
    elif (
        body["kind"] == "unknown"
        and attempt.not_applied
        and op.effect_class == machine.EffectClass.IRREVERSIBLE
        and op.status in (Status.READY, Status.AWAITING_APPROVAL)
    ):
        # Reconciliation said this attempt did not happen, and now its runner says it
        # sent it and never heard back: the request may have landed after the lookup.
        # The "not found" is no longer safe to act on, so the question is open again.
        approval_withdraw_pending(op, now=now)
        enter(
            op,
            to=Status.OUTCOME_UNKNOWN,
            kind=EventKind.REOPENED,
            actor=actor,
            now=now,
            data={"attempt": attempt.number, "reason": "a late unknown outcome after not_found"},
            unknown_sticky=True,
            error_code=body.get("code", "unknown"),
            error_detail=f"Attempt {attempt.number} reported an unknown outcome after "
            "reconciliation found it had not happened; reconcile again.",
        )
        Attempt.objects.filter(pk=attempt.pk).update(not_applied=False)
    return errors.StaleAttempt(
        f"Attempt {attempt.number}'s lease ended before this outcome; it was recorded as a "
        "late outcome."
    )


def attempt_heartbeat(
    *, operation: Operation, number: int, lease_s: int, runner: Runner
) -> Attempt:
    with transaction.atomic():
        op = lock(operation.pk)
        now = timezone.now()
        attempt = Attempt.objects.select_for_update().filter(operation=op, number=number).first()
        if attempt is None:
            raise errors.NotFound(f"Operation {op.id} has no attempt {number}.")
        if attempt.status != AttemptStatus.EXECUTING or attempt.lease_until <= now:
            raise errors.StaleAttempt(f"Attempt {number} no longer holds a lease.")
        attempt.lease_until = now + timedelta(seconds=lease_s)
        attempt.last_heartbeat_at = now
        attempt.heartbeats += 1
        attempt.save(update_fields=["lease_until", "last_heartbeat_at", "heartbeats"])
        # The operation's copy of the lease moves with it (``core.transition``).
        op.lease_until = attempt.lease_until
        op.save(update_fields=["lease_until", "updated_at"])
        # The first heartbeat, then one in every HEARTBEAT_EVENT_EVERY: the lease is on
        # the attempt row; the history says the runner was alive, not each beat.
        if (attempt.heartbeats - 1) % settings.HEARTBEAT_EVENT_EVERY == 0:
            record(
                op,
                kind=EventKind.HEARTBEAT,
                actor=Actor.of_runner(runner),
                now=now,
                data={
                    "attempt": number,
                    "lease_until": attempt.lease_until,
                    "heartbeats": attempt.heartbeats,
                },
            )
    return attempt
