"""The transparency log's API (api.md, The transparency log): checkpoints, inclusion and
consistency proofs, and the log's public key at ``/.well-known/effectgate-audit-key``.

Runners authenticate with their token; people signed in to the console with their
session. An inclusion proof is for an event the caller may see (a runner: its own
operations', runs' and streams'; a person: ``selectors.events_for_user``), any other
answers 404 as if it did not exist. Checkpoints and consistency proofs say nothing of
any event: any authenticated caller reads them.
"""

import logging
from typing import Any, cast

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import permissions
from rest_framework.authentication import SessionAuthentication
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.people import Person

from .. import params, payloads, selectors
from ..errors import InvalidQuery
from ..models import Runner, RunnerToken
from ..strictjson import MAX_SAFE_INTEGER
from ..tlog import keys
from .authentication import IsRunner, RunnerTokenAuthentication
from .problems import CONTENT_TYPE, problem
from .serializers import CheckpointOut, ConsistencyProofOut, InclusionProofOut

PROBLEM = OpenApiResponse(
    description="RFC 9457 problem details (application/problem+json) with a stable `code`."
)
PEM_TYPE = "application/x-pem-file"
logger = logging.getLogger(__name__)


class RunnerOrPerson(permissions.BasePermission):
    """A runner token (with ``required_scope``, as ``IsRunner`` checks it) or a person
    signed in to the console: an active account that is no runner's service user."""

    def has_permission(self, request: Any, view: Any) -> bool:
        user = request.user
        if isinstance(user, Runner):
            return IsRunner().has_permission(request, view)
        return bool(
            user is not None
            and user.is_authenticated
            and user.is_active
            and not hasattr(user, "runner_account")
        )


class AuditView(APIView):
    # The bearer token first: a request with neither is answered 401 with its
    # WWW-Authenticate header, as every other endpoint answers.
    authentication_classes = [RunnerTokenAuthentication, SessionAuthentication]
    permission_classes = [RunnerOrPerson]
    # Reading checkpoints and proofs is part of both jobs of a token.
    required_scope = RunnerToken.SCOPE_REGISTER_CONTRACTS


def _problems(*statuses: int) -> dict[int, OpenApiResponse]:
    return {status: PROBLEM for status in (401, *statuses)}


SIZE_SCHEMA = {"type": "integer", "minimum": 1, "maximum": MAX_SAFE_INTEGER}


def _size(request: Request, name: str) -> int | None:
    """The tree size in the query parameter ``name``, or None when it is absent."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    value = params.parse_count(raw, minimum=1, maximum=MAX_SAFE_INTEGER)
    if value is None:
        raise _size_refused(name, "not valid")
    return value


def _size_required(request: Request, name: str) -> int:
    value = _size(request, name)
    if value is None:
        raise _size_refused(name, "missing")
    return value


def _size_refused(name: str, why: str) -> InvalidQuery:
    must = "Must be a tree size: an integer of at least 1."
    return InvalidQuery(
        f"The query parameter {name} is {why}: {must[0].lower()}{must[1:]}",
        errors=[{"path": name, "message": must}],
    )


def _known_only(request: Request, known: set[str]) -> None:
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        takes = f"this endpoint takes {', '.join(sorted(known)) or 'none'}"
        raise InvalidQuery(
            f"Unknown query parameter {', '.join(repr(name[:40]) for name in unknown)}: {takes}.",
            errors=[
                {"path": name, "message": f"Unknown query parameter; {takes}."} for name in unknown
            ],
        )


class CheckpointLatestView(AuditView):
    @extend_schema(
        responses={200: CheckpointOut, **_problems(400, 404)},
        tags=["audit"],
        description="The latest signed checkpoint of the transparency log (api.md, The "
        "transparency log); 404 until one is signed.",
    )
    def get(self, request: Request) -> Response:
        _known_only(request, set())
        checkpoint = selectors.checkpoint_latest()
        if checkpoint is None:
            selectors.checkpoint_get(0)  # the 404 that says no checkpoint was signed
        return Response(CheckpointOut(checkpoint).data)


class CheckpointDetailView(AuditView):
    @extend_schema(
        responses={200: CheckpointOut, **_problems(400, 404)},
        tags=["audit"],
        description="The checkpoint signed at this tree size.",
    )
    def get(self, request: Request, size: int) -> Response:
        _known_only(request, set())
        return Response(CheckpointOut(selectors.checkpoint_get(size)).data)


class InclusionView(AuditView):
    required_scope = RunnerToken.SCOPE_USE_TOOLS

    @extend_schema(
        parameters=[OpenApiParameter("size", SIZE_SCHEMA)],
        responses={200: InclusionProofOut, **_problems(400, 403, 404, 409)},
        tags=["audit"],
        description="The proof that the event is in the tree of `size` leaves (default: "
        "the latest checkpoint's). 409 `not_sealed` while the sealer has not appended it; "
        "404 for a size the log has not reached.",
    )
    def get(self, request: Request, event_id: int) -> Response:
        _known_only(request, {"size"})
        size = _size(request, "size")
        if isinstance(request.user, Runner):
            event = selectors.event_get_for_runner(runner=request.user, event_id=event_id)
        else:
            # RunnerOrPerson admitted a signed-in person, never an anonymous one.
            person = cast(Person, request.user)
            event = selectors.event_get_for_user(user=person, event_id=event_id)
        proof = selectors.inclusion_proof(event=event, size=size)
        return Response(
            {
                "event": proof.event,
                "leaf_index": proof.leaf_index,
                "size": proof.size,
                "hashes": [payloads.b64(value) for value in proof.hashes],
            }
        )


class ConsistencyView(AuditView):
    @extend_schema(
        parameters=[
            OpenApiParameter("first", SIZE_SCHEMA, required=True),
            OpenApiParameter("second", SIZE_SCHEMA, required=True),
        ],
        responses={200: ConsistencyProofOut, **_problems(400, 404)},
        tags=["audit"],
        description="The proof that the tree of `first` leaves is a prefix of the tree of "
        "`second` leaves (RFC 9162 §2.1.4): what a witness checks between two checkpoints. "
        "404 for a size the log has not reached, or `first` larger than `second`.",
    )
    def get(self, request: Request) -> Response:
        _known_only(request, {"first", "second"})
        first, second = _size_required(request, "first"), _size_required(request, "second")
        hashes = selectors.consistency_proof(first=first, second=second)
        return Response(
            {"first": first, "second": second, "hashes": [payloads.b64(h) for h in hashes]}
        )


@require_GET
def audit_key(request: HttpRequest) -> HttpResponse:
    """``/.well-known/effectgate-audit-key``: the public key that verifies the log's
    checkpoints, as PEM, for anyone; a 404 problem while no key is configured."""
    try:
        key = keys.public_key()
    except ImproperlyConfigured as exc:
        # The refusal names the setting, never the key's text.
        logger.error("The audit key cannot be published: %s", exc)
        body = problem(
            500, "internal_error", "Internal error", "The server's audit key is misconfigured."
        )
        return JsonResponse(body, status=500, content_type=CONTENT_TYPE)
    if key is None:
        body = problem(
            404, "not_found", "Not found", "No audit signing key is configured on this server."
        )
        return JsonResponse(body, status=404, content_type=CONTENT_TYPE)
    return HttpResponse(keys.public_key_pem(key), content_type=PEM_TYPE)
