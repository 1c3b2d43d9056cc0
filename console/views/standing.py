"""Standing grants: the list with what each has left, issuing one for a tool, one grant
with its signatures and uses, signing and revoking. Issuing from an approval page
("approve this and the next N like it") is in the approvals module."""

import json
from decimal import Decimal
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import Refusal
from approvals.models import StandingGrant
from approvals.standing import PIN_OPERATORS
from operations import access, selectors, services
from operations.models import Tool

from .. import security
from ..forms import RevokeForm, parse_standing_terms, standing_form_initial
from ..middleware import AuthenticatedHttpRequest
from .common import found

OPEN = (StandingGrant.GrantStatus.PROPOSED, StandingGrant.GrantStatus.ACTIVE)


def remaining(grant: StandingGrant, now: Any) -> dict[str, Any]:
    """What a grant has left: uses, sum (None without a cap), time (None once ended)."""
    return {
        "uses": grant.uses_remaining,
        "sum": max(grant.max_sum - grant.sum_used, Decimal(0))
        if grant.max_sum is not None
        else None,
        "open": grant.status in OPEN and grant.expires_at > now,
    }


def terms_text(grant: StandingGrant) -> list[str]:
    """The pins of a grant in words, values as JSON: ``/currency one of ["EUR", "USD"]``."""
    return [
        f"{pin['path']} {PIN_OPERATORS[pin['op']]} {json.dumps(pin['value'])}" for pin in grant.pins
    ]


@require_GET
@login_required
def standing_grants(request: AuthenticatedHttpRequest) -> HttpResponse:
    now = timezone.now()
    grants = list(selectors.standing_grants_for_user(request.user)[:200])
    tools = list(selectors.tools_decidable_by(request.user))
    context = {
        "rows": [
            {"grant": grant, "left": remaining(grant, now), "pins": terms_text(grant)}
            for grant in grants
        ],
        "tools": tools,
        "form": standing_form_initial(tool=request.GET.get("tool", "")),
        "operators": PIN_OPERATORS,
        "nav_section": "console:standing-grants",
    }
    return render(request, "console/standing_grants.html", context)


@require_POST
@login_required
def standing_grant_issue(request: AuthenticatedHttpRequest) -> HttpResponse:
    tool = request.POST.get("tool", "")
    try:
        terms = parse_standing_terms(request.POST, tool=tool, now=timezone.now())
        grant = services.standing_grant_issue(
            terms, user=request.user, otp_verified=security.session_verified(request)
        )
    except ValueError as exc:
        messages.error(request, f"No standing grant was issued. {exc}")
        return redirect("console:standing-grants")
    except Refusal as refusal:
        messages.error(request, f"No standing grant was issued. {refusal.detail}")
        return redirect("console:standing-grants")
    messages.success(request, _issued_message(grant))
    return redirect("console:standing-grant", grant_id=grant.id)


def _issued_message(grant: StandingGrant) -> str:
    if grant.status == StandingGrant.GrantStatus.ACTIVE:
        return (
            f"Standing grant {grant.id} is active: it approves the next {grant.max_uses} "
            f"operation{'s' if grant.max_uses != 1 else ''} of {grant.tool} like it."
        )
    missing = grant.approvals_required - grant.signatures.count()
    return (
        f"Standing grant {grant.id} is proposed: it covers nothing until {missing} more "
        f"{'person signs' if missing == 1 else 'people sign'} it."
    )


@require_GET
@login_required
def standing_grant_detail(request: AuthenticatedHttpRequest, grant_id: str) -> HttpResponse:
    grant = found(selectors.standing_grant_get_for_user, user=request.user, grant_id=grant_id)
    now = timezone.now()
    tool = Tool.objects.select_related("active_version").filter(pk=grant.tool).first()
    signatures = list(grant.signatures.select_related("user"))
    sign_refusal = None
    if grant.status == StandingGrant.GrantStatus.PROPOSED and tool is not None:
        sign_refusal = access.standing_sign_refusal(
            user=request.user,
            tool=tool,
            principal=grant.principal,
            run=selectors.run_with_runner(grant.run_id),
            signed_by=[signature.user_id for signature in signatures],
            otp_verified=security.session_verified(request),
        )
    context = {
        "grant": grant,
        "left": remaining(grant, now),
        "pins": terms_text(grant),
        "signatures": signatures,
        "uses": selectors.standing_grant_uses(grant),
        "events": selectors.standing_grant_events(grant),
        "proposed": grant.status == StandingGrant.GrantStatus.PROPOSED,
        "sign_refusal": sign_refusal,
        "verify_second_factor": sign_refusal == access.SECOND_FACTOR_REFUSAL,
        "may_revoke": tool is not None
        and grant.status != StandingGrant.GrantStatus.REVOKED
        and access.may_revoke_standing(request.user, tool),
        "revoke_form": RevokeForm(),
        "nav_section": "console:standing-grants",
    }
    return render(request, "console/standing_grant.html", context)


@require_POST
@login_required
def standing_grant_sign(request: AuthenticatedHttpRequest, grant_id: str) -> HttpResponse:
    grant = found(selectors.standing_grant_get_for_user, user=request.user, grant_id=grant_id)
    try:
        grant = services.standing_grant_sign(
            grant_id=grant.id, user=request.user, otp_verified=security.session_verified(request)
        )
    except Refusal as refusal:
        messages.error(request, f"Not signed. {refusal.detail}")
    else:
        messages.success(request, _issued_message(grant))
    return redirect("console:standing-grant", grant_id=grant.id)


@require_POST
@login_required
def standing_grant_revoke(request: AuthenticatedHttpRequest, grant_id: str) -> HttpResponse:
    grant = found(selectors.standing_grant_get_for_user, user=request.user, grant_id=grant_id)
    form = RevokeForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Say why the standing grant is revoked.")
        return redirect("console:standing-grant", grant_id=grant.id)
    try:
        services.standing_grant_revoke(
            grant_id=grant.id, user=request.user, reason=form.cleaned_data["reason"]
        )
    except Refusal as refusal:
        messages.error(request, refusal.detail)
    else:
        messages.success(
            request,
            f"Standing grant {grant.id} revoked: it covers nothing more, and what it approved "
            "asks a person again at its next claim.",
        )
    return redirect("console:standing-grant", grant_id=grant.id)
