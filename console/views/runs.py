"""Runs: the list, one run with its budgets and operations, and cancel."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from operations import access, selectors, services
from operations.models import Run

from ..charts import Bar, bar, duration_text, money_text
from ..middleware import AuthenticatedHttpRequest
from ..pagination import keyset_page
from .common import found, text_param


def budgets(run: Run, now) -> list[Bar]:
    """What the run has used of each budget, as bars (text values included)."""
    elapsed = (run.ended_at or now) - run.created_at
    return [
        bar(
            "Tool calls",
            run.tool_calls,
            run.max_tool_calls,
            str(run.tool_calls),
            str(run.max_tool_calls),
        ),
        bar("Turns", run.turns, run.max_turns, str(run.turns), str(run.max_turns)),
        bar(
            "Time",
            elapsed.total_seconds(),
            run.deadline_s,
            duration_text(elapsed),
            duration_text(run.deadline_s),
        ),
        bar(
            "Spend",
            float(run.spend),
            float(run.max_spend) if run.max_spend is not None else None,
            money_text(run.spend),
            money_text(run.max_spend),
        ),
    ]


@require_GET
@login_required
def runs_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    status = text_param(request, "status")
    if status not in Run.RunStatus.values:
        status = None
    principal = text_param(request, "principal")
    queryset = selectors.runs_for_user(request.user).select_related("runner")
    if status:
        queryset = queryset.filter(status=status)
    if principal:
        queryset = queryset.filter(principal=principal)
    page = keyset_page(request, queryset)
    now = timezone.now()
    context = {
        "page": page,
        "rows": [{"run": run, "budgets": budgets(run, now)} for run in page.items],
        "filters": {"status": status, "principal": principal},
        "statuses": Run.RunStatus.values,
    }
    return render(request, "console/runs.html", context)


def _run_page(request: AuthenticatedHttpRequest, run: Run, *, status: int = 200) -> HttpResponse:
    operations = selectors.operations_list_for_user(user=request.user, run=run.id)
    context = {
        "run": run,
        "budgets": budgets(run, timezone.now()),
        "page": keyset_page(request, operations),
        "events": selectors.run_events(run),
        "may_cancel": access.may_cancel_run(request.user),
        "nav_section": "console:runs",
    }
    return render(request, "console/run.html", context, status=status)


@require_GET
@login_required
def run_detail(request: AuthenticatedHttpRequest, run_id: str) -> HttpResponse:
    run = found(selectors.run_get_for_user, user=request.user, run_id=run_id)
    return _run_page(request, run)


@require_POST
@login_required
def run_cancel(request: AuthenticatedHttpRequest, run_id: str) -> HttpResponse:
    run = found(selectors.run_get_for_user, user=request.user, run_id=run_id)
    if not access.may_cancel_run(request.user):
        messages.error(request, "You may not cancel runs.")
        return _run_page(request, run, status=403)
    if run.status != Run.RunStatus.ACTIVE:
        messages.info(request, f"Run {run.id} is already {run.status}.")
        return redirect("console:run", run_id=run.id)
    run = services.run_cancel(run=run, actor=services.Actor.of_user(request.user))
    messages.success(
        request,
        f"Run {run.id} cancelled: its waiting operations are cancelled; executing ones "
        "finish, and unknown outcomes still need an answer.",
    )
    return redirect("console:run", run_id=run.id)
