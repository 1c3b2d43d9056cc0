"""The inbox: the approval requests a person may decide on, most urgent first."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from operations import access, selectors
from operations.contracts import explain
from operations.machine import EffectClass

from ..middleware import AuthenticatedHtmxRequest
from .common import KEPT_TICKS, partial


@require_GET
@login_required
def inbox(request: AuthenticatedHtmxRequest) -> HttpResponse:
    if not request.htmx and selectors.lands_on_queue(request.user):
        return redirect("console:reconciliation")
    filters = {name: request.GET.get(name) or None for name in ("tool", "effect_class", "run")}
    pending = list(selectors.requests_pending_for_user(user=request.user, **filters)[:200])
    now = timezone.now()
    # Ticks a refused bulk action kept (approvals_decide_many): "request id:intent hash",
    # re-ticked once, by the next full page, and only while the request still shows
    # that intent. Polling leaves them for the page (console.js keeps ticks itself).
    kept = set() if request.htmx else set(request.session.pop(KEPT_TICKS, [])[:200])
    rows = []
    for item in pending:
        op = item.operation
        contract = op.tool_version.contract
        context = item.context if isinstance(item.context, dict) else {}
        rows.append(
            {
                "request": item,
                "op": op,
                "approvals": sum(1 for d in item.decisions.all() if d.decision == "approve"),
                "urgent": (item.expires_at - now).total_seconds() < 3600,
                "reasons": explain.reasons_in_words(
                    contract, context, arguments=op.arguments, tool=op.tool_id
                ),
                "runner_reason": explain.runner_reason(context, contract, op.arguments),
                "ticked": f"{item.id}:{item.intent_hash}" in kept,
            }
        )
    context = {
        "rows": rows,
        "filters": filters,
        "tools": access.tools_for_user(request.user, [access.DECIDE]).order_by("name"),
        "effect_classes": [cls.value for cls in EffectClass],
        "now": now,
    }
    return render(request, partial(request, "console/inbox.html", "rows"), context)
