"""Groups: who is in each, which tools it decides, and the Slack channel its approval
requests are posted to (docs/notifications.md). Seen and changed by people who may
manage tools' permissions (``access.may_manage_tool_permissions``)."""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from operations import access
from operations.selectors import notices

from ..middleware import AuthenticatedHttpRequest
from .common import route_save


def _require(request: AuthenticatedHttpRequest) -> None:
    if not access.may_manage_tool_permissions(request.user):
        raise PermissionDenied("Only people who manage tools' permissions see groups here.")


@require_GET
@login_required
def groups_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    _require(request)
    return render(
        request,
        "console/groups.html",
        {
            "rows": notices.group_rows(),
            "slack_on": bool(settings.SLACK_BOT_TOKEN),
            "nav_section": "console:tools",
        },
    )


@require_GET
@login_required
def group_detail(request: AuthenticatedHttpRequest, group_id: int) -> HttpResponse:
    _require(request)
    group = get_object_or_404(Group, pk=group_id)
    return render(
        request,
        "console/group.html",
        {
            "group": group,
            "members": group.user_set.filter(is_active=True).order_by("username"),
            "decides": notices.tools_decided_by(group),
            "slack_route": notices.group_route(group),
            "slack_on": bool(settings.SLACK_BOT_TOKEN),
            "nav_section": "console:tools",
        },
    )


@require_POST
@login_required
def group_route(request: AuthenticatedHttpRequest, group_id: int) -> HttpResponse:
    group = get_object_or_404(Group, pk=group_id)
    route_save(request, name=group.name, owner={"group": group})
    return redirect("console:group", group_id=group.pk)
