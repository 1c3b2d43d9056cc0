"""Middleware: request ids, refusing input no column can hold, session timeouts for the
console (docs/security.md, "Console sessions"), request metrics, and the throttling of a
person's POSTs."""

import math
import re
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import logout
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import BadRequest
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponse
from django.template.loader import render_to_string
from django.utils.module_loading import import_string
from django_htmx.http import HttpResponseClientRedirect
from django_htmx.middleware import HtmxDetails

from approvals.people import Person
from operations import requestids
from operations.errors import InvalidQuery
from operations.http.problems import api_handler400, is_api_request
from operations.http.throttling import PersonRateThrottle
from operations.metrics import HTTP_REQUEST_DURATION

from . import security

FORM_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})


# The runner API's hot endpoints: register (and its batch), claim, heartbeat, outcome, and
# the outcome batch. Only the stack is chosen by it; the URL resolver still picks the view.
API_HOT_PATH = re.compile(
    r"/api/v1/(?:operations|operations/[^/]+/attempts(?:/[0-9]+/(?:heartbeat|outcome))?"
    r"|runs/[^/]+/outcomes)"
)


class _ApiHandler(BaseHandler):
    """Django's request cycle (URL resolution, view middleware, the view, exceptions
    turned into answers) under ``settings.API_MIDDLEWARE`` instead of ``MIDDLEWARE``."""

    def chain(self, paths: list[str]) -> Callable[[HttpRequest], HttpResponse]:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        handler = convert_exception_to_response(self._get_response)  # type: ignore[attr-defined]
        for middleware_path in reversed(paths):
            instance = import_string(middleware_path)(handler)
            if hasattr(instance, "process_view"):
                self._view_middleware.insert(0, instance.process_view)
            if hasattr(instance, "process_template_response"):
                self._template_response_middleware.append(instance.process_template_response)
            if hasattr(instance, "process_exception"):
                self._exception_middleware.append(instance.process_exception)
            handler = convert_exception_to_response(instance)
        self._middleware_chain = handler
        return cast(Callable[[HttpRequest], HttpResponse], handler)


class ApiStackMiddleware:
    """First in ``MIDDLEWARE``: a POST to one of the runner API's hot endpoints
    (``API_HOT_PATH``) goes through ``settings.API_MIDDLEWARE`` (request id, metrics, the
    NUL refusal, the security headers) and its view; everything else through the rest of
    ``MIDDLEWARE``. The console's layers (static files, CSP, sessions, CSRF, people's
    authentication and OTP, messages, htmx, session timeouts, the person throttle, axes)
    do nothing for a bearer-token JSON request but cost every one of them;
    docs/benchmarks.md has the profile. Django's outer handler (URL configuration,
    logging of refused requests) runs for both."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        paths = list(getattr(settings, "API_MIDDLEWARE", []))
        self.api = _ApiHandler().chain(paths) if paths else None

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if (
            self.api is not None
            and request.method == "POST"
            and API_HOT_PATH.fullmatch(request.path_info)
        ):
            return self.api(request)
        return self.get_response(request)


class RequestIdMiddleware:
    """Gives every answer an ``X-Request-Id`` (``operations.requestids``): the caller's
    when valid, else a new one, bound for the request so that problem bodies and log
    records carry it too.

    First in ``MIDDLEWARE``: every answer, a refusal by a later middleware or Django's
    400/404/500 handlers included, passes back through it.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = requestids.accept(request.META.get(requestids.META_KEY))
        token = requestids.bind(request_id)
        try:
            response = self.get_response(request)
        finally:
            requestids.unbind(token)
        response[requestids.HEADER] = request_id
        return response


def _texts(request: HttpRequest) -> Iterator[tuple[str, str]]:
    """Every piece of text a view may read from the request, with where it came from.

    The header values are as the server decoded them; the query string and form fields
    are percent-decoded, as views read them. Form bodies are read only outside the API:
    its parsers take JSON alone (strictjson refuses U+0000 there) and its inbound
    endpoint reads the raw body, which parsing the form here would consume.
    """
    yield "path", request.path_info
    for name, value in request.META.items():
        if name.startswith("HTTP_") or name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            header = name.removeprefix("HTTP_").replace("_", "-").title()
            yield f"{header} header", str(value)
    for name, values in request.GET.lists():
        yield f"query parameter {name[:40]!r}", name
        for value in values:
            yield f"query parameter {name[:40]!r}", value
    if request.content_type in FORM_TYPES and not is_api_request(request):
        for name, values in request.POST.lists():
            yield f"form field {name[:40]!r}", name
            for value in values:
                yield f"form field {name[:40]!r}", value


class RefuseNulMiddleware:
    """Answer 400 to a request that carries U+0000 in its path, a header, the query
    string or a form field, before any view reads it.

    PostgreSQL's text columns cannot hold U+0000: an id, a filter or a form value that
    holds one makes the query itself fail, and the request answered 500. No id, name or
    value here contains it, so refusing the request as a whole loses nothing and keeps
    every view (the API, the console, the admin, the sign-in page) from meeting one.
    ``operations.http.problems.api_handler400`` answers a problem under /api/ and a message
    page elsewhere, also under DEBUG (a raised ``BadRequest`` would show Django's debug
    page, which an API client cannot read). JSON bodies are checked by
    ``operations.strictjson``.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        for where, text in _texts(request):
            if "\x00" in text:
                refusal = f"The {where} holds U+0000 (NUL), which nothing here can hold."
                title = InvalidQuery.title if where.startswith("query parameter") else ""
                return api_handler400(request, BadRequest(refusal), title=title)
        return self.get_response(request)


class HtmxHttpRequest(HttpRequest):
    """A request after django-htmx's middleware, which sets ``request.htmx``."""

    htmx: HtmxDetails


class AuthenticatedHttpRequest(HttpRequest):
    """A request that reached a ``login_required`` view, so its user is a person.

    django-stubs types ``request.user`` as the user model or ``AnonymousUser``; the
    decorator has already sent anonymous visitors to the sign-in page, and this subclass,
    the stubs' own recommendation, says so to the type checker.
    """

    user: Person


class AuthenticatedHtmxRequest(HtmxHttpRequest, AuthenticatedHttpRequest):
    """A signed-in person's request after django-htmx's middleware."""


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
            if reason is None and security.session_password_refused(request.session, user):
                reason = "password"
            if reason is not None:
                logout(request)
                messages.info(
                    request,
                    {
                        "idle": "You were signed out after a period of inactivity.",
                        "absolute": "Your session reached its maximum length; sign in again.",
                        "password": "Password sign-in is now for superusers only: sign in "
                        "through single sign-on.",
                    }[reason],
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
