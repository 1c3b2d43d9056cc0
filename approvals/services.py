"""Writes of the approvals app: requests, decisions, grants, revocation, expiry.

These functions work on the objects they are handed and never import operations;
``operations.services`` calls them inside its own transaction and applies the
operation transition that follows. Each returns what happened so the caller
can write the event beside it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from .errors import DecisionRefused, PermissionRefused
from .models import ApprovalRequest, Decision, Grant
from .people import Person

Status = ApprovalRequest.RequestStatus


def request_open(
    *,
    operation: Any,
    intent_hash: str,
    approvals_required: int,
    request_ttl_s: int,
    grant_ttl_s: int,
    reason: str,
    context: dict[str, Any],
    escalate_after_s: int | None = None,
    escalate_to: str = "",
    now: datetime | None = None,
) -> ApprovalRequest:
    """Open a pending request for ``operation`` (an ``operations.Operation``); with
    ``escalate_after_s`` it is offered to the group ``escalate_to`` from then on."""
    now = now or timezone.now()
    return ApprovalRequest.objects.create(
        escalate_at=now + timedelta(seconds=escalate_after_s) if escalate_after_s else None,
        escalate_to=escalate_to if escalate_after_s else "",
        operation=operation,
        intent_hash=intent_hash,
        approvals_required=approvals_required,
        grant_ttl_s=grant_ttl_s,
        reason=reason,
        context=context,
        created_at=now,
        expires_at=now + timedelta(seconds=request_ttl_s),
    )


def request_escalate(*, request: ApprovalRequest, now: datetime) -> bool:
    """Offer a pending request to its escalation group now. True if this call did it."""
    changed = ApprovalRequest.objects.filter(
        pk=request.pk,
        status=Status.PENDING,
        escalated_at__isnull=True,
        escalate_at__lte=now,
        expires_at__gt=now,
    ).update(escalated_at=now)
    request.refresh_from_db()
    return bool(changed)


def request_escalation_inherit(*, request: ApprovalRequest, source: ApprovalRequest) -> None:
    """An edited copy's request keeps the escalation its original had reached."""
    request.escalate_at = source.escalate_at
    request.escalate_to = source.escalate_to
    request.escalated_at = source.escalated_at
    request.save(update_fields=["escalate_at", "escalate_to", "escalated_at"])


def request_withdraw(*, request: ApprovalRequest, now: datetime | None = None) -> bool:
    """Withdraw a pending request (its operation ended otherwise). True if it was pending."""
    changed = ApprovalRequest.objects.filter(pk=request.pk, status=Status.PENDING).update(
        status=Status.WITHDRAWN, decided_at=now or timezone.now()
    )
    request.refresh_from_db()
    return bool(changed)


@dataclass(frozen=True)
class DecisionResult:
    decision: Decision
    request: ApprovalRequest
    grant: Grant | None
    # "pending" (more approvals needed), "approved" or "rejected".
    outcome: str


def decision_record(
    *,
    request: ApprovalRequest,
    user: Person,
    approve: bool,
    comment: str,
    refusal: str | None,
    now: datetime | None = None,
) -> DecisionResult:
    """Record one person's decision on a pending request (the caller holds the lock).

    A rejection needs a reason and ends the request. An approval counts towards the
    quorum; the approval that meets it creates a grant bound to the request's intent
    hash, usable until ``grant_ttl_s`` has passed. Whether this person may decide at all
    is the caller's to judge (``operations.access.decide_refusal``): ``refusal`` is its
    answer, refused here after the request's own state.
    """
    now = now or timezone.now()
    decision_check(request=request, refusal=refusal, now=now)
    comment = comment.strip()
    if not approve and not comment:
        raise DecisionRefused("A rejection needs a reason; the runner receives it.")
    try:
        with transaction.atomic():
            decision = Decision.objects.create(
                request=request,
                user=user,
                decision=Decision.Verdict.APPROVE if approve else Decision.Verdict.REJECT,
                comment=comment,
                at=now,
            )
    except IntegrityError as exc:
        raise DecisionRefused("You have already decided on this request.") from exc

    grant = None
    if not approve:
        request.status = Status.REJECTED
        request.decided_at = now
        request.save(update_fields=["status", "decided_at"])
        outcome = "rejected"
    elif request.decisions.filter(decision=Decision.Verdict.APPROVE).count() >= (
        request.approvals_required
    ):
        request.status = Status.APPROVED
        request.decided_at = now
        request.save(update_fields=["status", "decided_at"])
        grant = Grant.objects.create(
            request=request,
            intent_hash=request.intent_hash,
            created_at=now,
            expires_at=now + timedelta(seconds=request.grant_ttl_s),
        )
        outcome = "approved"
    else:
        outcome = "pending"
    return DecisionResult(decision=decision, request=request, grant=grant, outcome=outcome)


def decision_check(*, request: ApprovalRequest, refusal: str | None, now: datetime) -> None:
    """Refuse a decision on a request that takes none, or by a person who may not."""
    if request.status != Status.PENDING:
        raise DecisionRefused(f"This request is {request.status}; it takes no more decisions.")
    if request.expires_at <= now:
        raise DecisionRefused("This request has expired.")
    if refusal:
        raise PermissionRefused(refusal)


def request_supersede(*, request: ApprovalRequest, now: datetime) -> None:
    """A person approved with changes: this request ends, the successor's carries on."""
    request.status = Status.SUPERSEDED
    request.decided_at = now
    request.save(update_fields=["status", "decided_at"])


def grant_revoke(
    *, request: ApprovalRequest, user: Person, reason: str, now: datetime | None = None
) -> Grant:
    now = now or timezone.now()
    grant = Grant.objects.select_for_update().get(request=request)
    if grant.revoked_at is not None:
        raise DecisionRefused("This grant is already revoked.")
    grant.revoked_at = now
    grant.revoked_by = user
    grant.revoke_reason = reason.strip()
    grant.save(update_fields=["revoked_at", "revoked_by", "revoke_reason"])
    request.status = Status.REVOKED
    request.save(update_fields=["status"])
    return grant


def request_expire(*, request: ApprovalRequest, now: datetime | None = None) -> bool:
    """Mark a pending request past its expiry as expired. True if this call did it."""
    now = now or timezone.now()
    changed = ApprovalRequest.objects.filter(
        pk=request.pk, status=Status.PENDING, expires_at__lte=now
    ).update(status=Status.EXPIRED, decided_at=now)
    request.refresh_from_db()
    return bool(changed)


def grant_problem(
    *,
    request: ApprovalRequest,
    intent_hash: str,
    still_decides: Callable[[Person], bool],
    now: datetime | None = None,
) -> str | None:
    """Why the grant behind ``request`` cannot be used to claim now, or None.

    Approval is not authorization: checked at every claim. The grant must exist, be
    unexpired and unrevoked, bind this exact intent, and every person who approved must
    still hold the permission to decide for the tool.
    """
    now = now or timezone.now()
    if request.status == Status.REVOKED:
        return "the grant was revoked"
    grant = Grant.objects.filter(request=request).first()
    if request.status != Status.APPROVED or grant is None:
        return f"the approval request is {request.status}, not approved"
    if grant.revoked_at is not None:
        return "the grant was revoked"
    if grant.expires_at <= now:
        return "the grant expired"
    if grant.intent_hash != intent_hash:
        return "the intent changed since the grant was given"
    user_model = get_user_model()
    approver_ids = request.decisions.filter(decision=Decision.Verdict.APPROVE).values_list(
        "user_id", flat=True
    )
    for approver in user_model.objects.filter(pk__in=list(approver_ids)):
        if not still_decides(approver):
            return f"{approver.get_username()} no longer holds the permission to decide"
    return None
