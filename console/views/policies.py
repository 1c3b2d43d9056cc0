"""People's policies (docs/policies.md): the list, one policy with its texts, the diff
between them, its versions and history and the buttons the services would honour, and
the editor that validates with Cedar and saves a draft or a shadow.

Every page needs ``manage_policies`` (a 403 otherwise); what a button does is decided by
the same ``access`` functions the services ask, so a button and its refusal agree.
"""

import difflib
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import Refusal
from approvals.people import Person
from operations import access, selectors
from operations.models import Policy, PolicyVersion
from operations.policies import cedar
from operations.policies.errors import PolicyInvalid
from operations.services import policies as services

from ..middleware import AuthenticatedHtmxRequest, AuthenticatedHttpRequest
from .common import found

TEMPLATE = "console/policies/policy.html"
EDITOR = "console/policies/editor.html"
MAX_TEXT = cedar.MAX_TEXT


def manage_policies_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Signed in and allowed to manage policies, or a 403: runners and other people
    neither read nor change policies."""

    @login_required
    @wraps(view)
    def wrapped(request: AuthenticatedHttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not access.may_manage_policies(request.user):
            raise PermissionDenied("You may not manage policies.")
        return view(request, *args, **kwargs)

    return wrapped


@require_GET
@manage_policies_required
def policies_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    rows = list(selectors.policies_for_user(request.user)[:500])
    return render(
        request,
        "console/policies/list.html",
        {"policies": rows, "nav_section": "console:policies"},
    )


def diff_lines(old: str, new: str) -> list[tuple[str, str]]:
    """The unified diff of two texts as (kind, line) pairs, kind one of ``add``,
    ``del``, ``hunk`` or ``same``; the template escapes the lines."""
    kinds = {"+": "add", "-": "del", "@": "hunk"}
    lines = difflib.unified_diff(
        old.splitlines(), new.splitlines(), "active", "newest", lineterm="", n=3
    )
    return [(kinds.get(line[:1], "same"), line) for line in list(lines)[2:]]


def _actions(user: Person, policy: Policy, newest: PolicyVersion | None) -> dict[str, Any]:
    """Which buttons the page shows, each exactly when its service would act."""
    if newest is None:
        return {}
    shadow_refusal = access.policy_shadow_refusal(user, policy, newest)
    in_force = policy.active_version_id == newest.pk
    return {
        "may_shadow": shadow_refusal is None and policy.shadow_version_id != newest.pk,
        "show_activate": access.may_manage_policies(user) and not in_force,
        "activate_refusal": None if in_force else access.policy_activate_refusal(user, newest),
        "may_retire": access.policy_retire_refusal(user, policy) is None,
    }


@require_GET
@manage_policies_required
def policy_detail(request: AuthenticatedHttpRequest, policy_id: str) -> HttpResponse:
    policy = found(selectors.policy_get_for_user, user=request.user, policy_id=policy_id)
    versions = selectors.policy_versions(policy)
    newest = versions[0] if versions else None
    active = policy.active_version
    context = {
        "policy": policy,
        "versions": versions,
        "newest": newest,
        "active": active,
        "diff": diff_lines(active.text if active else "", newest.text)
        if newest is not None and newest != active
        else [],
        "events": selectors.policy_events(policy),
        # Filled by the shadow figures and the simulation (console/policies/_shadow.html,
        # _simulate_link.html): each renders nothing while its data is missing.
        "shadow_figures": selectors.shadow_summary(user=request.user, policy_id=policy.pk),
        "simulate_url": reverse("console:policy-simulate", args=[policy.pk])
        + f"?version={newest.number}"
        if newest is not None
        else None,
        # A policy that asks for people: approve a bounded family up front instead
        # (a standing grant for each tool it names, or one to choose).
        "standing_tools": _standing_tools(newest),
        "nav_section": "console:policies",
        **_actions(request.user, policy, newest),
    }
    return render(request, TEMPLATE, context)


def _standing_tools(version: Any) -> list[str] | None:
    """The tools a standing grant could be issued for from this policy's page: those
    its resource names ([] for any tool); None when it asks for nobody."""
    if version is None or version.kind != "require":
        return None
    try:
        parsed = cedar.parse(version.text)
    except Refusal:
        return None
    return sorted(parsed.tools) if parsed.tools is not None else []


def _number(request: AuthenticatedHttpRequest) -> int | None:
    """The version the person saw on the page: a text written since then must not be
    the one their click shadows or puts in force."""
    raw = request.POST.get("version", "")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 10 else None


@require_POST
@manage_policies_required
def policy_shadow(request: AuthenticatedHttpRequest, policy_id: str) -> HttpResponse:
    try:
        policy = services.policy_shadow(
            user=request.user, policy_id=policy_id, number=_number(request)
        )
    except Refusal as refusal:
        messages.error(request, f"Not shadowed. {refusal.detail}")
    else:
        number = policy.shadow_version.number if policy.shadow_version else "?"
        messages.success(
            request,
            f"Version {number} of {policy.pk} is in shadow: it is evaluated on live "
            "registrations and enforces nothing.",
        )
    return redirect("console:policy", policy_id=policy_id)


@require_POST
@manage_policies_required
def policy_activate(request: AuthenticatedHttpRequest, policy_id: str) -> HttpResponse:
    try:
        policy = services.policy_activate(
            user=request.user, policy_id=policy_id, number=_number(request)
        )
    except Refusal as refusal:
        messages.error(request, f"Not activated. {refusal.detail}")
    else:
        number = policy.active_version.number if policy.active_version else "?"
        messages.success(request, f"Version {number} of {policy.pk} is in force.")
    return redirect("console:policy", policy_id=policy_id)


@require_POST
@manage_policies_required
def policy_retire(request: AuthenticatedHttpRequest, policy_id: str) -> HttpResponse:
    try:
        policy = services.policy_retire(
            user=request.user, policy_id=policy_id, reason=request.POST.get("reason", "")
        )
    except Refusal as refusal:
        messages.error(request, f"Not retired. {refusal.detail}")
    else:
        messages.success(
            request, f"Policy {policy.pk} is retired: it is neither enforced nor watched."
        )
    return redirect("console:policy", policy_id=policy_id)


# ---------------------------------------------------------------------------------------
# The editor


def _validation(text: str) -> dict[str, Any]:
    """Cedar's verdict on a text, for the editor: its messages, or what it would be."""
    try:
        parsed = services.policy_validate(text)
    except PolicyInvalid as refusal:
        return {"valid": False, "problems": refusal.problems}
    tools = sorted(parsed.tools) if parsed.tools is not None else None
    return {
        "valid": True,
        "parsed": parsed,
        "summary": f"valid: {parsed.kind}, applies to "
        + (f"tools {', '.join(tools)}" if tools is not None else "every tool"),
    }


def _editor(
    request: AuthenticatedHttpRequest, text: str, *, status: int = 200, **extra: Any
) -> HttpResponse:
    context = {"text": text, "max_text": MAX_TEXT, "nav_section": "console:policies", **extra}
    return render(request, EDITOR, context, status=status)


@require_GET
@manage_policies_required
def policy_editor(request: AuthenticatedHttpRequest) -> HttpResponse:
    """A new policy, or (``?policy=ID``) a new version starting from the newest text."""
    text = ""
    policy_id = (request.GET.get("policy") or "")[:80]
    if policy_id:
        policy = found(selectors.policy_get_for_user, user=request.user, policy_id=policy_id)
        versions = selectors.policy_versions(policy)
        text = versions[0].text if versions else ""
    return _editor(request, text, editing=policy_id)


@require_POST
@manage_policies_required
def policy_validate(request: AuthenticatedHtmxRequest) -> HttpResponse:
    """Cedar's answer to the text as it is: the result alone for htmx, else the editor
    with it (the form also works without JavaScript)."""
    text = request.POST.get("text", "")[: MAX_TEXT + 1]
    result = _validation(text)
    if request.htmx:
        return render(request, f"{EDITOR}#validation", {"result": result})
    return _editor(request, text, result=result)


@require_POST
@manage_policies_required
def policy_save(request: AuthenticatedHttpRequest) -> HttpResponse:
    text = request.POST.get("text", "")[: MAX_TEXT + 1]
    shadow = request.POST.get("mode") == "shadow"
    started = timezone.now()
    try:
        version = services.policy_write(user=request.user, text=text, shadow=shadow)
    except PolicyInvalid as refusal:
        messages.error(request, "Not saved: Cedar refuses the policy.")
        return _editor(
            request, text, status=422, result={"valid": False, "problems": refusal.problems}
        )
    except Refusal as refusal:
        messages.error(request, f"Not saved. {refusal.detail}")
        return _editor(request, text, status=403)
    state = "in shadow" if version.policy.state == Policy.State.SHADOW else version.policy.state
    if version.written_at < started:
        said = f"Unchanged: version {version.number} of {version.policy_id} has this text"
    else:
        said = f"Saved version {version.number} of {version.policy_id}"
    messages.success(request, f"{said} ({state}).")
    return redirect("console:policy", policy_id=version.policy_id)
