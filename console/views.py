"""The browser console: function views that parse, call one service and render.

Every action is a plain form POST answered with a redirect, so it works without
JavaScript; htmx only refreshes parts of pages (``template#partial``).
"""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import DecisionRefused, Refusal
from approvals.models import ApprovalRequest
from operations import access, selectors, services
from operations.canonical import canonical_json
from operations.machine import EffectClass

from .forms import ConfirmForm, DecisionForm, NoteForm, ResolveForm, RevokeForm
from .pages.common import found, partial
from .presenters import changes, flatten


@require_GET
@login_required
def inbox(request: HttpRequest) -> HttpResponse:
    filters = {name: request.GET.get(name) or None for name in ("tool", "effect_class", "run")}
    pending = list(selectors.requests_pending_for_user(user=request.user, **filters)[:200])
    now = timezone.now()
    rows = [
        {
            "request": item,
            "op": item.operation,
            "approvals": sum(1 for d in item.decisions.all() if d.decision == "approve"),
            "urgent": (item.expires_at - now).total_seconds() < 3600,
        }
        for item in pending
    ]
    context = {
        "rows": rows,
        "filters": filters,
        "tools": access.tools_for_user(request.user, [access.DECIDE]).order_by("name"),
        "effect_classes": [cls.value for cls in EffectClass],
        "now": now,
    }
    return render(request, partial(request, "console/inbox.html", "rows"), context)


def _intent_document(op) -> str:
    return canonical_json(
        {"tool": op.tool_id, "arguments": op.arguments, "principal": op.principal}
    ).decode()


@require_GET
@login_required
def approval_detail(request: HttpRequest, approval_id: str) -> HttpResponse:
    approval = found(selectors.approval_get_for_user, user=request.user, approval_id=approval_id)
    op = approval.operation
    now = timezone.now()
    pending = approval.status == ApprovalRequest.RequestStatus.PENDING
    refusal = (
        access.decide_refusal(
            user=request.user,
            request=approval,
            op=op,
            otp_verified=request.user.is_verified(),
        )
        if pending
        else None
    )
    comparison = selectors.approval_comparison(approval)
    compared = None
    if comparison is not None:
        label, other = comparison
        compared = {
            "label": label,
            "operation": other,
            "changes": changes(other.arguments, op.arguments),
            "principal_changed": other.principal != op.principal,
        }
    decisions = list(approval.decisions.all())
    grant = getattr(approval, "grant", None)
    context = {
        "approval": approval,
        "op": op,
        "run": op.run,
        "contract": op.tool_version.contract,
        "arguments": flatten(op.arguments).items(),
        "canonical_arguments": canonical_json(op.arguments).decode(),
        "intent_document": _intent_document(op),
        "decisions": decisions,
        "approvals": sum(1 for d in decisions if d.decision == "approve"),
        "grant": grant,
        "grant_active": grant is not None and grant.revoked_at is None and grant.expires_at > now,
        "pending": pending,
        "refusal": refusal,
        # The one refusal the person can lift here: offer the way to verify the session.
        "verify_second_factor": refusal == access.SECOND_FACTOR_REFUSAL,
        "compared": compared,
        "form": DecisionForm(),
        "revoke_form": RevokeForm(),
        "now": now,
    }
    return render(request, "console/approval.html", context)


@require_POST
@login_required
def approval_decide(request: HttpRequest, approval_id: str) -> HttpResponse:
    approval = found(selectors.approval_get_for_user, user=request.user, approval_id=approval_id)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose approve or reject.")
        return redirect("console:approval", approval_id=approval.id)
    approve = form.cleaned_data["decision"] == "approve"
    try:
        op = services.approval_decide(
            request_id=approval.id,
            user=request.user,
            approve=approve,
            comment=form.cleaned_data["comment"],
            otp_verified=request.user.is_verified(),
        )
    except Refusal as refusal:
        messages.error(request, refusal.detail)
        return redirect("console:approval", approval_id=approval.id)
    verb = "Approved" if approve else "Rejected"
    messages.success(request, f"{verb} {op.tool_id} {op.id}; the operation is now {op.status}.")
    return redirect("console:inbox")


@require_POST
@login_required
def approval_revoke(request: HttpRequest, approval_id: str) -> HttpResponse:
    approval = found(selectors.approval_get_for_user, user=request.user, approval_id=approval_id)
    form = RevokeForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Say why the grant is revoked.")
        return redirect("console:approval", approval_id=approval.id)
    try:
        services.approval_revoke(
            request_id=approval.id, user=request.user, reason=form.cleaned_data["reason"]
        )
    except Refusal as refusal:
        messages.error(request, refusal.detail)
    else:
        messages.success(request, "Grant revoked: the next claim will ask for a new approval.")
    return redirect("console:approval", approval_id=approval.id)


# --- reconciliation -------------------------------------------------------------------


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


@require_GET
@login_required
def reconciliation(request: HttpRequest) -> HttpResponse:
    queue = request.GET.get("queue") or "all"
    if queue not in selectors.SAVED_QUEUES:
        queue = "all"
    filters = {name: request.GET.get(name) or None for name in ("tool", "effect_class", "run")}
    min_age_m = _int_or_none(request.GET.get("min_age_m"))
    include_snoozed = request.GET.get("snoozed") == "1"
    now = timezone.now()
    ops = list(
        selectors.reconciliation_queue(
            user=request.user,
            queue=queue,
            min_age_s=min_age_m * 60 if min_age_m else None,
            include_snoozed=include_snoozed,
            now=now,
            **filters,
        )[:200]
    )
    warning = settings.RECONCILE_AGE_WARNING_S
    rows = [
        {
            "op": op,
            "since": op.status_changed_at or op.created_at,
            "stale": (now - (op.status_changed_at or op.created_at)).total_seconds() > warning,
        }
        for op in ops
    ]
    context = {
        "rows": rows,
        "queue": queue,
        "queues": [
            (name, label, count)
            for (name, label), count in zip(
                selectors.SAVED_QUEUES.items(),
                selectors.reconciliation_counts(user=request.user, now=now).values(),
                strict=True,
            )
        ],
        "filters": filters,
        "min_age_m": min_age_m,
        "include_snoozed": include_snoozed,
        "tools": access.tools_for_user(request.user, [access.RECONCILE]).order_by("name"),
        "effect_classes": [cls.value for cls in EffectClass],
        "warning_minutes": warning // 60,
    }
    return render(request, partial(request, "console/reconciliation.html", "rows"), context)


@require_GET
@login_required
def operation_detail(request: HttpRequest, operation_id: str) -> HttpResponse:
    op = found(selectors.operation_get_for_user, user=request.user, operation_id=operation_id)
    trace = selectors.operation_trace(op)
    may_reconcile = access.may_reconcile(request.user, op.tool)
    context = {
        "op": op,
        "run": op.run,
        "contract": op.tool_version.contract,
        "arguments": [(path, value) for path, value in flatten(op.arguments).items()],
        "may_reconcile": may_reconcile,
        "resolve_form": ResolveForm(),
        "note_form": NoteForm(),
        "now": timezone.now(),
        **trace,
    }
    return render(request, "console/operation.html", context)


def _back(op_id: str) -> HttpResponse:
    return redirect("console:operation", operation_id=op_id)


@require_POST
@login_required
def operation_resolve(request: HttpRequest, operation_id: str) -> HttpResponse:
    op = found(selectors.operation_get_for_user, user=request.user, operation_id=operation_id)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            messages.error(request, " ".join(errors))
        return _back(op.id)
    data = form.cleaned_data
    try:
        op = services.operation_resolve(
            operation=op,
            user=request.user,
            result=data["result"],
            downstream_id=data["downstream_id"],
            note=data["note"],
            snooze_until=data["snooze_until"],
        )
    except Refusal as refusal:
        messages.error(request, refusal.detail)
        return _back(op.id)
    if data["result"] == "not_found" and op.status == "outcome_unknown":
        messages.success(request, "Recorded. A second person must confirm that it did not happen.")
    else:
        messages.success(request, f"Recorded. The operation is {op.status}.")
    return _back(op.id)


@require_POST
@login_required
def operation_note(request: HttpRequest, operation_id: str) -> HttpResponse:
    op = found(selectors.operation_get_for_user, user=request.user, operation_id=operation_id)
    form = NoteForm(request.POST)
    try:
        if not form.is_valid():
            raise DecisionRefused("The note is empty.")
        services.operation_note_add(operation=op, user=request.user, note=form.cleaned_data["note"])
    except Refusal as refusal:
        messages.error(request, refusal.detail)
    else:
        messages.success(request, "Note added.")
    return _back(op.id)


@require_POST
@login_required
def operation_compensated(request: HttpRequest, operation_id: str) -> HttpResponse:
    op = found(selectors.operation_get_for_user, user=request.user, operation_id=operation_id)
    form = NoteForm(request.POST)
    try:
        if not form.is_valid():
            raise DecisionRefused("Say how the undo was done.")
        op = services.operation_compensated_by_hand(
            operation=op, user=request.user, note=form.cleaned_data["note"]
        )
    except Refusal as refusal:
        messages.error(request, refusal.detail)
    else:
        messages.success(request, f"Recorded. The operation is {op.status}.")
    return _back(op.id)


@require_POST
@login_required
def resolution_confirm(request: HttpRequest, operation_id: str, resolution_id: str) -> HttpResponse:
    op = found(selectors.operation_get_for_user, user=request.user, operation_id=operation_id)
    form = ConfirmForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose confirm or dispute.")
        return _back(op.id)
    try:
        op = services.operation_resolution_confirm(
            resolution_id=resolution_id,
            user=request.user,
            confirm=form.cleaned_data["decision"] == "confirm",
            note=form.cleaned_data["note"],
        )
    except Refusal as refusal:
        messages.error(request, refusal.detail)
    else:
        messages.success(request, f"Recorded. The operation is {op.status}.")
    return _back(op.id)


@require_POST
@login_required
def webhook_redeliver(request: HttpRequest, message_id: str) -> HttpResponse:
    message = found(selectors.outbox_message_get_for_user, user=request.user, message_id=message_id)
    try:
        services.webhook_redeliver(message=message, user=request.user)
    except Refusal as refusal:
        messages.error(request, refusal.detail)
    else:
        messages.success(request, f"Webhook {message.id} will be delivered again shortly.")
    return _back(message.operation_id)
