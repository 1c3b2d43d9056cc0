"""The console's middleware: session timeouts (docs/security.md, "Console sessions"),
request metrics, and the throttling of a person's POSTs."""

import math
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from operations.metrics import HTTP_REQUEST_DURATION
from operations.throttling import PersonRateThrottle

from . import security


class HtmxHttpRequest(HttpRequest):
    """A request after django-htmx's middleware, which sets ``request.htmx``."""

    htmx: HtmxDetails


def _is_background_poll(request: HtmxHttpRequest) -> bool:
    """A live region refreshing itself (hx-trigger="every ..."): not the person's activity.

    Live regions ask for a partial (``?partial=1``) with a GET; counting those as activity
    would keep an unattended inbox tab signed in forever.
    """
    return request.method == "GET" and bool(request.htmx) and bool(request.GET.get("partial"))


class SessionTimeoutMiddleware:
    """Sign out sessions idle for ``SESSION_IDLE_TIMEOUT_S`` or older than
    ``SESSION_ABSOLUTE_TIMEOUT_S``; record activity otherwise.

    A timed-out request goes on as anonymous, so ``login_required`` sends the person to
    the sign-in page with ``next``; an htmx request gets a client-side redirect instead,
    so that the sign-in page does not land inside a fragment.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HtmxHttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and hasattr(request, "session"):
            reason = security.session_expiry(request.session)
            if reason is not None:
                logout(request)
                messages.info(
                    request,
                    "You were signed out after a period of inactivity."
                    if reason == "idle"
                    else "Your session reached its maximum length; sign in again.",
                )
                if request.htmx:
                    back = request.htmx.current_url_abs_path or request.get_full_path()
                    return HttpResponseClientRedirect(
                        redirect_to_login(back, settings.LOGIN_URL).url
                    )
            elif not _is_background_poll(request):
                security.session_touch(request.session)
        return self.get_response(request)


KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class RequestMetricsMiddleware:
    """Observes each request's duration by route pattern (``/api/v1/operations/<str:
    operation_id>``, never the raw path: labels stay few), method and status."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = "/" + match.route if match is not None and match.route else "unmatched"
        method = request.method if request.method in KNOWN_METHODS else "other"
        HTTP_REQUEST_DURATION.labels(
            route=route, method=method, status=str(response.status_code)
        ).observe(time.perf_counter() - started)
        return response


class PersonThrottleMiddleware:
    """A signed-in person's POSTs (every change made in the console or the admin) count
    against ``THROTTLE_SESSION_RATE`` in the shared cache; beyond it the POST is answered
    429 with ``Retry-After`` and a page that says when to try again, and nothing runs.

    In ``process_view``, so that only POSTs that passed the CSRF check (the middleware
    before it) and reach a view are counted. Reads are not counted: an open page polls
    every few seconds in each tab, which a budget for changes need not cover.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any
    ) -> HttpResponse | None:
        if request.method != "POST" or not request.user.is_authenticated:
            return None
        throttle = PersonRateThrottle()
        if throttle.allow_request(request, view):
            return None
        wait_s = max(1, math.ceil(throttle.wait()))
        # Rendered without the request: no context processor runs (the navigation's
        # counts are queries), so a refusal stays cheap however many arrive.
        page = render_to_string("console/throttled.html", {"wait_s": wait_s})
        return HttpResponse(page, status=429, headers={"Retry-After": str(wait_s)})
