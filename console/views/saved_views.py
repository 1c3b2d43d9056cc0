"""Saved views: a person names the current filters of a list and opens them again."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from approvals.errors import Refusal
from operations import services

from ..middleware import AuthenticatedHttpRequest

LISTS = {"operations": "console:operations", "reconciliation": "console:reconciliation"}


def _list_url(list_name: str, query: str = "") -> str:
    url = reverse(LISTS.get(list_name, "console:operations"))
    return f"{url}?{query}" if query else url


@require_POST
@login_required
def saved_view_save(request: AuthenticatedHttpRequest) -> HttpResponse:
    list_name = request.POST.get("list_name", "")
    query = request.POST.get("query", "")
    try:
        view = services.saved_view_save(
            user=request.user, list_name=list_name, name=request.POST.get("name", ""), query=query
        )
    except Refusal as refusal:
        messages.error(request, f"The view was not saved: {refusal.detail}")
        return redirect(_list_url(list_name, query))
    messages.success(request, f"Saved the view “{view.name}”.")
    return redirect(_list_url(view.list_name, view.query))


@require_POST
@login_required
def saved_view_delete(request: AuthenticatedHttpRequest, view_id: int) -> HttpResponse:
    list_name = request.POST.get("list_name", "operations")
    try:
        services.saved_view_delete(user=request.user, view_id=view_id)
    except Refusal as refusal:
        messages.error(request, refusal.detail)
    else:
        messages.success(request, "Deleted the saved view.")
    return redirect(_list_url(list_name))
