"""The person's own account security: the authenticator app (TOTP) and verifying a
session with it (django-otp). ``REQUIRE_TOTP_FOR_IRREVERSIBLE`` makes a verified
session a condition of deciding on irreversible tools."""

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from approvals.errors import Refusal
from operations import services
from operations.selectors import notices

from .. import security
from ..middleware import AuthenticatedHttpRequest


class CodeForm(forms.Form):
    code = forms.CharField(max_length=12, strip=True)


def _next(request: HttpRequest) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return ""


def _page(
    request: AuthenticatedHttpRequest,
    *,
    pending=None,
    form: CodeForm | None = None,
    status: int = 200,
) -> HttpResponse:
    context = {
        "devices": security.second_factor_devices(request.user),
        "verified": security.session_verified(request),
        "pending": pending,
        "secret": security.second_factor_secret(pending) if pending else "",
        "form": form or CodeForm(),
        "required_for_irreversible": settings.REQUIRE_TOTP_FOR_IRREVERSIBLE,
        "nav_section": "console:account",
        **_notification_context(request),
    }
    response = render(request, "console/account.html", context, status=status)
    if pending is not None:
        # The page shows the authenticator's secret: never keep a copy of it anywhere.
        response["Cache-Control"] = "no-store"
    return response


CHANNEL_LABELS = (("mail", "Mail"), ("slack", "Slack direct message"))


def _notification_context(request: AuthenticatedHttpRequest) -> dict:
    chosen = notices.preference_channels(request.user)
    return {
        "channel_labels": CHANNEL_LABELS,
        "preference_rows": [
            (kind, notices.PERSONAL_KIND_LABELS[kind], chosen[kind])
            for kind in notices.PERSONAL_KINDS
        ],
        "slack_on": bool(settings.SLACK_BOT_TOKEN),
        "slack_user": notices.slack_accounts([request.user.pk]).get(request.user.pk, ""),
    }


@require_POST
@login_required
def notifications(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Save which channels tell this person of what; a channel offered only once it can
    reach them (Slack, once linked)."""
    try:
        services.preference_set(
            user=request.user,
            channels={
                kind: request.POST.getlist(kind)[: len(notices.PERSONAL_CHANNELS)]
                for kind in notices.PERSONAL_KINDS
            },
        )
    except ValueError as exc:
        messages.error(request, f"Nothing was saved. {exc}")
    else:
        messages.success(request, "Saved what you are told, and where.")
    return redirect("console:account")


@require_GET
@login_required
def account(request: AuthenticatedHttpRequest) -> HttpResponse:
    return _page(request)


@never_cache
@require_POST
@login_required
def totp_start(request: AuthenticatedHttpRequest) -> HttpResponse:
    try:
        device = security.second_factor_start(
            user=request.user, verified=security.session_verified(request)
        )
    except Refusal as refusal:
        messages.error(request, refusal.detail)
        return redirect("console:account")
    return _page(request, pending=device)


@never_cache
@require_POST
@login_required
def totp_confirm(request: AuthenticatedHttpRequest) -> HttpResponse:
    device = security.second_factor_pending(request.user)
    if device is None:
        messages.error(request, "Start the setup again.")
        return redirect("console:account")
    form = CodeForm(request.POST)
    if form.is_valid() and security.second_factor_confirm(
        request=request, device=device, token=form.cleaned_data["code"]
    ):
        messages.success(request, "Authenticator added; this session is verified.")
        return redirect("console:account")
    form.add_error("code", "That code did not match. Check the time on your phone and try again.")
    return _page(request, pending=device, form=form, status=400)


@never_cache
@require_http_methods(["GET", "POST"])
@login_required
def verify(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Enter a code from the authenticator app; the session is verified until it ends."""
    has_device = bool(security.second_factor_devices(request.user))
    form = CodeForm(request.POST or None)
    status = 200
    if request.method == "POST" and has_device:
        if form.is_valid() and security.second_factor_verify(
            request=request, token=form.cleaned_data["code"]
        ):
            messages.success(request, "This session is verified with your authenticator.")
            return redirect(_next(request) or "console:account")
        form.add_error("code", "That code did not match, or too many failed: wait, then retry.")
        status = 400
    context = {
        "form": form,
        "has_device": has_device,
        "next": _next(request),
        "nav_section": "console:account",
    }
    return render(request, "console/account_verify.html", context, status=status)
