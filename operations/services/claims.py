"""Claiming an attempt: ``ready`` -> ``executing``, committed before the runner acts."""

from datetime import datetime, timedelta
from functools import partial

from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals import selectors as approval_selectors
from approvals import services as approval_services
from approvals.models import ApprovalRequest

from .. import access, errors, machine
from ..machine import EventKind, Status
from ..models import (
    Attempt,
    Operation,
    Runner,
)
from .breaker import breaker_admits_locked
from .core import (
    Actor,
    approval_opened_terms,
    approval_request_open,
    budget_exhaust,
    iso,
    lock,
    raise_after_commit,
    retry_after_ms,
    transition,
)
from .outcomes import lease_expire_locked


def attempt_claim(*, operation: Operation, runner: Runner, lease_s: int) -> Attempt:
    """Claim the next attempt of an operation: ``ready`` -> ``executing``.

    Committed before it returns, so the runner calls the outside world only once the
    claim is durable. Refusals follow api.md's order.
    """
    with transaction.atomic(durable=True):
        op = lock(operation.pk)
        result = claim_locked(op, runner=runner, lease_s=lease_s, now=timezone.now())
    return raise_after_commit(result)


# How soon a runner refused with approval_required may usefully ask again. A person takes
# seconds to hours, so this is a polling pace, never past the request's expiry (which
# ends the wait too); an approval.decided webhook makes polling unnecessary.
APPROVAL_POLL_MS = 5000


def _approval_required(op: Operation, *, now: datetime) -> errors.ApprovalRequired:
    request = approval_selectors.request_latest(op)
    if request is None or request.status != ApprovalRequest.RequestStatus.PENDING:
        return errors.ApprovalRequired(retry_after_ms=APPROVAL_POLL_MS)
    # Past its expiry but not yet swept: the sweep ends it within seconds, so poll at
    # the usual pace rather than at once.
    wait_ms = (
        min(APPROVAL_POLL_MS, retry_after_ms(request.expires_at, now))
        if request.expires_at > now
        else APPROVAL_POLL_MS
    )
    return errors.ApprovalRequired(
        f"Approval request {request.id} waits for a decision until {iso(request.expires_at)}.",
        retry_after_ms=wait_ms,
        approval=request.id,
        expires_at=iso(request.expires_at),
    )


def claim_locked(
    op: Operation, *, runner: Runner, lease_s: int, now: datetime
) -> Attempt | errors.DomainError:
    actor = Actor.of_runner(runner)
    if op.status == Status.EXECUTING:
        if op.lease_until is not None and op.lease_until > now:
            return errors.AttemptInProgress(
                f"Attempt {op.attempts} holds a lease until {iso(op.lease_until)}.",
                retry_after_ms=retry_after_ms(op.lease_until, now),
            )
        lease_expire_locked(op, actor=actor, now=now)

    if op.status == Status.SUPERSEDED:
        return errors.Superseded(
            f"Operation {op.id} was approved with changes as {op.superseded_by_id}; claim that.",
            successor=op.superseded_by_id,
        )
    if op.status in machine.TERMINAL:
        return errors.OperationClosed(f"Operation {op.id} is {op.status}.")
    if op.status == Status.OUTCOME_UNKNOWN:
        return errors.ReconciliationRequired()
    if op.status == Status.COMPENSATING:
        return errors.CompensationRequired()
    if op.status == Status.AWAITING_APPROVAL:
        return _approval_required(op, now=now)
    if not access.runner_may_invoke(runner, op.tool):
        return errors.ToolForbidden(f"Runner {runner.name} may not invoke {op.tool_id}.")

    request = approval_selectors.request_latest(op)
    if request is not None:
        problem = approval_services.grant_problem(
            request=request,
            intent_hash=op.intent_hash,
            still_decides=partial(access.may_decide_on, request=request, tool=op.tool),
            now=now,
        )
        if problem is not None:
            new_request = approval_request_open(
                op,
                reason=f"A new approval is needed: {problem}.",
                context={
                    "replaces": request.id,
                    "grant_problem": problem,
                    "barred_user_ids": request.context.get("barred_user_ids", []),
                    # What the policies asked at registration still holds.
                    **{
                        key: request.context[key]
                        for key in ("policies", "policy_terms")
                        if key in request.context
                    },
                },
                now=now,
            )
            transition(
                op,
                to=Status.AWAITING_APPROVAL,
                kind=EventKind.GRANT_INVALID,
                actor=actor,
                now=now,
                data={
                    "problem": problem,
                    "approval": new_request.id,
                    "previous": request.id,
                    "terms": approval_opened_terms(op, new_request),
                },
            )
            return errors.GrantInvalid(f"The grant cannot be used: {problem}.")

    refusal = breaker_admits_locked(op, now=now)
    if refusal is not None:
        return refusal
    if op.not_before is not None and op.not_before > now:
        return errors.RetryLater(
            f"The next attempt may start at {iso(op.not_before)}.",
            retry_after_ms=retry_after_ms(op.not_before, now),
        )
    max_attempts = op.tool_version.contract["retry"]["max_attempts"]
    if (op.deadline_at is not None and op.deadline_at <= now) or op.attempts >= max_attempts:
        why = "deadline passed" if op.attempts < max_attempts else "no attempts left"
        return errors.BudgetExhausted(budget_exhaust(op, why=why, actor=actor, now=now))

    conflict = errors.ConcurrencyConflict(
        "Another operation on the same resource is executing or awaiting an answer."
    )
    if op.concurrency_value is not None and (
        Operation.objects.filter(
            tool_id=op.tool_id,
            concurrency_value=op.concurrency_value,
            status__in=list(machine.BLOCKING),
        )
        .exclude(pk=op.pk)
        .exists()
    ):
        return conflict
    number = op.attempts + 1
    lease_until = now + timedelta(seconds=lease_s)
    try:
        # The partial unique index is the last word on the concurrency key: a rival that
        # committed after the check above makes this savepoint fail, not the claim's
        # whole transaction.
        with transaction.atomic():
            attempt = Attempt.objects.create(
                operation=op, number=number, claimed_at=now, lease_until=lease_until
            )
            transition(
                op,
                to=Status.EXECUTING,
                kind=EventKind.CLAIMED,
                actor=actor,
                now=now,
                data={"attempt": number, "lease_until": lease_until},
                lease=attempt,
                attempts=number,
                not_before=None,
            )
    except IntegrityError:
        op.refresh_from_db()
        return conflict
    return attempt
