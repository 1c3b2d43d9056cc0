"""The header search: find an operation (or a run) by any of its identifiers."""

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from operations import selectors


@require_GET
@login_required
def search(request: HttpRequest) -> HttpResponse:
    """Find an operation by an exact id, operation key, idempotency key, call id or
    downstream reference; one match opens it. A run id opens the run."""
    query = (request.GET.get("q") or "").strip()[:255]
    results = selectors.operation_search(user=request.user, query=query) if query else []
    run = None
    if query.startswith("run_"):
        run = selectors.runs_for_user(request.user).filter(pk=query).first()
    if len(results) == 1 and run is None:
        return redirect("console:operation", operation_id=results[0].id)
    if run is not None and not results:
        return redirect("console:run", run_id=run.id)
    context = {"query": query, "results": results, "run": run, "nav_section": "console:operations"}
    return render(request, "console/search.html", context)
