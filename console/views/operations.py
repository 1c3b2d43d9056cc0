"""Operations: the list, one operation with its evidence and event trace, and what a
person records about it (an answer on its outcome, a note, a hand-made undo, the second
person's confirmation), and redelivering its webhooks."""

from datetime import date
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import DecisionRefused, Refusal
from operations import access, selectors, services
from operations.machine import TERMINAL, Status

from ..forms import ConfirmForm, NoteForm, ResolveForm
from ..middleware import AuthenticatedHtmxRequest, AuthenticatedHttpRequest
from ..pagination import keyset_page
from ..presenters import flatten
from .common import found, partial, text_param


@require_GET
@login_required
def operations_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    filters: dict[str, Any] = {
        name: text_param(request, name) for name in ("status", "tool", "run", "q", "principal")
    }
    if filters["status"] not in {s.value for s in Status}:
        filters["status"] = None
    days = {}
    for name in ("since", "until"):
        raw = text_param(request, name, max_length=10)
        try:
            days[name] = date.fromisoformat(raw) if raw else None
        except ValueError:
            messages.error(request, f"{raw!r} is not a date (YYYY-MM-DD); it was left out.")
            days[name] = None
    queryset = selectors.operations_list_for_user(
        user=request.user, **filters, since=days["since"], until=days["until"]
    )
    filters.update({name: value.isoformat() if value else None for name, value in days.items()})
    context = {
        "page": keyset_page(request, queryset),
        "filters": filters,
        "filtered": any(filters.values()),
        "saved_views": selectors.saved_views_for(user=request.user, list_name="operations"),
        "view_query": request.GET.urlencode(),
        "statuses": [s.value for s in Status],
        "tools": access.tools_for_user(request.user).order_by("name"),
        "nav_section": "console:operations",
    }
    return render(request, "console/operations.html", context)


@require_GET
@login_required
def operation_detail(request: AuthenticatedHtmxRequest, operation_id: str) -> HttpResponse:
    op = found(selectors.operation_get_for_user, user=request.user, operation_id=operation_id)
    live = {
        "op": op,
        "last_event": selectors.operation_last_event(op),
        "live_polling": op.status not in TERMINAL or op.status == Status.CANCELLED,
        "now": timezone.now(),
    }
    template = partial(request, "console/operation.html", "live")
    if template.endswith("#live"):
        # The polled status region only: what changed, and who did it.
        return render(request, template, live)
    trace = selectors.operation_trace(op)
    may_reconcile = access.may_reconcile(request.user, op.tool)
    context = {
        "op": op,
        "run": op.run,
        "contract": op.tool_version.contract,
        "arguments": [(path, value) for path, value in flatten(op.arguments).items()],
        "may_reconcile": may_reconcile,
        "may_redeliver": access.may_redeliver(request.user, op),
        "resolve_form": ResolveForm(),
        "note_form": NoteForm(),
        **live,
        **trace,
    }
    return render(request, template, context)


def _back(op_id: str) -> HttpResponse:
    return redirect("console:operation", operation_id=op_id)


@require_POST
@login_required
def operation_resolve(request: AuthenticatedHttpRequest, operation_id: str) -> HttpResponse:
    op = found(selectors.operation_get_for_user, user=request.user, operation_id=operation_id)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            messages.error(request, " ".join(str(error) for error in errors))
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
def operation_note(request: AuthenticatedHttpRequest, operation_id: str) -> HttpResponse:
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
def operation_compensated(request: AuthenticatedHttpRequest, operation_id: str) -> HttpResponse:
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
def resolution_confirm(
    request: AuthenticatedHttpRequest, operation_id: str, resolution_id: str
) -> HttpResponse:
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
def webhook_redeliver(request: AuthenticatedHttpRequest, message_id: str) -> HttpResponse:
    message = found(selectors.outbox_message_get_for_user, user=request.user, message_id=message_id)
    try:
        services.webhook_redeliver(message=message, user=request.user)
    except Refusal as refusal:
        messages.error(request, refusal.detail)
    else:
        messages.success(request, f"Webhook {message.id} will be delivered again shortly.")
    return _back(message.operation_id)
