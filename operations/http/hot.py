"""The lean views of the runner API's hot endpoints: register (one or a batch), claim,
heartbeat, outcome (one or a batch).

A DRF ``APIView`` answers these requests with the same authentication, permission,
throttle, parser and exception handler as here, but spends more on its generic
machinery than the request costs the service: per request a view instance, content
negotiation and version determination, then serializers that deep-copy their declared
fields, then ``Response`` rendering through ``finalize_response``. The lean view makes
the same calls in the same order as ``APIView.initial`` (content negotiation,
authentication, permission, throttles) with the classes DRF is configured with
(``api_settings``: ``RunnerTokenAuthentication``, ``IsRunner``, ``StrictJSONParser``,
``RunnerRateThrottle``), answers every refusal through ``problems.exception_handler``,
and validates bodies with ``compiled.Compiled``, built from the request serializers.
What it answers is ``answers``, the DRF views' own code. tests/operations/
test_lean_views.py holds both paths to the same answers and problems.

Only POST is lean: every other method of these URLs is the DRF view's, as are the
endpoints' OpenAPI descriptions (``views``). ``API_LEAN_VIEWS = False`` serves POST
through the DRF view too.
"""

from collections.abc import Callable
from typing import Any, cast

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.settings import api_settings

from ..models import Runner, RunnerToken
from . import answers, problems
from .compiled import Compiled
from .serializers import LeaseIn, OperationIn, OutcomeIn, OutcomeItemIn, StrictSerializer

COMPILED: dict[type[StrictSerializer], Compiled] = {
    cls: Compiled(cls) for cls in (OperationIn, LeaseIn, OutcomeIn, OutcomeItemIn)
}
RENDERER = JSONRenderer()
# DRF's configured classes (its stubs type the settings as strings).
_settings = cast(Any, api_settings)


def validate(serializer_class: type[StrictSerializer], raw: Any) -> dict[str, Any]:
    return COMPILED[serializer_class](raw)


class _Endpoint:
    """What the permission and the throttles read of a view."""

    required_scope = RunnerToken.SCOPE_USE_TOOLS


ENDPOINT = _Endpoint()


def _render(
    body: dict[str, Any],
    status: int,
    *,
    allow: str,
    media_type: str | None = None,
    content_type: str | None = None,
    headers: Any = (),
) -> HttpResponse:
    response = HttpResponse(
        RENDERER.render(body, media_type),
        status=status,
        content_type=content_type or RENDERER.media_type,
    )
    for name, value in headers:
        if name.lower() != "content-type":
            response[name] = value
    response["Allow"] = allow
    return response


def _problem(exc: Exception, request: Request) -> dict[str, Any]:
    return dict(problems.exception_handler(exc, {"view": ENDPOINT, "request": request}).data)


def _cost(request: Request) -> int:
    """Requests of the runner's throttle bucket: a batch counts its items."""
    data = request.data
    return len(data) if isinstance(data, list) and data else 1


def _admitted(request: Request) -> Runner:
    """``APIView.initial``'s checks after content negotiation, in its order."""
    request.user  # noqa: B018 (authenticates: a refused token raises here)
    for permission in _settings.DEFAULT_PERMISSION_CLASSES:
        if not permission().has_permission(request, ENDPOINT):
            if request.authenticators and not request.successful_authenticator:
                raise drf.NotAuthenticated()
            raise drf.PermissionDenied()
    waits = []
    cost = _cost(request)
    for throttle_class in _settings.DEFAULT_THROTTLE_CLASSES:
        throttle = throttle_class()
        throttle.cost = cost
        if not throttle.allow_request(request, ENDPOINT):
            waits.append(throttle.wait())
    if waits:
        known = [wait for wait in waits if wait is not None]
        raise drf.Throttled(max(known, default=None))
    return cast(Runner, request.user)


Handler = Callable[[Request, Runner, dict[str, Any]], answers.Answer]


def lean(drf_view: Callable[..., HttpResponse], handler: Handler, allow: str) -> Callable:
    """The URL's view: POST through ``handler`` (when ``API_LEAN_VIEWS``), anything
    else through ``drf_view``."""

    @csrf_exempt
    def view(http: HttpRequest, **kwargs: Any) -> HttpResponse:
        if http.method != "POST" or not settings.API_LEAN_VIEWS:
            return drf_view(http, **kwargs)
        request = Request(
            http,
            parsers=[parser() for parser in _settings.DEFAULT_PARSER_CLASSES],
            authenticators=[auth() for auth in _settings.DEFAULT_AUTHENTICATION_CLASSES],
        )
        media_type = None
        try:
            negotiator = cast(Any, request.negotiator)
            renderer, media_type = negotiator.select_renderer(request, [RENDERER])
            request.accepted_renderer, request.accepted_media_type = renderer, media_type
            runner = _admitted(request)
            body, status = handler(request, runner, kwargs)
        except Exception as exc:
            response = problems.exception_handler(exc, {"view": ENDPOINT, "request": request})
            return _render(
                response.data,
                response.status_code,
                allow=allow,
                content_type=problems.CONTENT_TYPE,
                headers=response.items(),
            )
        return _render(body, status, allow=allow, media_type=media_type)

    # drf-spectacular describes the DRF view (``cls``), which serves the other methods.
    view.cls = drf_view.cls  # type: ignore[attr-defined]
    view.initkwargs = drf_view.initkwargs  # type: ignore[attr-defined]
    view.drf_view = drf_view  # type: ignore[attr-defined]
    return view


def register(request: Request, runner: Runner, kwargs: dict[str, Any]) -> answers.Answer:
    raw = request.data
    traceparent = request.headers.get("traceparent", "")
    if isinstance(raw, list):
        return answers.register_batch(
            runner=runner,
            raw=raw,
            validate=validate,
            traceparent=traceparent,
            problem_of=lambda exc: _problem(exc, request),
        )
    return answers.register(runner=runner, raw=raw, validate=validate, traceparent=traceparent)


def claim(request: Request, runner: Runner, kwargs: dict[str, Any]) -> answers.Answer:
    return answers.claim(
        runner=runner, operation_id=kwargs["operation_id"], raw=request.data, validate=validate
    )


def heartbeat(request: Request, runner: Runner, kwargs: dict[str, Any]) -> answers.Answer:
    return answers.heartbeat(
        runner=runner,
        operation_id=kwargs["operation_id"],
        number=kwargs["number"],
        raw=request.data,
        validate=validate,
    )


def outcome(request: Request, runner: Runner, kwargs: dict[str, Any]) -> answers.Answer:
    return answers.outcome(
        runner=runner,
        operation_id=kwargs["operation_id"],
        number=kwargs["number"],
        raw=request.data,
        validate=validate,
    )


def outcome_batch(request: Request, runner: Runner, kwargs: dict[str, Any]) -> answers.Answer:
    return answers.outcome_batch(
        runner=runner,
        run_id=kwargs["run_id"],
        raw=request.data,
        validate=validate,
        problem_of=lambda exc: _problem(exc, request),
    )
