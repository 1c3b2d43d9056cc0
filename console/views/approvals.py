"""One approval request: the intent as approvers see it, what changed since the last
decision on the same call, deciding, and revoking the grant."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import Refusal
from approvals.models import ApprovalRequest
from approvals.standing import PIN_OPERATORS
from operations import access, selectors, services
from operations.canonical import canonical_json
from operations.errors import NotFound

from .. import security
from ..forms import (
    DecisionForm,
    RevokeForm,
    editable_fields,
    parse_edits,
    parse_standing_terms,
    standing_form_initial,
)
from ..middleware import AuthenticatedHtmxRequest, AuthenticatedHttpRequest
from ..presenters import argument_rows, changes_described
from .common import KEPT_TICKS, found, partial


def _intent_document(op) -> str:
    return canonical_json(
        {"tool": op.tool_id, "arguments": op.arguments, "principal": op.principal}
    ).decode()


@require_GET
@login_required
def approval_detail(request: AuthenticatedHtmxRequest, approval_id: str) -> HttpResponse:
    approval = found(selectors.approval_get_for_user, user=request.user, approval_id=approval_id)
    op = approval.operation
    now = timezone.now()
    pending = approval.status == ApprovalRequest.RequestStatus.PENDING
    refusal = (
        access.decide_refusal(
            user=request.user,
            request=approval,
            op=op,
            otp_verified=security.session_verified(request),
        )
        if pending
        else None
    )
    comparison = selectors.approval_comparison(approval)
    compared = None
    if comparison is not None and not (
        # Someone who decides only by escalation sees no other operation of the tool.
        selectors.operations_visible_to(request.user).filter(pk=comparison[1].pk).exists()
    ):
        comparison = None
    if comparison is not None:
        label, other = comparison
        compared = {
            "label": label,
            "operation": other,
            "changes": changes_described(op.tool_version.contract, other.arguments, op.arguments),
            "principal_changed": other.principal != op.principal,
        }
    decisions = list(approval.decisions.all())
    grant = getattr(approval, "grant", None)
    # "Approve this and the next N like it": offered to whoever may both decide here and
    # sign a standing grant for the operation's tool and principal.
    standing_form = None
    if pending and refusal is None:
        standing_refusal = access.standing_sign_refusal(
            user=request.user,
            tool=op.tool,
            principal=op.principal,
            run=None,
            otp_verified=security.session_verified(request),
        )
        if standing_refusal is None:
            standing_form = standing_form_initial(
                op=op, approvals_required=approval.approvals_required
            )
    contract = op.tool_version.contract
    context = {
        "approval": approval,
        "op": op,
        "run": op.run,
        "brief": selectors.approval_brief(request=approval, user=request.user),
        "argument_rows": argument_rows(contract, op.arguments),
        "contract": contract,
        "canonical_arguments": canonical_json(op.arguments).decode(),
        "intent_document": _intent_document(op),
        "decisions": decisions,
        "approvals": sum(1 for d in decisions if d.decision == "approve"),
        "grant": grant,
        "grant_active": grant is not None and grant.revoked_at is None and grant.expires_at > now,
        "pending": pending,
        "refusal": refusal,
        "may_revoke": access.may_revoke(request.user, op.tool),
        # The one refusal the person can lift here: offer the way to verify the session.
        "verify_second_factor": refusal == access.SECOND_FACTOR_REFUSAL,
        "compared": compared,
        "form": DecisionForm(),
        "editable": editable_fields(op) if pending and refusal is None else [],
        "revoke_form": RevokeForm(),
        "standing_form": standing_form,
        "operators": PIN_OPERATORS,
        "standing_grant": grant.standing_grant if grant is not None else None,
        "now": now,
    }
    return render(request, partial(request, "console/approval.html", "live"), context)


@require_POST
@login_required
def approval_approve_and_issue(request: AuthenticatedHttpRequest, approval_id: str) -> HttpResponse:
    """Approve this request and issue a standing grant for the next ones like it, in one
    step (``services.approval_approve_and_issue``): both or neither."""
    approval = found(selectors.approval_get_for_user, user=request.user, approval_id=approval_id)
    op = approval.operation
    try:
        terms = parse_standing_terms(request.POST, tool=op.tool_id, now=timezone.now())
        op, grant = services.approval_approve_and_issue(
            request_id=approval.id,
            user=request.user,
            comment=request.POST.get("comment", ""),
            terms=terms,
            otp_verified=security.session_verified(request),
        )
    except ValueError as exc:
        messages.error(request, f"Nothing was decided. {exc}")
        return redirect("console:approval", approval_id=approval.id)
    except Refusal as refusal:
        messages.error(request, f"Nothing was decided. {refusal.detail}")
        return redirect("console:approval", approval_id=approval.id)
    state = (
        "active"
        if grant.status == grant.GrantStatus.ACTIVE
        else "proposed until more people sign it"
    )
    messages.success(
        request,
        f"Approved {op.tool_id} {op.id} (it is {op.status}); standing grant {grant.id} for the "
        f"next {grant.max_uses} like it is {state}.",
    )
    return redirect("console:standing-grant", grant_id=grant.id)


@require_POST
@login_required
def approval_decide(request: AuthenticatedHttpRequest, approval_id: str) -> HttpResponse:
    approval = found(selectors.approval_get_for_user, user=request.user, approval_id=approval_id)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose approve or reject.")
        return redirect("console:approval", approval_id=approval.id)
    approve = form.cleaned_data["decision"] == "approve"
    try:
        edits = parse_edits(approval.operation, request.POST) if approve else {}
    except ValueError as exc:
        messages.error(request, f"Nothing was decided. {exc}")
        return redirect("console:approval", approval_id=approval.id)
    try:
        op = services.approval_decide(
            request_id=approval.id,
            user=request.user,
            approve=approve,
            comment=form.cleaned_data["comment"],
            otp_verified=security.session_verified(request),
            edits=edits,
        )
    except Refusal as refusal:
        errors = "; ".join(
            f"{e['path'].removeprefix('/arguments')}: {e['message']}"
            for e in refusal.extra.get("errors", [])
        )
        messages.error(request, f"Nothing was decided. {refusal.detail} {errors}".strip())
        return redirect("console:approval", approval_id=approval.id)
    if op.id != approval.operation_id:
        messages.success(
            request,
            f"Approved {op.tool_id} with your changes as {op.id} (the original is superseded); "
            f"it is now {op.status}.",
        )
    else:
        verb = "Approved" if approve else "Rejected"
        messages.success(request, f"{verb} {op.tool_id} {op.id}; the operation is now {op.status}.")
    following = _next_for(request, after=approval.id)
    if following is not None:
        return redirect("console:approval", approval_id=following)
    return redirect("console:inbox")


def _next_for(request: AuthenticatedHttpRequest, *, after: str) -> str | None:
    """The next request in inbox order that this person may decide now, if any: after a
    decision the reviewer goes on to it instead of back to the top of the inbox."""
    verified = security.session_verified(request)
    person = request.user
    candidates = (
        selectors.requests_pending_for_user(user=person)
        .filter(expires_at__gt=timezone.now())
        .exclude(pk=after)
        .exclude(decisions__user=person)
        .select_related("operation__tool", "operation__runner")[:50]
    )
    for item in candidates:
        refusal = access.decide_refusal(
            user=request.user, request=item, op=item.operation, otp_verified=verified
        )
        if refusal is None:
            return item.id
    return None


@require_POST
@login_required
def approval_revoke(request: AuthenticatedHttpRequest, approval_id: str) -> HttpResponse:
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


def _request_id(value: str) -> str:
    return value.partition(":")[0]


def _inbox_keeping(request: AuthenticatedHttpRequest, selected: list[str]) -> HttpResponse:
    """Back to the inbox with the ticks that were not decided still ticked: a refused
    bulk action loses nothing the person chose. Kept in the session, not the link, so
    that no link can arrive with requests ticked (console/views/inbox.py)."""
    request.session[KEPT_TICKS] = list(dict.fromkeys(selected))[:200]
    return redirect("console:inbox")


@require_POST
@login_required
def approvals_decide_many(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Approve or reject the requests selected in the inbox, each as if decided on its
    own page (quorum, separation of duties, permissions: the same service), and each
    only if it is still the intent the inbox showed (``request`` values carry the
    intent hash). What changed or was refused is listed with why; the rest go through."""
    form = DecisionForm(request.POST)
    selected = request.POST.getlist("request")
    if not form.is_valid() or not selected:
        messages.error(request, "Select the requests, then choose approve or reject.")
        return _inbox_keeping(request, selected)
    approve = form.cleaned_data["decision"] == "approve"
    comment = form.cleaned_data["comment"]
    if not approve and not comment.strip():
        messages.error(request, "Write why, to reject: the runners receive the reason.")
        return _inbox_keeping(request, selected)
    verified = security.session_verified(request)
    done: list[str] = []
    decided: set[str] = set()
    refused: list[str] = []
    for value in dict.fromkeys(selected):
        approval_id, _, shown = value.partition(":")
        try:
            approval = selectors.approval_get_for_user(user=request.user, approval_id=approval_id)
        except NotFound:
            refused.append(f"{approval_id}: not found")
            continue
        op = approval.operation
        if approval.status != ApprovalRequest.RequestStatus.PENDING:
            refused.append(f"{op.id}: already {approval.status}")
            continue
        if approval.intent_hash != shown:
            refused.append(f"{op.id}: its intent is not the one the inbox showed")
            continue
        try:
            services.approval_decide(
                request_id=approval.id,
                user=request.user,
                approve=approve,
                comment=comment,
                otp_verified=verified,
            )
        except Refusal as refusal:
            refused.append(f"{op.id}: {refusal.detail}")
        else:
            done.append(op.id)
            decided.add(approval.id)
    verb = "Approved" if approve else "Rejected"
    if done:
        messages.success(request, f"{verb} {len(done)}: {', '.join(done)}.")
    for line in refused:
        messages.error(request, f"Not decided, {line}")
    return _inbox_keeping(
        request, [value for value in selected if _request_id(value) not in decided]
    )
