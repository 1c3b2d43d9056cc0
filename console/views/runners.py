"""Runners and their API tokens: list, issue (the token shown once), revoke.

For people holding the built-in ``operations.change_runner`` permission (superusers
hold every permission); everyone else gets 403. Issuing and revoking go through
``operations.services`` and are audited in the runner's stream.
"""

from datetime import timedelta

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from approvals.errors import Refusal
from operations import access, selectors, services
from operations.models import Runner, RunnerToken

from ..middleware import AuthenticatedHttpRequest
from .common import found

SCOPE_LABELS = {
    RunnerToken.SCOPE_USE_TOOLS: "use tools (runs, operations, attempts, webhooks)",
    RunnerToken.SCOPE_REGISTER_CONTRACTS: "register contracts (PUT /tools)",
}
EXPIRY_CHOICES = [
    ("", "never"),
    ("1", "in 1 day"),
    ("7", "in 7 days"),
    ("30", "in 30 days"),
    ("90", "in 90 days"),
    ("365", "in 1 year"),
]


class TokenForm(forms.Form):
    label = forms.CharField(required=False, max_length=100)
    scopes = forms.MultipleChoiceField(
        choices=list(SCOPE_LABELS.items()),
        widget=forms.CheckboxSelectMultiple,
        error_messages={"required": "Choose at least one scope."},
    )
    expires_in_days = forms.ChoiceField(choices=EXPIRY_CHOICES, required=False)


def _require_admin(request: AuthenticatedHttpRequest) -> None:
    if not access.may_manage_runners(request.user):
        raise PermissionDenied("Managing runner tokens needs the 'change runner' permission.")


def token_state(token: RunnerToken, now) -> str:
    if token.revoked_at is not None:
        return "revoked"
    if token.expires_at is not None and token.expires_at <= now:
        return "expired"
    return "active"


@require_GET
@login_required
def runners_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    _require_admin(request)
    now = timezone.now()
    runners = selectors.runners_for_user(request.user)
    rows = [
        {
            "runner": runner,
            "active_tokens": sum(token_state(t, now) == "active" for t in runner.tokens.all()),
            "last_used": max(
                (t.last_used_at for t in runner.tokens.all() if t.last_used_at), default=None
            ),
        }
        for runner in runners
    ]
    return render(request, "console/runners.html", {"rows": rows, "nav_section": "console:runners"})


def _runner_page(
    request: HttpRequest,
    runner: Runner,
    *,
    form: TokenForm | None = None,
    issued: str | None = None,
    status: int = 200,
) -> HttpResponse:
    now = timezone.now()
    tokens = [
        {"token": token, "state": token_state(token, now)}
        for token in runner.tokens.order_by("-created_at")
    ]
    context = {
        "runner": runner,
        "tokens": tokens,
        "form": form or TokenForm(initial={"scopes": RunnerToken.ALL_SCOPES}),
        "issued": issued,
        "scope_labels": SCOPE_LABELS,
        "events": selectors.runner_events(runner),
        "nav_section": "console:runners",
    }
    return render(request, "console/runner.html", context, status=status)


@require_GET
@login_required
def runner_detail(request: AuthenticatedHttpRequest, runner_id: str) -> HttpResponse:
    _require_admin(request)
    return _runner_page(
        request, found(selectors.runner_get_for_user, user=request.user, runner_id=runner_id)
    )


@never_cache
@require_POST
@login_required
def token_issue(request: AuthenticatedHttpRequest, runner_id: str) -> HttpResponse:
    """Issue a token and show it in this response only.

    The token is rendered into this page and never stored in the session or in a
    message (messages may live in a cookie): after this page it exists only as its hash.
    ``never_cache`` marks the page ``no-store``.
    """
    _require_admin(request)
    runner = found(selectors.runner_get_for_user, user=request.user, runner_id=runner_id)
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _runner_page(request, runner, form=form, status=400)
    days = form.cleaned_data["expires_in_days"]
    try:
        token = services.token_issue_by_user(
            runner=runner,
            user=request.user,
            scopes=form.cleaned_data["scopes"],
            label=form.cleaned_data["label"],
            expires_at=timezone.now() + timedelta(days=int(days)) if days else None,
        )
    except Refusal as refusal:
        messages.error(request, refusal.detail)
        return _runner_page(request, runner, form=form, status=refusal.status)
    return _runner_page(request, runner, issued=token, status=201)


@require_POST
@login_required
def token_revoke(request: AuthenticatedHttpRequest, runner_id: str, token_id: str) -> HttpResponse:
    _require_admin(request)
    token = get_object_or_404(RunnerToken, pk=token_id, runner_id=runner_id)
    if token.revoked_at is not None:
        messages.info(request, f"Token {token.prefix}… was already revoked.")
    else:
        try:
            services.token_revoke_by_user(token=token, user=request.user)
        except Refusal as refusal:
            messages.error(request, refusal.detail)
        else:
            messages.success(
                request, f"Token {token.prefix}… revoked: requests with it are refused from now on."
            )
    return redirect("console:runner", runner_id=runner_id)
