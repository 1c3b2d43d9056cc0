"""Tools: contracts, versions and the differences between them, who may do what,
and activating a version that weakens the contract or that HOLD_NEW_TOOLS held."""

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import Refusal
from operations import access, selectors, services
from operations.errors import NotFound
from operations.models import Tool, ToolVersion
from operations.selectors import notices

from ..middleware import AuthenticatedHttpRequest
from ..presenters import changes
from .common import found, route_save


@require_GET
@login_required
def tools_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    user = request.user
    tools = list(
        selectors.tools_visible_to_user(user)
        .select_related("active_version")
        .annotate(
            version_count=Count("versions", distinct=True),
            never_activated=Count(
                "versions", filter=Q(versions__activated_at__isnull=True), distinct=True
            ),
        )
        .order_by("name")
    )
    held = access.tool_permissions_held(user, tools)
    rows = [{"tool": tool, "perms": held[tool.name]} for tool in tools]
    return render(
        request,
        "console/tools.html",
        {"rows": rows, "may_see_groups": access.may_manage_tool_permissions(user)},
    )


def _version(versions: list[ToolVersion], number: Any) -> ToolVersion | None:
    try:
        wanted = int(number)
    except (TypeError, ValueError):
        return None
    return next((v for v in versions if v.number == wanted), None)


def _comparison(request: HttpRequest, versions: list[ToolVersion], active: ToolVersion | None):
    """The two versions to compare: ?from=&to=, else the active one and the newest (or
    the newest and the one before it)."""
    newer = _version(versions, request.GET.get("to"))
    older = _version(versions, request.GET.get("from"))
    if newer is None and versions:
        newer = versions[0]
    if older is None and newer is not None:
        if active is not None and active.number != newer.number:
            older = active
        else:
            older = next((v for v in versions if v.number < newer.number), None)
    if older is None or newer is None or older.number == newer.number:
        return None
    return {"from": older, "to": newer, "changes": changes(older.contract, newer.contract)}


@require_GET
@login_required
def tool_detail(request: AuthenticatedHttpRequest, name: str) -> HttpResponse:
    tool = found(selectors.tool_get_for_user, user=request.user, name=name)
    versions = selectors.tool_versions(tool)
    active = next((v for v in versions if v.pk == tool.active_version_id), None)
    context = {
        "tool": tool,
        "active": active,
        "contract": active.contract if active else None,
        "versions": versions,
        "comparison": _comparison(request, versions, active),
        "activatable": {
            version.pk for version in versions if not access.activate_refusal(request.user, version)
        },
        # A version waiting for activation can be replayed against past registrations.
        "may_simulate": access.may_simulate_contract(request.user, tool),
        "may_operate_breaker": access.may_operate_breaker(request.user, tool),
        "may_administer": access.may_administer_tools(request.user),
        "all_runners": selectors.runners_active(),
        "access": selectors.tool_access(tool),
        "runners": selectors.tool_runners(tool),
        "breaker": (active.contract.get("breaker") if active else None),
        "breaker_history": selectors.tool_breaker_history(tool),
        "inbound": (active.contract.get("inbound") if active else None),
        "nav_section": "console:tools",
        **_route_context(request, tool),
    }
    return render(request, "console/tool.html", context)


def _route_context(request: AuthenticatedHttpRequest, tool: Tool) -> dict:
    return {
        "slack_on": bool(settings.SLACK_BOT_TOKEN),
        "slack_route": notices.tool_route(tool),
        "slack_channels": notices.slack_channels_of_tool(tool),
        "may_route": access.may_manage_tool_permissions(request.user),
    }


@require_POST
@login_required
def tool_route(request: AuthenticatedHttpRequest, name: str) -> HttpResponse:
    """Set (or, empty, remove) the Slack channel of a tool's approval requests."""
    tool = found(selectors.tool_get_for_user, user=request.user, name=name)
    route_save(request, name=tool.name, owner={"tool": tool})
    return redirect("console:tool", name=tool.name)


@require_POST
@login_required
def tool_breaker(request: AuthenticatedHttpRequest, name: str) -> HttpResponse:
    tool = found(selectors.tool_get_for_user, user=request.user, name=name)
    open_it = request.POST.get("state") == "open"
    try:
        services.tool_breaker_set(tool=tool, open_it=open_it, user=request.user)
    except Refusal as refusal:
        messages.error(request, refusal.detail)
    else:
        messages.success(
            request, f"The circuit breaker of {tool.name} is now {'open' if open_it else 'closed'}."
        )
    return redirect("console:tool", name=tool.name)


@require_POST
@login_required
def tool_activate(request: AuthenticatedHttpRequest, name: str, number: int) -> HttpResponse:
    tool = found(selectors.tool_get_for_user, user=request.user, name=name)
    version = tool.versions.filter(number=number).first()
    if version is None:
        messages.error(request, f"{tool.name} has no version {number}.")
        return redirect("console:tool", name=tool.name)
    try:
        services.tool_version_activate(version=version, user=request.user)
    except Refusal as refusal:
        messages.error(request, refusal.detail)
    else:
        messages.success(request, f"{tool.name} v{version.number} is now the active contract.")
    return redirect("console:tool", name=tool.name)


@require_POST
@login_required
def tool_owner(request: AuthenticatedHttpRequest, name: str) -> HttpResponse:
    """A person allows a runner on the tool, takes that away, or transfers the tool."""
    tool = found(selectors.tool_get_for_user, user=request.user, name=name)
    action = request.POST.get("action")
    try:
        runner = selectors.runner_get_by_name(request.POST.get("runner", ""))
        if action == "transfer":
            services.tool_transfer(tool=tool, to_runner=runner, user=request.user)
            done = f"{tool.name} now belongs to {runner.name}."
        elif action in ("allow", "remove"):
            services.tool_invoker_set(
                tool=tool,
                runner=runner,
                allow=action == "allow",
                actor=services.Actor.of_user(request.user),
            )
            verb = "may" if action == "allow" else "may no longer"
            done = f"{runner.name} {verb} invoke {tool.name}."
        else:
            raise NotFound("Choose allow, remove or transfer.")
    except Refusal as refusal:
        messages.error(request, refusal.detail)
    else:
        messages.success(request, done)
    return redirect("console:tool", name=tool.name)
