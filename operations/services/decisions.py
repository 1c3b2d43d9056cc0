"""People's approval decisions and revocations, and the transitions that follow."""

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals import services as approval_services
from approvals.errors import DecisionRefused, Refusal
from approvals.models import ApprovalRequest

from .. import access, errors
from ..machine import Status
from ..models import (
    Operation,
)
from .core import (
    Actor,
    enter,
    lock,
    outbox_approval_decided,
    raise_after_commit,
    record,
)


def _lock_request(request_id: str) -> tuple[Operation, ApprovalRequest]:
    """Lock an approval request and its operation (operation first, as everywhere)."""
    request = ApprovalRequest.objects.filter(pk=request_id).only("operation_id").first()
    if request is None:
        raise errors.NotFound(f"No approval {request_id!r}.")
    op = lock(request.operation_id)
    request = ApprovalRequest.objects.select_for_update().get(pk=request_id)
    return op, request


def request_expire_locked(op: Operation, request: ApprovalRequest, *, now: datetime) -> bool:
    if not approval_services.request_expire(request=request, now=now):
        return False
    if op.status == Status.AWAITING_APPROVAL:
        enter(
            op,
            to=Status.REJECTED,
            kind="approval_expired",
            actor=Actor.system("sweep"),
            now=now,
            data={"approval": request.id},
            error_code="approval_expired",
            error_detail="Nobody decided on the approval request before it expired.",
        )
    outbox_approval_decided(op, request, now=now)
    return True


def approval_decide(
    *, request_id: str, user: Any, approve: bool, comment: str, otp_verified: bool = False
) -> Operation:
    """One person's decision on a pending request, and the transition that follows.

    Approving counts towards the quorum; the approval that meets it creates a grant and
    moves the operation to ``ready``. A rejection (with a reason) ends the operation as
    ``rejected``; the runner receives the reason. Separation of duties is checked by
    ``access.decide_refusal``, and so is the second factor: ``otp_verified`` says
    whether the person's session was verified with a one-time password, which
    ``access.decision_needs_second_factor`` may require.
    """
    result: Operation | Exception
    with transaction.atomic():
        op, request = _lock_request(request_id)
        now = timezone.now()
        if request.status == ApprovalRequest.RequestStatus.PENDING and request.expires_at <= now:
            request_expire_locked(op, request, now=now)
        try:
            decided = approval_services.decision_record(
                request=request,
                user=user,
                approve=approve,
                comment=comment,
                refusal=access.decide_refusal(
                    user=user, request=request, op=op, otp_verified=otp_verified
                ),
                now=now,
            )
        except Refusal as refusal:
            result = refusal
        else:
            actor = Actor.of_user(user)
            record(
                op,
                kind="decision",
                actor=actor,
                now=now,
                data={
                    "approval": request.id,
                    "decision": decided.decision.decision,
                    "comment": decided.decision.comment,
                    "approvals": request.decisions.filter(decision="approve").count(),
                    "approvals_required": request.approvals_required,
                },
            )
            if decided.outcome == "approved" and decided.grant is not None:
                enter(
                    op,
                    to=Status.READY,
                    kind="granted",
                    actor=actor,
                    now=now,
                    data={
                        "approval": request.id,
                        "grant": decided.grant.id,
                        "intent_hash": decided.grant.intent_hash,
                        "expires_at": decided.grant.expires_at,
                    },
                )
            elif decided.outcome == "rejected":
                enter(
                    op,
                    to=Status.REJECTED,
                    kind="rejected",
                    actor=actor,
                    now=now,
                    data={"approval": request.id, "reason": decided.decision.comment},
                    error_code="approval_rejected",
                    error_detail=decided.decision.comment,
                )
            if decided.outcome != "pending":
                outbox_approval_decided(op, request, now=now)
            result = op
    return raise_after_commit(result)


def approval_revoke(*, request_id: str, user: Any, reason: str) -> Operation:
    """Revoke a grant. Attempts already executing go on; the next claim is refused."""
    with transaction.atomic():
        op, request = _lock_request(request_id)
        access.require_revoke(user, op.tool)
        if not reason.strip():
            raise DecisionRefused("Say why the grant is revoked.")
        if request.status != ApprovalRequest.RequestStatus.APPROVED:
            raise DecisionRefused(f"This request is {request.status}; no grant to revoke.")
        now = timezone.now()
        grant = approval_services.grant_revoke(request=request, user=user, reason=reason, now=now)
        record(
            op,
            kind="grant_revoked",
            actor=Actor.of_user(user),
            now=now,
            data={"approval": request.id, "grant": grant.id, "reason": grant.revoke_reason},
        )
        outbox_approval_decided(op, request, now=now)
    return op
