"""Simulation before activating (docs/policies.md#simulation): what a policy version,
or a tool's contract version waiting for activation, would have changed over the last
N days of registrations. Read-only pages: a GET form (days, version) and the answer.

The examples link to their operations only when the person may see them: someone who
manages policies may not see every tool's operations, and then reads the id alone.
"""

from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from approvals.errors import Refusal
from approvals.people import Person
from operations import access, selectors
from operations.policies.simulation import CHANGES, Simulation
from operations.services.simulation import (
    APPROXIMATIONS,
    MAX_DAYS,
    contract_simulate,
    policy_simulate,
)

from ..middleware import AuthenticatedHttpRequest
from .common import count_param, found
from .policies import manage_policies_required

TEMPLATE = "console/policies/simulation.html"
DEFAULT_DAYS = 7


def _days(request: AuthenticatedHttpRequest) -> int:
    days = count_param(request, "days", maximum=MAX_DAYS)
    return DEFAULT_DAYS if days is None else days


def _rows(user: Person, result: Simulation) -> list[dict[str, Any]]:
    """One row per change: its label, count and examples, each marked ``visible`` when
    ``user`` may open its operation."""
    ids = [
        example["operation"] for change in result.changes.values() for example in change.examples
    ]
    visible = selectors.operation_ids_visible_to(user=user, ids=ids)
    return [
        {
            "name": name,
            "label": name.replace("_", " "),
            "count": result.changes[name].count,
            "examples": [
                {**example, "visible": example["operation"] in visible}
                for example in result.changes[name].examples
            ],
        }
        for name in CHANGES
    ]


def _page(
    request: AuthenticatedHttpRequest,
    *,
    run: Any,
    days: int,
    context: dict[str, Any],
) -> HttpResponse:
    """Run the simulation and render it; a refusal (days out of range, no such
    version) is said on the page, with the form to try again."""
    status = 200
    try:
        result = run()
    except Refusal as refusal:
        context["refusal"], status = refusal.detail, refusal.status
    else:
        context.update(
            result=result, rows=_rows(request.user, result), approximations=APPROXIMATIONS
        )
    context.update(days=days, max_days=MAX_DAYS)
    return render(request, TEMPLATE, context, status=status)


@require_GET
@manage_policies_required
def policy_simulation(request: AuthenticatedHttpRequest, policy_id: str) -> HttpResponse:
    policy = found(selectors.policy_get_for_user, user=request.user, policy_id=policy_id)
    versions = selectors.policy_versions(policy)
    days = _days(request)
    version = count_param(request, "version", maximum=10**9)
    if version is None and versions:
        version = versions[0].number
    return _page(
        request,
        run=lambda: policy_simulate(
            user=request.user, policy_id=policy.pk, days=days, version=version
        ),
        days=days,
        context={
            "policy": policy,
            "versions": versions,
            "version": version,
            "back_url": reverse("console:policy", args=[policy.pk]),
            "nav_section": "console:policies",
        },
    )


@require_GET
@login_required
def contract_simulation(request: AuthenticatedHttpRequest, name: str, number: int) -> HttpResponse:
    tool = found(selectors.tool_get_for_user, user=request.user, name=name)
    if not access.may_simulate_contract(request.user, tool):
        raise PermissionDenied("You may not simulate versions of this tool.")
    days = _days(request)
    return _page(
        request,
        run=lambda: contract_simulate(user=request.user, tool=tool.pk, version=number, days=days),
        days=days,
        context={
            "tool": tool,
            "version": number,
            "back_url": reverse("console:tool", args=[tool.pk]),
            "nav_section": "console:tools",
        },
    )
