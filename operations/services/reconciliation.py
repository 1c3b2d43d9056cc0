"""Reconciliation: answers to "did the effect happen?", from runners, probes and people."""

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals.errors import DecisionRefused
from approvals.people import Person

from .. import access, errors, machine
from ..machine import EventKind, Status
from ..models import (
    Attempt,
    Notice,
    Operation,
    Resolution,
    ResolutionReview,
)
from . import notices
from .core import (
    Actor,
    AttemptStatus,
    approval_opened_terms,
    approval_request_open,
    enter,
    lock,
    raise_after_commit,
    record,
    succeed,
)


def operation_reconcile(
    *,
    operation: Operation,
    result: str,
    actor: Actor,
    downstream_id: str = "",
    evidence: dict[str, Any] | None = None,
    source: str = "runner",
) -> Operation:
    """Answer the question an ``outcome_unknown`` operation asks: did it happen?

    ``committed`` closes it as succeeded. ``not_found`` marks its unknown attempts as
    not applied and lets it try again (irreversible tools only through a new approval
    that shows the evidence), or ends it when nothing is left. ``still_unknown``
    schedules the next probe with backoff, up to the contract's ``max_probes``.
    Runners and automatic probes answer here; people answer through
    ``operation_resolve``, which adds the four-eyes rule.
    """
    with transaction.atomic():
        op = lock(operation.pk)
        now = timezone.now()
        _require_unknown(op)
        data = {
            "result": result,
            "downstream_id": downstream_id or None,
            "evidence": evidence or {},
            "source": source,
        }
        reconcile_locked(op, result=result, actor=actor, now=now, data=data)
    return op


def _require_unknown(op: Operation) -> None:
    if op.status != Status.OUTCOME_UNKNOWN:
        raise errors.NotUnknown(f"Operation {op.id} is {op.status}, not outcome_unknown.")


def reconcile_locked(
    op: Operation,
    *,
    result: str,
    actor: Actor,
    now: datetime,
    data: dict[str, Any],
    barred_user_ids: list[int] | None = None,
) -> None:
    if result == "committed":
        succeed(
            op,
            kind=EventKind.RECONCILED,
            actor=actor,
            now=now,
            data=data,
            downstream_id=data.get("downstream_id") or "",
        )
    elif result == "not_found":
        _not_found_locked(op, actor=actor, now=now, data=data, barred_user_ids=barred_user_ids)
    else:
        _probe_scheduled_locked(op, actor=actor, now=now, data=data)


def _probe_scheduled_locked(
    op: Operation, *, actor: Actor, now: datetime, data: dict[str, Any]
) -> None:
    """A probe that settled nothing: count it and schedule the next one with backoff."""
    max_probes = op.tool_version.contract["reconcile"]["max_probes"]
    op.probes += 1
    exhausted = op.probes >= max_probes
    op.next_probe_at = None if exhausted else now + machine.next_probe_delay(probes=op.probes)
    op.save(update_fields=["probes", "next_probe_at", "updated_at"])
    data.update(probes=op.probes, probes_exhausted=exhausted, next_probe_at=op.next_probe_at)
    record(op, kind=EventKind.PROBE, actor=actor, now=now, data=data)


def operation_probe_failed(*, operation: Operation, error: str, actor: Actor) -> Operation:
    """A lookup that gave no usable answer (timeout, refused, not the expected JSON)."""
    with transaction.atomic():
        op = lock(operation.pk)
        if op.status != Status.OUTCOME_UNKNOWN:
            return op
        data = {"result": "failed", "error": error[:500], "source": "probe"}
        _probe_scheduled_locked(op, actor=actor, now=timezone.now(), data=data)
    return op


def operation_resolve(
    *,
    operation: Operation,
    user: Person,
    result: str,
    downstream_id: str = "",
    note: str = "",
    snooze_until: datetime | None = None,
) -> Operation:
    """A person's answer to an ``outcome_unknown`` operation, with evidence.

    - ``committed`` needs a downstream reference or an evidence note.
    - ``not_found`` ("did not happen") needs a note; for an irreversible tool it only
      proposes the answer, which a second person must confirm
      (``operation_resolution_confirm``).
    - ``still_unknown`` snoozes the operation in the queue until ``snooze_until``.
    """
    note = note.strip()
    downstream_id = downstream_id.strip()
    with transaction.atomic():
        op = lock(operation.pk)
        access.require_reconcile(user, op.tool)
        _require_unknown(op)
        now = timezone.now()
        actor = Actor.of_user(user)
        evidence = {"note": note} if note else {}
        data = {
            "result": result,
            "downstream_id": downstream_id or None,
            "evidence": evidence,
            "source": "person",
        }
        if result == "committed":
            if not (downstream_id or note):
                raise DecisionRefused("Give the downstream reference or an evidence note.")
            reconcile_locked(op, result=result, actor=actor, now=now, data=data)
        elif result == "not_found":
            if not note:
                raise DecisionRefused("Say how you know the effect did not happen.")
            if op.effect_class == machine.EffectClass.IRREVERSIBLE:
                if op.resolutions.filter(review__isnull=True).exists():
                    raise DecisionRefused("A 'did not happen' already waits for confirmation.")
                resolution = Resolution.objects.create(
                    operation=op, declared_by=user, note=note, evidence=evidence, created_at=now
                )
                record(
                    op,
                    kind=EventKind.RESOLUTION_PROPOSED,
                    actor=actor,
                    now=now,
                    data={"resolution": resolution.id, "result": "not_found", "note": note},
                )
                notices.notice_write(
                    kind=Notice.Kind.CONFIRMATION_NEEDED, resolution=resolution, now=now
                )
            else:
                reconcile_locked(
                    op, result=result, actor=actor, now=now, data=data, barred_user_ids=[user.pk]
                )
        elif result == "still_unknown":
            if snooze_until is None or snooze_until <= now:
                raise DecisionRefused("Choose a time in the future to look again.")
            op.snoozed_until = snooze_until
            op.save(update_fields=["snoozed_until", "updated_at"])
            record(
                op,
                kind=EventKind.SNOOZED,
                actor=actor,
                now=now,
                data={**data, "snoozed_until": snooze_until},
            )
        else:
            raise DecisionRefused(f"Unknown resolution {result!r}.")
    return op


def operation_resolution_confirm(
    *, resolution_id: str, user: Person, confirm: bool, note: str = ""
) -> Operation:
    """The second person's answer to a proposed "did not happen" (four eyes).

    Confirming applies ``not_found``: the irreversible operation goes back for a new
    approval, which the declarer may not give. Disputing closes the proposal and the
    operation stays unknown.
    """
    note = note.strip()
    resolution = Resolution.objects.filter(pk=resolution_id).only("operation_id").first()
    if resolution is None:
        raise errors.NotFound(f"No resolution {resolution_id!r}.")
    with transaction.atomic():
        op = lock(resolution.operation_id)
        resolution = Resolution.objects.select_related("declared_by").get(pk=resolution_id)
        access.require_reconcile(user, op.tool)
        if resolution.status != "pending":
            raise DecisionRefused(f"This proposal is {resolution.status}.")
        if resolution.declared_by_id == user.pk:
            raise DecisionRefused(
                "You declared that it did not happen; someone else must confirm it."
            )
        now = timezone.now()
        actor = Actor.of_user(user)
        Decision = ResolutionReview.Decision
        result: Operation | Exception = op
        if op.status != Status.OUTCOME_UNKNOWN:
            ResolutionReview.objects.create(
                resolution=resolution, decision=Decision.WITHDRAWN, user=None, note=note, at=now
            )
            result = errors.NotUnknown(
                f"Operation {op.id} is {op.status} now; the proposal is withdrawn."
            )
        elif confirm:
            ResolutionReview.objects.create(
                resolution=resolution, decision=Decision.CONFIRMED, user=user, note=note, at=now
            )
            data = {
                "result": "not_found",
                "downstream_id": None,
                "evidence": {**resolution.evidence, "confirmation": note},
                "source": "person",
                "resolution": resolution.id,
                "declared_by": resolution.declared_by.get_username(),
                "confirmed_by": user.get_username(),
            }
            reconcile_locked(
                op,
                result="not_found",
                actor=actor,
                now=now,
                data=data,
                barred_user_ids=[resolution.declared_by_id],
            )
        else:
            if not note:
                raise DecisionRefused("Say why you dispute it.")
            ResolutionReview.objects.create(
                resolution=resolution, decision=Decision.DISPUTED, user=user, note=note, at=now
            )
            record(
                op,
                kind=EventKind.RESOLUTION_DISPUTED,
                actor=actor,
                now=now,
                data={"resolution": resolution.id, "note": note},
            )
    return raise_after_commit(result)


def operation_note_add(*, operation: Operation, user: Person, note: str) -> Operation:
    """Evidence without an answer: a note on the operation's trace."""
    note = note.strip()
    if not note:
        raise DecisionRefused("The note is empty.")
    with transaction.atomic():
        op = lock(operation.pk)
        access.require_reconcile(user, op.tool)
        record(
            op,
            kind=EventKind.NOTE,
            actor=Actor.of_user(user),
            now=timezone.now(),
            data={"note": note},
        )
    return op


def operation_compensated_by_hand(*, operation: Operation, user: Person, note: str) -> Operation:
    """A person records that a failed undo was done by hand."""
    if not note.strip():
        raise DecisionRefused("Say how the undo was done.")
    access.require_reconcile(user, operation.tool)
    return operation_compensate(
        operation=operation,
        result="committed",
        actor=Actor.of_user(user),
        evidence={"note": note.strip(), "by_hand": True},
    )


def _not_found_locked(
    op: Operation,
    *,
    actor: Actor,
    now: datetime,
    data: dict[str, Any],
    barred_user_ids: list[int] | None = None,
) -> None:
    Attempt.objects.filter(
        operation=op,
        status__in=[AttemptStatus.UNKNOWN, AttemptStatus.LEASE_EXPIRED],
        not_applied=False,
    ).update(not_applied=True)
    contract = op.tool_version.contract
    out_of_time = op.deadline_at is not None and op.deadline_at <= now
    out_of_attempts = op.attempts >= contract["retry"]["max_attempts"]
    common = {
        "actor": actor,
        "now": now,
        "kind": EventKind.RECONCILED,
        "unknown_sticky": False,
    }
    if out_of_time or out_of_attempts:
        why = "deadline passed" if out_of_time else "no attempts left"
        enter(
            op,
            to=Status.BUDGET_EXHAUSTED,
            data={**data, "budget": why},
            error_code="budget_exhausted",
            error_detail=f"The effect did not happen and the budget is exhausted: {why}.",
            **common,
        )
    elif op.effect_class == machine.EffectClass.IRREVERSIBLE:
        request = approval_request_open(
            op,
            reason=(
                "Reconciliation found that the earlier attempt did not happen. Approve to "
                "try again, having read the evidence."
            ),
            context={"reconciliation": data, "barred_user_ids": barred_user_ids or []},
            now=now,
        )
        enter(
            op,
            to=Status.AWAITING_APPROVAL,
            data={**data, "approval": request.id, "terms": approval_opened_terms(op, request)},
            error_code="",
            error_detail="",
            **common,
        )
    else:
        enter(
            op,
            to=Status.READY,
            data=data,
            not_before=None,
            error_code="",
            error_detail="",
            **common,
        )


def operation_compensate(
    *,
    operation: Operation,
    result: str,
    actor: Actor,
    evidence: dict[str, Any] | None = None,
) -> Operation:
    """Record the outcome of a compensable operation's undo."""
    with transaction.atomic():
        op = lock(operation.pk)
        now = timezone.now()
        if op.status != Status.COMPENSATING:
            raise errors.NotCompensating(f"Operation {op.id} is {op.status}, not compensating.")
        data = {"result": result, "evidence": evidence or {}}
        if result == "committed":
            enter(
                op,
                to=Status.COMPENSATED,
                kind=EventKind.COMPENSATION,
                actor=actor,
                now=now,
                data=data,
                error_code="compensated",
                error_detail="The effect was undone.",
            )
        else:
            op.error_code = "compensation_failed"
            op.error_detail = "The undo failed; the operation waits in the reconciliation queue."
            op.save(update_fields=["error_code", "error_detail", "updated_at"])
            record(op, kind=EventKind.COMPENSATION, actor=actor, now=now, data=data)
    return op
