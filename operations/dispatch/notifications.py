"""Email to the people who may decide on a new approval request, and to those who may
confirm a proposed "did not happen" (four eyes)."""

from django.conf import settings
from django.core.mail import send_mail

from approvals.models import ApprovalRequest

from .. import access
from ..models import Resolution


def approvers_for(request: ApprovalRequest) -> list:
    barred = access.barred_user_ids(request=request, op=request.operation)
    return [
        user
        for user in access.people_holding(access.DECIDE, request.operation.tool)
        if user.email and user.pk not in barred
    ]


def approvers_notify(*, request_id: str) -> int:
    request = (
        ApprovalRequest.objects.select_related("operation", "operation__tool")
        .filter(pk=request_id, status=ApprovalRequest.RequestStatus.PENDING)
        .first()
    )
    if request is None:
        return 0  # decided or withdrawn before the mail went out
    op = request.operation
    link = f"{settings.CONSOLE_BASE_URL.rstrip('/')}/approvals/{request.id}/"
    recipients = [user.email for user in approvers_for(request)]
    if not recipients:
        return 0
    body = (
        f"{op.tool_id} ({op.effect_class}) for {op.principal} needs your decision.\n\n"
        f"Why: {request.reason}\n"
        f"Expires: {request.expires_at:%Y-%m-%d %H:%M} UTC\n\n"
        f"Review it here: {link}\n"
    )
    return send_mail(
        subject=f"[Effectgate] Approval needed: {op.tool_id} {op.id}",
        message=body,
        from_email=None,
        recipient_list=recipients,
    )


def escalation_notify(*, request_id: str) -> int:
    """Tell the escalation group's members (who may decide, not barred) that a request
    waits for them too."""
    request = (
        ApprovalRequest.objects.select_related("operation", "operation__tool", "operation__runner")
        .filter(pk=request_id, status=ApprovalRequest.RequestStatus.PENDING)
        .exclude(escalated_at=None)
        .first()
    )
    if request is None:
        return 0
    op = request.operation
    barred = access.barred_user_ids(request=request, op=op)
    recipients = [
        user.email
        for user in access.escalation_members(request)
        if user.email and user.pk not in barred
    ]
    if not recipients:
        return 0
    link = f"{settings.CONSOLE_BASE_URL.rstrip('/')}/approvals/{request.id}/"
    body = (
        f"{op.tool_id} ({op.effect_class}) for {op.principal} has waited for a decision "
        f"since {request.created_at:%Y-%m-%d %H:%M} UTC and is now offered to "
        f"{request.escalate_to}.\n\n"
        f"Why: {request.reason}\n"
        f"Expires: {request.expires_at:%Y-%m-%d %H:%M} UTC\n\n"
        f"Review it here: {link}\n"
    )
    return send_mail(
        subject=f"[Effectgate] Escalated to {request.escalate_to}: {op.tool_id} {op.id}",
        message=body,
        from_email=None,
        recipient_list=recipients,
    )


def confirmers_for(resolution: Resolution) -> list:
    """Who may confirm ``resolution``: people who may reconcile its tool, but not the one
    who proposed it."""
    return [
        user
        for user in access.people_holding(access.RECONCILE, resolution.operation.tool)
        if user.email and user.pk != resolution.declared_by_id
    ]


def confirmers_notify(*, resolution_id: str) -> int:
    resolution = (
        Resolution.objects.select_related("operation", "operation__tool", "declared_by")
        .filter(pk=resolution_id, review__isnull=True)
        .first()
    )
    if resolution is None:
        return 0  # confirmed, disputed or withdrawn before the mail went out
    op = resolution.operation
    recipients = [user.email for user in confirmers_for(resolution)]
    if not recipients:
        return 0
    link = f"{settings.CONSOLE_BASE_URL.rstrip('/')}/operations/{op.id}/"
    body = (
        f"{resolution.declared_by.get_username()} says {op.tool_id} {op.id} for "
        f"{op.principal} did not happen, and waits for a second person to confirm it.\n\n"
        f"Their evidence: {resolution.note}\n\n"
        f"Confirm or dispute it here: {link}\n"
    )
    return send_mail(
        subject=f"[Effectgate] A second person is needed: {op.tool_id} {op.id}",
        message=body,
        from_email=None,
        recipient_list=recipients,
    )
