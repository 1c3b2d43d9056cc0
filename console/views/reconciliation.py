"""The reconciliation queue: operations whose outcome waits for a person's answer,
oldest first, in saved queues."""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from operations import access, selectors
from operations.contracts import display
from operations.machine import EffectClass

from ..evidence import code_in_words
from ..middleware import AuthenticatedHtmxRequest
from .common import count_param, partial

# The "older than" filter goes back at most a hundred years: far enough for any queue,
# and near enough that now minus that many minutes is still a date.
MAX_AGE_MINUTES = 100 * 365 * 24 * 60
# The "Why" column shows this much of a runner's detail; the operation page shows it all.
WHY_DETAIL = 80


@require_GET
@login_required
def reconciliation(request: AuthenticatedHtmxRequest) -> HttpResponse:
    queue = request.GET.get("queue") or "all"
    if queue not in selectors.SAVED_QUEUES:
        queue = "all"
    filters = {name: request.GET.get(name) or None for name in ("tool", "effect_class", "run")}
    min_age_m = count_param(request, "min_age_m", maximum=MAX_AGE_MINUTES)
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
    proposals = selectors.pending_proposals(op_ids=[op.id for op in ops])
    rows = [
        {
            "op": op,
            "since": op.status_changed_at or op.created_at,
            "stale": (now - (op.status_changed_at or op.created_at)).total_seconds() > warning,
            "proposal": proposals.get(op.id),
            "amount": display.amount(op.tool_version.contract, op.arguments),
            "why": code_in_words(op.error_code, op.error_detail, detail_limit=WHY_DETAIL),
        }
        for op in ops
    ]
    context = {
        "rows": rows,
        "queue": queue,
        # The counts the navigation shows too (selectors.nav_counts), capped alike.
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
        "max_age_m": MAX_AGE_MINUTES,
        "include_snoozed": include_snoozed,
        "tools": access.tools_for_user(request.user, [access.RECONCILE]).order_by("name"),
        "effect_classes": [cls.value for cls in EffectClass],
        "warning_minutes": warning // 60,
        "saved_views": selectors.saved_views_for(user=request.user, list_name="reconciliation"),
        "view_query": request.GET.urlencode(),
        "filtered": queue != "all" or any(filters.values()) or min_age_m or include_snoozed,
    }
    return render(request, partial(request, "console/reconciliation.html", "rows"), context)
