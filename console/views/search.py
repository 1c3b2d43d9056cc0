"""The header search: find an operation (or a run) by any of its identifiers."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from operations import selectors

from ..middleware import AuthenticatedHttpRequest
from ..presenters import matched_in


@require_GET
@login_required
def search(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Find operations by a part of any identifier, the principal or an argument value
    (``selectors.operation_search``); one match opens it. A run id opens the run."""
    query = (request.GET.get("q") or "").strip()[:255]
    results = selectors.operation_search(user=request.user, query=query) if query else []
    run = None
    if query.startswith("run_"):
        run = selectors.runs_for_user(request.user).filter(pk=query).first()
    if len(results) == 1 and run is None:
        return redirect("console:operation", operation_id=results[0].id)
    if run is not None and not results:
        return redirect("console:run", run_id=run.id)
    rows = [{"op": op, "matched": matched_in(op, query)} for op in results]
    context = {
        "query": query,
        "results": results,
        "rows": rows,
        "run": run,
        "nav_section": "console:operations",
    }
    return render(request, "console/search.html", context)
