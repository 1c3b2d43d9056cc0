"""Runs: an agent's session on behalf of a principal, with its budgets."""

from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import access, errors
from ..machine import EventKind, Status
from ..models import (
    Run,
    Runner,
)
from ..text import normalize_principal
from .core import (
    Actor,
    approval_withdraw_pending,
    event_append,
    lock,
    transition,
)
from .terms import run_budgets, run_terms


def run_create(
    *, runner: Runner, principal: str, external_id: str = "", budgets: dict[str, Any]
) -> Run:
    try:
        principal = normalize_principal(principal)
    except ValueError as exc:
        raise errors.InvalidPrincipal(f"Not a usable principal: {exc}.") from exc
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.create(
            runner=runner,
            principal=principal,
            principal_user_id=min(access.principal_user_ids(principal), default=None),
            external_id=external_id,
            **run_budgets(budgets, now=now),
        )
        event_append(
            stream=run.id,
            kind=EventKind.RUN_CREATED,
            actor=Actor.of_runner(runner),
            run=run,
            to_status=run.status,
            data={
                "principal": principal,
                "external_id": external_id,
                "budgets": budgets,
                "terms": run_terms(run),
            },
            now=now,
        )
    return run


def run_cancel(*, run: Run, actor: Actor) -> Run:
    """Cancel an active run and its operations that have not started.

    Executing operations keep their lease and are classified by their outcome;
    ``outcome_unknown`` and ``compensating`` ones still need an answer and stay.

    1. The run is cancelled in its own transaction: from then on it takes no
       registration.
    2. Each waiting operation is then cancelled in a transaction of its own. Holding
       the run's lock while taking operations' locks would invert the order that outcome
       posting uses (operation, then the run's spend) and could deadlock.
    """
    if actor.user is not None:
        access.require_cancel_run(actor.user)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.status != Run.RunStatus.ACTIVE:
            return run
        now = timezone.now()
        run.status = Run.RunStatus.CANCELLED
        run.ended_at = now
        run.save(update_fields=["status", "ended_at", "updated_at"])
        event_append(
            stream=run.id,
            kind=EventKind.RUN_CANCELLED,
            actor=actor,
            run=run,
            from_status=Run.RunStatus.ACTIVE,
            to_status=run.status,
            now=now,
        )
    waiting = [Status.AWAITING_APPROVAL, Status.READY]
    for operation_id in list(
        run.operations.filter(status__in=waiting).values_list("pk", flat=True)
    ):
        with transaction.atomic():
            op = lock(operation_id)
            if op.status not in waiting:
                continue
            now = timezone.now()
            approval_withdraw_pending(op, now=now)
            transition(
                op,
                to=Status.CANCELLED,
                kind=EventKind.CANCELLED,
                actor=actor,
                now=now,
                data={"reason": "run cancelled"},
                error_code="cancelled",
                error_detail="The run was cancelled.",
            )
    return run
