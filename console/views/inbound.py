"""Inbound provider events: what providers reported, matched or not."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from operations import access, selectors
from operations.models import InboundEvent

from ..middleware import AuthenticatedHttpRequest
from .common import text_param


@require_GET
@login_required
def inbound_events(request: AuthenticatedHttpRequest) -> HttpResponse:
    status = text_param(request, "status")
    if status not in InboundEvent.InboundStatus.values:
        status = None
    tool = text_param(request, "tool")
    events = selectors.inbound_events_for_user(user=request.user, status=status, tool=tool)
    context = {
        "events": list(events[:200]),
        "status": status,
        "statuses": InboundEvent.InboundStatus.values,
        "tool": tool,
        "tools": access.tools_for_user(request.user).order_by("name"),
    }
    return render(request, "console/inbound.html", context)
