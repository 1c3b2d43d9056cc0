"""Operations: the list, one operation with its evidence and event trace, and what a
person records about it (an answer on its outcome, a note, a hand-made undo, the second
person's confirmation), redelivering its webhooks, and its evidence bundle to download."""

from datetime import date
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import DecisionRefused, Refusal
from operations import access, contracts, selectors, services
from operations.audit.evidence import evidence_bundle, evidence_json
from operations.errors import InvalidQuery, NotSealed
from operations.machine import TERMINAL, Status
from operations.models import Operation

from .. import evidence
from ..forms import ConfirmForm, NoteForm, ResolveForm
from ..middleware import AuthenticatedHtmxRequest, AuthenticatedHttpRequest
from ..pagination import keyset_page
from ..presenters import argument_rows
from .common import count_param, found, partial, text_param

# The largest tree size a witness's checkpoint can name (the API's bound).
MAX_TREE_SIZE = 2**53 - 1


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
    template = partial(request, "console/operation.html", "live")
    if template.endswith("#live"):
        # The polled status region only: what changed, and who did it.
        return render(request, template, _live(op))
    return _detail_page(request, op)


def _live(op: Operation) -> dict[str, Any]:
    return {
        "op": op,
        "last_event": selectors.operation_last_event(op),
        "live_polling": op.status not in TERMINAL or op.status == Status.CANCELLED,
        "now": timezone.now(),
    }


def _lookup_request(op: Operation, contract: dict[str, Any]) -> str:
    """What each automatic lookup of ``op`` asks: a function of its frozen contract and
    its ids, so it is the same for every probe (docs/api.md, Lookup URLs)."""
    if contract["reconcile"]["mode"] != "lookup":
        return ""
    try:
        url = contracts.lookup_url(
            contract["reconcile"]["url"], idempotency_key=op.idempotency_key, operation_id=op.id
        )
    except ValueError as exc:
        return f"none: the lookup URL template cannot be filled ({exc})"
    return f"GET {url}"


def _detail_page(
    request: AuthenticatedHttpRequest,
    op: Operation,
    *,
    resolve_form: ResolveForm | None = None,
    confirm_form: ConfirmForm | None = None,
    error: str = "",
    status: int = 200,
) -> HttpResponse:
    """The operation's page; after a refused answer, with the form as it was sent and
    ``error`` beside it."""
    trace = selectors.operation_trace(op)
    contract = op.tool_version.contract
    lookup_request = _lookup_request(op, contract)
    resolved = evidence.attempt_resolutions(trace["events"])
    may_reconcile = access.may_reconcile(request.user, op.tool)
    resolving = may_reconcile and op.status == Status.OUTCOME_UNKNOWN
    proposal = next((r for r in trace["resolutions"] if r.status == "pending"), None)
    # The error goes beside the form it is about while the page still shows that form;
    # when the operation has moved on (someone answered first), at the top.
    confirmable = proposal is not None and proposal.declared_by_id != request.user.pk
    resolve_error = error if resolve_form is not None and resolving else ""
    confirm_error = error if confirm_form is not None and resolving and confirmable else ""
    if error and not (resolve_error or confirm_error):
        messages.error(request, error)
    context = {
        "run": op.run,
        "contract": contract,
        "argument_rows": argument_rows(op.tool_version.contract, op.arguments),
        "may_reconcile": may_reconcile,
        "resolving": resolving,
        "resolve_error": resolve_error,
        "confirm_error": confirm_error,
        "may_redeliver": access.may_redeliver(request.user, op),
        "resolve_form": resolve_form or ResolveForm(),
        "confirm_form": confirm_form or ConfirmForm(),
        "note_form": NoteForm(),
        "console_link": contracts.console_link(
            contract, idempotency_key=op.idempotency_key, downstream_id=op.downstream_id
        ),
        "answers": [
            evidence.answer_card(event, lookup_request=lookup_request) for event in trace["probes"]
        ],
        "attempt_rows": [
            {"attempt": attempt, "resolved": resolved.get(attempt.number)}
            for attempt in trace["attempts"]
        ],
        "proposal": proposal,
        **_live(op),
        **trace,
    }
    return render(request, "console/operation.html", context, status=status)


@require_GET
@login_required
def operation_evidence(request: AuthenticatedHttpRequest, operation_id: str) -> HttpResponse:
    """The operation's evidence bundle as a file (docs/security.md, Evidence bundles), for
    whoever may see the operation; with ``witness_size``, the consistency proof from a
    checkpoint of that size that the person kept. Until the sealer has covered every
    event, the page says so instead."""
    op = found(selectors.operation_get_for_user, user=request.user, operation_id=operation_id)
    size = count_param(request, "witness_size", maximum=MAX_TREE_SIZE)
    try:
        bundle = evidence_bundle(operation=op, witness_sizes=[] if size is None else [size])
    except (NotSealed, InvalidQuery) as refusal:
        messages.error(request, f"No evidence bundle yet. {refusal.detail}")
        return _back(op.id)
    response = HttpResponse(evidence_json(bundle), content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{op.id}-evidence.json"'
    return response


def _back(op_id: str) -> HttpResponse:
    return redirect("console:operation", operation_id=op_id)


@require_POST
@login_required
def operation_resolve(request: AuthenticatedHttpRequest, operation_id: str) -> HttpResponse:
    """A person's answer. A refused one shows the page again with the answer as it was
    chosen and typed, so that nothing needs choosing or typing twice."""
    op = found(selectors.operation_get_for_user, user=request.user, operation_id=operation_id)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        error = " ".join(str(error) for errors in form.errors.values() for error in errors)
        return _detail_page(request, op, resolve_form=form, error=error, status=400)
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
        op = found(selectors.operation_get_for_user, user=request.user, operation_id=op.id)
        return _detail_page(request, op, resolve_form=form, error=refusal.detail, status=400)
    if data["result"] == "not_found" and op.status == "outcome_unknown":
        said = "Recorded. A second person must confirm that it did not happen."
    else:
        said = f"Recorded. The operation is {op.status}."
    # As after an approval: the next unknown outcome opens, not the top of the queue.
    following = _next_unknown(request, after=op.id)
    if following is None:
        messages.success(request, said)
        return _back(op.id)
    messages.success(request, f"{said} The next unknown outcome in the queue is open.")
    return redirect("console:operation", operation_id=following)


def _next_unknown(request: AuthenticatedHttpRequest, *, after: str) -> str | None:
    """The oldest other unknown outcome of the reconciliation queue that this person can
    answer now (not one whose "did not happen" proposal waits for a second person)."""
    candidates = list(
        selectors.reconciliation_queue(user=request.user)
        .filter(status=Status.OUTCOME_UNKNOWN)
        .exclude(pk=after)
        .values_list("id", flat=True)[:50]
    )
    waiting = selectors.pending_proposals(op_ids=candidates)
    return next((op_id for op_id in candidates if op_id not in waiting), None)


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
        return _detail_page(
            request, op, confirm_form=form, error="Choose confirm or dispute.", status=400
        )
    try:
        op = services.operation_resolution_confirm(
            resolution_id=resolution_id,
            user=request.user,
            confirm=form.cleaned_data["decision"] == "confirm",
            note=form.cleaned_data["note"],
        )
    except Refusal as refusal:
        op = found(selectors.operation_get_for_user, user=request.user, operation_id=op.id)
        return _detail_page(request, op, confirm_form=form, error=refusal.detail, status=400)
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
