"""The time-driven transitions. Each step is one ``due_each`` loop: a bounded read of
due ids, then one transaction per item that takes its row with SKIP LOCKED and checks
again that it is still due. Idempotent; safe on many workers at once."""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.utils import timezone

from approvals.models import ApprovalRequest

from ..machine import EventKind, Status
from ..metrics import timed_sweep
from ..models import InboundEvent, Operation, Run
from .core import (
    Actor,
    approval_withdraw_pending,
    budget_exhaust,
    due_each,
    event_append,
    lock_if_due,
)
from .decisions import approval_escalate_locked, request_expire_locked
from .inbound import inbound_apply
from .outcomes import lease_expire_locked
from .policies import in_force
from .standing import standing_grant_expire_due
from .windows import window_entries_delete_expired

logger = logging.getLogger(__name__)
WAITING = (Status.READY, Status.AWAITING_APPROVAL)


@timed_sweep("lease_expiry")
def lease_expire_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """Treat every expired lease as an ``unknown`` outcome: a claim or outcome that got
    to the operation first wins."""
    now = now or timezone.now()
    still_due = {"status": Status.EXECUTING, "lease_until__lte": now}

    def expire(operation_id: str) -> bool:
        op = lock_if_due(pk=operation_id, **still_due)
        if op is None:
            return False
        lease_expire_locked(op, actor=Actor.system("sweep"), now=now)
        return True

    due = Operation.objects.filter(**still_due).values_list("pk", flat=True)[:limit]
    return due_each(due, expire)


@timed_sweep("operation_deadlines")
def operation_deadline_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """End waiting operations past their deadline."""
    now = now or timezone.now()
    still_due = {"status__in": WAITING, "deadline_at__lte": now}

    def end(operation_id: str) -> bool:
        op = lock_if_due(pk=operation_id, **still_due)
        if op is None:
            return False
        approval_withdraw_pending(op, now=now)
        budget_exhaust(op, why="deadline passed", actor=Actor.system("sweep"), now=now)
        return True

    due = Operation.objects.filter(**still_due).values_list("pk", flat=True)[:limit]
    return due_each(due, end)


def _requests_due(
    handle: Callable[[Operation, ApprovalRequest], bool], *, limit: int, **due: Any
) -> int:
    """Pending approval requests matching ``due``, each handled under its operation's
    lock and its own (operation first, as everywhere)."""

    def step(item: tuple[str, str]) -> bool:
        request_id, operation_id = item
        op = lock_if_due(pk=operation_id)
        if op is None:
            return False
        request = ApprovalRequest.objects.select_for_update().get(pk=request_id)
        return handle(op, request)

    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.RequestStatus.PENDING, **due)
    return due_each(pending.values_list("pk", "operation_id")[:limit], step)


@timed_sweep("approval_expiry")
def approval_expire_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """End operations whose approval request expired undecided."""
    now = now or timezone.now()
    return _requests_due(partial(request_expire_locked, now=now), limit=limit, expires_at__lte=now)


@timed_sweep("approval_escalation")
def approval_escalate_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """Offer requests pending past their ``escalate_at`` to their escalation group."""
    now = now or timezone.now()
    return _requests_due(
        partial(approval_escalate_locked, now=now),
        limit=limit,
        escalated_at__isnull=True,
        escalate_at__lte=now,
    )


@timed_sweep("run_deadlines")
def run_expire_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """Mark active runs past their deadline as expired."""
    now = now or timezone.now()
    still_due = {"status": Run.RunStatus.ACTIVE, "deadline_at__lte": now}

    def expire(run_id: str) -> bool:
        run = Run.objects.select_for_update(skip_locked=True).filter(pk=run_id, **still_due).first()
        if run is None:
            return False
        run.status = Run.RunStatus.EXPIRED
        run.ended_at = now
        run.save(update_fields=["status", "ended_at", "updated_at"])
        event_append(
            stream=run.id,
            kind=EventKind.RUN_EXPIRED,
            actor=Actor.system("sweep"),
            run=run,
            from_status=Run.RunStatus.ACTIVE,
            to_status=run.status,
            now=now,
        )
        return True

    due = Run.objects.filter(**still_due).values_list("pk", flat=True)[:limit]
    return due_each(due, expire)


@timed_sweep("inbound_events")
def inbound_apply_pending(*, limit: int = 100) -> int:
    """Apply provider events that were recorded but not applied (``inbound_receive``
    applies at once; this catches the ones whose application failed)."""
    due = InboundEvent.objects.filter(
        status=InboundEvent.InboundStatus.RECEIVED,
        received_at__lte=timezone.now() - timedelta(seconds=10),
    ).values_list("pk", flat=True)[:limit]

    def apply(event_id: str) -> bool:
        try:
            inbound_apply(event_id=event_id)
        except Exception:
            # One event that cannot be applied must not stop the others; it stays
            # "received" and is tried again next time.
            logger.exception("Inbound event %s could not be applied.", event_id)
            return False
        return True

    return due_each(due, apply)


@timed_sweep("standing_grant_expiry")
def standing_grants_expire_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """Mark standing grants past their expiry as expired."""
    return standing_grant_expire_due(now=now, limit=limit)


@timed_sweep("policy_window_entries")
def window_entries_expire_due(*, now: datetime | None = None, limit: int = 5000) -> int:
    """Delete the entries of limits over time that no window in force counts any more
    (docs/policies.md, Limits over time). A plain bounded delete: no transition, no
    event; two sweepers delete disjoint or already deleted rows."""
    policies = in_force()
    return window_entries_delete_expired(
        [*policies.active.policies, *policies.shadow.policies],
        now=now or timezone.now(),
        limit=limit,
    )


@dataclass(frozen=True)
class SweepReport:
    leases_expired: int
    approvals_expired: int
    approvals_escalated: int
    operations_past_deadline: int
    runs_expired: int
    standing_grants_expired: int
    window_entries_deleted: int


def sweep(*, now: datetime | None = None) -> SweepReport:
    """Every time-driven transition, once."""
    now = now or timezone.now()
    return SweepReport(
        leases_expired=lease_expire_due(now=now),
        approvals_expired=approval_expire_due(now=now),
        approvals_escalated=approval_escalate_due(now=now),
        operations_past_deadline=operation_deadline_due(now=now),
        runs_expired=run_expire_due(now=now),
        standing_grants_expired=standing_grants_expire_due(now=now),
        window_entries_deleted=window_entries_expire_due(now=now),
    )
