"""RFC 9457 problem details for every API error, with a stable ``code``.

One exception handler for DRF views, and ``api_handler400``/``api_handler404``/
``api_handler500`` for what never reaches a DRF view (a request refused by middleware,
an unknown URL under /api/, a crash in middleware).
"""

import logging
from collections.abc import Iterator
from typing import Any

from django.core.exceptions import BadRequest, PermissionDenied, RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf
from rest_framework.response import Response

from approvals.errors import Refusal

from .. import requestids
from ..errors import RateLimited
from .authentication import ISSUING, SEND_BEARER

logger = logging.getLogger(__name__)

PROBLEM_TYPE = "https://effectgate.dev/problems/"
CONTENT_TYPE = "application/problem+json"
# What a body that is not JSON is told to be instead (415 unsupported_media_type).
SEND_JSON = "Send the body as JSON with the header Content-Type: application/json."


def problem(status: int, code: str, title: str, detail: str, **extra: Any) -> dict[str, Any]:
    """A problem body; ``request_id`` is the answer's ``X-Request-Id`` (every problem is
    built while its request is answered, ``console.middleware.RequestIdMiddleware``)."""
    body = {
        "type": PROBLEM_TYPE + code,
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    body.update(extra)
    request_id = requestids.current()
    if request_id is not None:
        body["request_id"] = request_id
    return body


def _flatten(detail: Any, path: str = "") -> list[dict[str, str]]:
    """DRF's nested validation errors as a list of JSON-pointer paths and messages."""
    if isinstance(detail, dict):
        found = []
        for key, value in detail.items():
            child = path if key == "non_field_errors" else f"{path}/{key}"
            found.extend(_flatten(value, child))
        return found
    if isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            return [{"path": path or "/", "message": str(item)} for item in detail]
        found = []
        for index, item in enumerate(detail):
            found.extend(_flatten(item, f"{path}/{index}"))
        return found
    return [{"path": path or "/", "message": str(detail)}]


_DRF_CODES: list[tuple[type[drf.APIException], str]] = [
    (drf.NotAuthenticated, "not_authenticated"),
    (drf.AuthenticationFailed, "not_authenticated"),
    (drf.NotFound, "not_found"),
    (drf.MethodNotAllowed, "method_not_allowed"),
    (drf.UnsupportedMediaType, "unsupported_media_type"),
    (drf.NotAcceptable, "not_acceptable"),
    (drf.ParseError, "malformed_json"),
    (drf.PermissionDenied, "forbidden"),
]


# The title of each code, in words. DRF's ``default_detail`` is no title: some are
# templates (``Method "{method}" not allowed.``) that only the detail fills in.
_DRF_TITLES = {
    "not_authenticated": "The request is not authenticated",
    "not_found": "Not found",
    "method_not_allowed": "This method is not allowed on this path",
    "unsupported_media_type": "The request body's media type is not supported",
    "not_acceptable": "The Accept header excludes JSON",
    "malformed_json": "The request body is not acceptable JSON",
    "forbidden": "This token's scope does not allow the request",
    "invalid_request": "The request body is not valid",
}


# What the handlers below answer with codes of their own, beside every ``Refusal`` and
# the DRF exceptions above: a crash, and the body Django found too large to read.
_HANDLER_CODES = {"internal_error": 500, "payload_too_large": 413, "not_found": 404}


def _subclasses(cls: type[Refusal]) -> Iterator[type[Refusal]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def problem_codes() -> dict[str, int]:
    """Every ``code`` an API problem can carry, with its status: the list the clients'
    typed errors are held to (docs/api.md, "Errors").

    Each ``Refusal`` (the domain errors of both apps and the policy refusal), each DRF
    exception the handler maps, and the handlers' own codes. A code has one status;
    tests/operations/test_problem_codes.py finds every ``problem()`` call and ``Refusal``
    in the source and holds this list to them.
    """
    from ..policies import errors as policy_errors  # noqa: F401  (a Refusal of its own)

    codes = {Refusal.code: Refusal.status}
    for cls in _subclasses(Refusal):
        if cls.__module__.split(".")[0] in {"approvals", "operations", "console"}:
            codes[cls.code] = cls.status
    for exc, code in _DRF_CODES:  # not_authenticated: 401 for both classes
        codes[code] = exc.status_code
    codes.update(_HANDLER_CODES)
    return dict(sorted(codes.items()))


def _response(body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    response = Response(body, status=body["status"], content_type=CONTENT_TYPE)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    if isinstance(exc, drf.Throttled):
        # DRF's throttle refusal is ours to word, with the wait every waiting refusal
        # has. DRF rounds the throttle's wait up to whole seconds (``wait``; its stubs do
        # not declare it).
        wait_s = max(1, int(getattr(exc, "wait", None) or 1))
        exc = RateLimited(
            f"This token sent more requests than its rate allows; try again in {wait_s} s.",
            retry_after_ms=wait_s * 1000,
        )
    if isinstance(exc, Refusal):
        extra = dict(exc.extra)
        headers = {}
        if "retry_after_ms" in extra:
            headers["Retry-After"] = str(max(1, -(-extra["retry_after_ms"] // 1000)))
        return _response(problem(exc.status, exc.code, exc.title, exc.detail, **extra), headers)
    if isinstance(exc, Http404):
        return _response(problem(404, "not_found", "Not found", "Nothing is here."))
    if isinstance(exc, PermissionDenied):
        exc = drf.PermissionDenied()
    if isinstance(exc, RequestDataTooBig):
        return _response(
            problem(413, "payload_too_large", "Payload too large", "The request body is too large.")
        )
    if isinstance(exc, drf.ValidationError):
        return _response(
            problem(
                400,
                "invalid_request",
                "The request body is not valid",
                "One or more fields are invalid; see errors.",
                errors=_flatten(exc.detail),
            )
        )
    if isinstance(exc, drf.APIException):
        code = next((c for cls, c in _DRF_CODES if isinstance(exc, cls)), "invalid_request")
        headers = {}
        if isinstance(exc, drf.NotAuthenticated | drf.AuthenticationFailed):
            headers["WWW-Authenticate"] = 'Bearer realm="effectgate"'
            exc.status_code = 401
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if isinstance(exc, drf.NotAuthenticated):
            # DRF's sentence ("Authentication credentials were not provided") does not
            # say what to send.
            detail = f"No runner token was sent: {SEND_BEARER} ({ISSUING})."
        elif isinstance(exc, drf.UnsupportedMediaType):
            detail = f"{detail} {SEND_JSON}"
        return _response(problem(exc.status_code, code, _DRF_TITLES[code], detail), headers)
    view = context.get("view")
    logger.exception("Unhandled error in %s", type(view).__name__ if view else "API view")
    return _response(
        problem(500, "internal_error", "Internal error", "The server failed; nothing is known.")
    )


def _json_problem(body: dict[str, Any]) -> JsonResponse:
    return JsonResponse(body, status=body["status"], content_type=CONTENT_TYPE)


@csrf_exempt
def api_not_found(request, *args: Any, **kwargs: Any) -> JsonResponse:
    """Any other path under /api/v<n>/, whatever the method and DEBUG: a problem, never
    an HTML page (Django's own 404 handler is not used while DEBUG is on)."""
    return _json_problem(problem(404, "not_found", "Not found", "No such API resource."))


def is_api_request(request: HttpRequest) -> bool:
    return request.path_info.startswith("/api/")


def api_handler400(
    request: HttpRequest, exception: Exception | None = None, *, title: str = ""
) -> HttpResponse:
    """A request refused before any view (``BadRequest``, or what Django finds
    suspicious): a problem under /api/, a message page in the console. Only a
    ``BadRequest``'s own sentence is shown; Django's other refusals name settings.
    ``title`` names the part of the request at fault, when the caller knows it."""
    detail = str(exception) if isinstance(exception, BadRequest) else ""
    detail = detail or "The request cannot be read."
    if is_api_request(request):
        return _json_problem(
            problem(400, "invalid_request", title or "The request is not valid", detail)
        )
    return render(request, "400.html", {"detail": detail}, status=400)


def api_handler404(request, exception=None):
    from django.views.defaults import page_not_found

    if is_api_request(request):
        return api_not_found(request)
    return page_not_found(request, exception)


def api_handler500(request):
    from django.views.defaults import server_error

    if is_api_request(request):
        return _json_problem(
            problem(500, "internal_error", "Internal error", "The server failed; nothing is known.")
        )
    return server_error(request)
