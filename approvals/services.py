"""Writes of the approvals app: requests, decisions, grants, revocation, expiry, and
standing grants (their signatures and the counting of their uses).

These functions work on the objects they are handed and never import operations;
``operations.services`` calls them inside its own transaction and applies the
operation transition that follows. Each returns what happened so the caller
can write the event beside it.
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from .errors import DecisionRefused, PermissionRefused
from .models import ApprovalRequest, Decision, Grant, StandingGrant, StandingGrantSignature
from .people import Person

Status = ApprovalRequest.RequestStatus
StandingStatus = StandingGrant.GrantStatus


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
    # Read here, at every claim, with its standing grant: a revocation committed by any
    # process is seen by the next claim, whichever process serves it.
    grant = Grant.objects.filter(request=request).select_related("standing_grant").first()
    if request.status != Status.APPROVED or grant is None:
        return f"the approval request is {request.status}, not approved"
    if grant.revoked_at is not None:
        return "the grant was revoked"
    standing = grant.standing_grant
    if standing is not None and standing.status == StandingStatus.REVOKED:
        return f"the standing grant {standing.id} that gave it was revoked"
    if grant.expires_at <= now:
        return "the grant expired"
    if grant.intent_hash != intent_hash:
        return "the intent changed since the grant was given"
    user_model = get_user_model()
    approver_ids = set(
        request.decisions.filter(decision=Decision.Verdict.APPROVE).values_list(
            "user_id", flat=True
        )
    )
    if standing is not None:
        approver_ids |= set(standing_grant_signers(standing))
    for approver in user_model.objects.filter(pk__in=sorted(approver_ids)).order_by("pk"):
        if not still_decides(approver):
            return f"{approver.get_username()} no longer holds the permission to decide"
    return None


# ---------------------------------------------------------------------------------------
# Standing grants: approval given in advance for a family of intents


def standing_grant_open(
    *,
    user: Person,
    tool: str,
    principal: str,
    run_id: str,
    pins: list[dict[str, Any]],
    max_uses: int,
    sum_path: str,
    max_sum: Decimal | None,
    expires_at: datetime,
    approvals_required: int,
    now: datetime,
) -> StandingGrant:
    """A proposed standing grant, signed by nobody yet: the caller signs it for its
    issuer (``standing_grant_sign``) in the same transaction."""
    return StandingGrant.objects.create(
        tool=tool,
        principal=principal,
        run_id=run_id,
        pins=pins,
        max_uses=max_uses,
        sum_path=sum_path,
        max_sum=max_sum,
        expires_at=expires_at,
        approvals_required=approvals_required,
        created_by=user,
        created_at=now,
    )


def standing_grant_signers(grant: StandingGrant) -> list[int]:
    """The ids of the people who signed ``grant``, sorted."""
    return sorted(grant.signatures.values_list("user_id", flat=True))


def standing_grant_sign(
    *,
    grant: StandingGrant,
    user: Person,
    refusal: str | None,
    second_factor: bool,
    now: datetime,
) -> bool:
    """Record one person's signature on a proposed standing grant (the caller holds its
    row lock); True when it met the quorum and the grant became active.

    Whether this person may sign is the caller's to judge
    (``operations.access.standing_sign_refusal``): ``refusal`` is its answer, refused
    here after the grant's own state.
    """
    if grant.status != StandingStatus.PROPOSED:
        raise DecisionRefused(
            f"This standing grant is {grant.status}; it takes no more signatures."
        )
    if grant.expires_at <= now:
        raise DecisionRefused("This standing grant has expired.")
    if refusal:
        raise PermissionRefused(refusal)
    try:
        with transaction.atomic():
            StandingGrantSignature.objects.create(
                grant=grant, user=user, at=now, second_factor=second_factor
            )
    except IntegrityError as exc:
        raise DecisionRefused("You have already signed this standing grant.") from exc
    if grant.signatures.count() < grant.approvals_required:
        return False
    grant.status = StandingStatus.ACTIVE
    grant.activated_at = now
    grant.save(update_fields=["status", "activated_at"])
    return True


def standing_grant_take_use(*, grant: StandingGrant, amount: Decimal | None, now: datetime) -> bool:
    """Take one use of ``grant`` (and ``amount`` of its sum), or nothing: one conditional
    UPDATE, so that of any number of concurrent takers no more succeed than the grant
    holds. Under PostgreSQL's READ COMMITTED a taker that waited for another's row lock
    judges the condition again on the row that one committed. True if this call took it.
    """
    spent = amount if amount is not None else Decimal(0)
    taken = (
        StandingGrant.objects.filter(
            pk=grant.pk, status=StandingStatus.ACTIVE, uses__lt=F("max_uses"), expires_at__gt=now
        )
        .filter(Q(max_sum__isnull=True) | Q(max_sum__gte=F("sum_used") + spent))
        .update(uses=F("uses") + 1, sum_used=F("sum_used") + spent)
    )
    if taken:
        grant.refresh_from_db(fields=["uses", "sum_used", "status"])
    return bool(taken)


def standing_grant_spent(grant: StandingGrant) -> bool:
    """Whether ``grant`` has no use, or none of its sum, left."""
    return grant.uses >= grant.max_uses or (
        grant.max_sum is not None and grant.sum_used >= grant.max_sum
    )


def standing_grant_exhaust(*, grant: StandingGrant, now: datetime) -> bool:
    """Mark an active grant with nothing left as exhausted. True if this call did it."""
    if not standing_grant_spent(grant):
        return False
    changed = StandingGrant.objects.filter(pk=grant.pk, status=StandingStatus.ACTIVE).update(
        status=StandingStatus.EXHAUSTED, ended_at=now
    )
    grant.refresh_from_db(fields=["status", "ended_at"])
    return bool(changed)


def standing_grant_revoke(*, grant: StandingGrant, user: Person, reason: str, now: datetime) -> str:
    """Revoke a standing grant (the caller holds its row lock) and answer the status it
    had. It covers nothing from now on, and each grant it gave is refused at its next
    claim (``grant_problem``), even once it was exhausted or expired."""
    if grant.status == StandingStatus.REVOKED:
        raise DecisionRefused("This standing grant is already revoked.")
    reason = reason.strip()
    if not reason:
        raise DecisionRefused("Say why the standing grant is revoked.")
    previous = grant.status
    grant.status = StandingStatus.REVOKED
    grant.ended_at = now
    grant.revoked_by = user
    grant.revoke_reason = reason
    grant.save(update_fields=["status", "ended_at", "revoked_by", "revoke_reason"])
    return previous


def standing_grant_expire(*, grant: StandingGrant, now: datetime) -> str | None:
    """Mark a proposed or active grant past its expiry as expired; the status it had if
    this call did it, else None."""
    previous = grant.status
    changed = StandingGrant.objects.filter(
        pk=grant.pk,
        status__in=[StandingStatus.PROPOSED, StandingStatus.ACTIVE],
        expires_at__lte=now,
    ).update(status=StandingStatus.EXPIRED, ended_at=now)
    grant.refresh_from_db(fields=["status", "ended_at"])
    return previous if changed else None


def request_approve_standing(
    *, request: ApprovalRequest, standing_grant: StandingGrant, now: datetime
) -> Grant:
    """Approve a request just opened with a use of ``standing_grant``: its grant binds
    the request's intent hash, as a person's approval would, and names the standing
    grant."""
    request.status = Status.APPROVED
    request.decided_at = now
    request.save(update_fields=["status", "decided_at"])
    return Grant.objects.create(
        request=request,
        intent_hash=request.intent_hash,
        created_at=now,
        expires_at=now + timedelta(seconds=request.grant_ttl_s),
        standing_grant=standing_grant,
    )
