"""The runner REST API (api.md). Views parse, call one service, render."""

import re
from typing import Any, cast

from django.urls import path
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import params, payloads, selectors, services
from ..errors import InvalidQuery, NotFound
from ..machine import Status
from ..models import Runner, RunnerToken
from . import answers, audit, hot, openapi, problems
from .serializers import (
    ApprovalDetailOut,
    AttemptOut,
    CompensationIn,
    EventOut,
    HeartbeatOut,
    InboundOut,
    LeaseIn,
    OperationCreatedOut,
    OperationIn,
    OperationOut,
    OperationPageOut,
    OutcomeAnswerOut,
    OutcomeIn,
    OutcomeItemIn,
    ReconciliationIn,
    RunIn,
    RunOut,
    StrictSerializer,
    ToolInvokerOut,
    ToolOut,
    ToolPageOut,
    ToolResultOut,
    WebhookEndpointCreatedOut,
    WebhookEndpointIn,
    WebhookEndpointOut,
    tool_result,
)

# Matched in full (``fullmatch``): with ``match``, ``$`` also matches before a final
# newline, so "nltool\n" (and a 101-character name ending in one) passed.
TOOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")

PROBLEM = OpenApiResponse(
    description="RFC 9457 problem details (application/problem+json) with a stable `code`."
)


def _problems(*statuses: int) -> dict[int, OpenApiResponse]:
    return {status: PROBLEM for status in (401, *statuses)}


def _runner(request: Request) -> Runner:
    """The runner making the request: IsRunner admits no one else, and
    RunnerTokenAuthentication puts the Runner itself (not a User) on ``request.user``."""
    return cast(Runner, request.user)


def _valid(serializer_class, request: Request) -> dict[str, Any]:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _serializer_validate(serializer_class: type[StrictSerializer], raw: Any) -> dict[str, Any]:
    serializer = serializer_class(data=raw)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _problem_body(exc: Exception, view: APIView, request: Request) -> dict[str, Any]:
    """``exc`` as the problem the single call answers (a batch item's)."""
    return dict(problems.exception_handler(exc, {"view": view, "request": request}).data)


def _bad_parameter(name: str, must: str) -> InvalidQuery:
    """The refusal of the query parameter ``name``; ``must`` says what it takes."""
    return InvalidQuery(
        f"The query parameter {name} is not valid: {must[0].lower()}{must[1:]}",
        errors=[{"path": name, "message": must}],
    )


class Pagination(CursorPagination):
    """The lists' one paging: an opaque cursor, ``limit`` 1 to 200 (default 50), and
    ``{"results", "next", "previous"}``; newest first unless a list orders otherwise."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 200

    # DRF would ignore a bad limit; it is the client's mistake, answered 400 like every
    # other invalid request. (A cursor this API did not give out is a 404.)
    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        size = params.parse_count(raw, minimum=1, maximum=self.max_page_size)
        if size is None:
            raise _bad_parameter("limit", f"Must be an integer from 1 to {self.max_page_size}.")
        return size


class ToolPagination(Pagination):
    # By name: a tool's name is its identity, and a runner looks contracts up by name.
    ordering = "tool_id"


PAGE_PARAMETERS = [
    OpenApiParameter("cursor", str),
    OpenApiParameter(
        "limit", {"type": "integer", "minimum": 1, "maximum": Pagination.max_page_size}
    ),
]


def _known_parameters_only(request: Request, known: set[str]) -> None:
    # Like unknown body fields: a misspelt filter must not silently list everything.
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        takes = f"this list takes {', '.join(sorted(known))}"
        raise InvalidQuery(
            f"Unknown query parameter {', '.join(repr(name[:40]) for name in unknown)}: {takes}.",
            errors=[
                {"path": name, "message": f"Unknown query parameter; {takes}."} for name in unknown
            ],
        )


def _one_of(request: Request, name: str, allowed: list[str]) -> str | None:
    """The query parameter ``name``, refused unless it is one of ``allowed``: a misspelt
    status must not silently list nothing."""
    value = request.query_params.get(name)
    if value is None or value in allowed:
        return value
    raise _bad_parameter(name, f"Must be one of: {', '.join(allowed)}.")


# --- tools ------------------------------------------------------------------------------


class ToolListView(APIView):
    # Contracts are readable with either scope (operations.http.authentication.IsRunner).
    required_scope = RunnerToken.SCOPE_REGISTER_CONTRACTS

    @extend_schema(
        parameters=PAGE_PARAMETERS,
        responses={200: ToolPageOut, **_problems(400, 404)},
        tags=["tools"],
        operation_id="tools_list",
        description="The tools that have an active version, each as that version, by "
        "name, a page at a time (api.md, Tools).",
    )
    def get(self, request: Request) -> Response:
        _known_parameters_only(request, {"cursor", "limit"})
        paginator = ToolPagination()
        page = paginator.paginate_queryset(selectors.tool_versions_active(), request, view=self)
        return paginator.get_paginated_response(ToolOut(page, many=True).data)


class ToolDetailView(APIView):
    required_scope = RunnerToken.SCOPE_REGISTER_CONTRACTS

    @extend_schema(responses={200: ToolOut, **_problems(404)}, tags=["tools"])
    def get(self, request: Request, name: str) -> Response:
        tool = selectors.tool_get(name)
        if tool.active_version is None:
            raise NotFound(
                f"Tool {name} has no active version: it waits for a person to activate one."
            )
        return Response(ToolOut(tool.active_version).data)

    @extend_schema(
        request={"application/json": openapi.CONTRACT_REQUEST_SCHEMA},
        responses={200: ToolOut, 201: ToolOut, **_problems(400, 403, 404, 422)},
        tags=["tools"],
        description="Register or change a tool contract (api.md, Tools). A version that "
        "weakens the active contract, or that the server's HOLD_NEW_TOOLS holds, is stored "
        "inactive until a person activates it (`active`, `weakens`).",
    )
    def put(self, request: Request, name: str) -> Response:
        if not TOOL_NAME.fullmatch(name):
            raise NotFound("Tool names are 1-100 letters, digits, '_', '.' or '-'.")
        registration = services.tool_register(name=name, body=request.data, runner=_runner(request))
        version = registration.version
        version.tool.refresh_from_db()
        return Response(ToolOut(version).data, status=201 if registration.created else 200)


class ToolInvokerView(APIView):
    """The tool's owner allows another runner to invoke it, or takes that away."""

    required_scope = RunnerToken.SCOPE_REGISTER_CONTRACTS

    def _set(self, request: Request, name: str, runner_name: str, allow: bool) -> Response:
        tool = selectors.tool_get(name)
        other = selectors.runner_get_by_name(runner_name)
        services.tool_invoker_set(
            tool=tool, runner=other, allow=allow, actor=services.Actor.of_runner(_runner(request))
        )
        return Response({"tool": tool.name, "runner": other.name, "allowed": allow})

    @extend_schema(
        request=None,
        responses={200: ToolInvokerOut, **_problems(403, 404)},
        tags=["tools"],
        description="Allow another runner to invoke this tool (owner only; api.md, Tools).",
    )
    def put(self, request: Request, name: str, runner_name: str) -> Response:
        return self._set(request, name, runner_name, allow=True)

    @extend_schema(
        request=None,
        responses={200: ToolInvokerOut, **_problems(403, 404)},
        tags=["tools"],
        description="Stop another runner from invoking this tool (owner only).",
    )
    def delete(self, request: Request, name: str, runner_name: str) -> Response:
        return self._set(request, name, runner_name, allow=False)


# --- runs -------------------------------------------------------------------------------


class RunListView(APIView):
    @extend_schema(request=RunIn, responses={201: RunOut, **_problems(400)}, tags=["runs"])
    def post(self, request: Request) -> Response:
        data = _valid(RunIn, request)
        run = services.run_create(
            runner=_runner(request),
            principal=data["principal"],
            external_id=data.get("external_id", ""),
            budgets=dict(data.get("budgets", {})),
        )
        return Response(RunOut(run).data, status=201)


class RunDetailView(APIView):
    @extend_schema(responses={200: RunOut, **_problems(404)}, tags=["runs"])
    def get(self, request: Request, run_id: str) -> Response:
        run = selectors.run_get_for_runner(runner=_runner(request), run_id=run_id)
        return Response(RunOut(run).data)


class RunCancelView(APIView):
    @extend_schema(request=None, responses={200: RunOut, **_problems(404)}, tags=["runs"])
    def post(self, request: Request, run_id: str) -> Response:
        run = selectors.run_get_for_runner(runner=_runner(request), run_id=run_id)
        run = services.run_cancel(run=run, actor=services.Actor.of_runner(_runner(request)))
        return Response(RunOut(run).data)


# --- operations -------------------------------------------------------------------------


def _operation_body(op, *, fresh: bool = False) -> dict[str, Any]:
    """The operation's representation (``payloads.operation``, which ``OperationOut``
    declares). ``fresh``: ``op`` is what the request's own transaction wrote, so it is
    rendered as it is, without reading it back."""
    return payloads.operation(op if fresh else selectors.operation_refresh(op))


LIST_PARAMETERS = {"status", "run", "tool", "cursor", "limit"}
STATUSES = [status.value for status in Status]


class OperationListView(APIView):
    def get_throttles(self) -> list[Any]:
        throttles = super().get_throttles()
        if self.request.method == "POST" and isinstance(self.request.data, list):
            for throttle in throttles:  # a batch counts its items (api.md, Batches)
                throttle.cost = max(1, len(self.request.data))
        return throttles

    @extend_schema(
        request=OperationIn,
        responses={
            200: OperationCreatedOut,
            201: OperationCreatedOut,
            **_problems(400, 403, 404, 409, 422),
        },
        tags=["operations"],
        description="Register an intended side effect (api.md, Operations). 201 new, 200 "
        "the same operation_key with the same intent. A JSON array of 1 to 50 such bodies "
        "is a batch (api.md, Batches): 200 with each item's status and operation or "
        "problem, in order; each item is registered on its own.",
    )
    def post(self, request: Request) -> Response:
        traceparent = request.headers.get("traceparent", "")
        if isinstance(request.data, list):
            body, status = answers.register_batch(
                runner=_runner(request),
                raw=request.data,
                validate=_serializer_validate,
                traceparent=traceparent,
                problem_of=lambda exc: _problem_body(exc, self, request),
            )
        else:
            body, status = answers.register(
                runner=_runner(request),
                raw=request.data,
                validate=_serializer_validate,
                traceparent=traceparent,
            )
        return Response(body, status=status)

    @extend_schema(
        parameters=[
            OpenApiParameter("status", str, enum=STATUSES),
            OpenApiParameter("run", str),
            OpenApiParameter("tool", str),
            *PAGE_PARAMETERS,
        ],
        responses={200: OperationPageOut, **_problems(400, 404)},
        tags=["operations"],
        operation_id="operations_list",
    )
    def get(self, request: Request) -> Response:
        _known_parameters_only(request, LIST_PARAMETERS)
        queryset = selectors.operations_for_runner(
            runner=_runner(request),
            status=_one_of(request, "status", STATUSES),
            run_id=request.query_params.get("run"),
            tool=request.query_params.get("tool"),
        )
        paginator = Pagination()
        page = paginator.paginate_queryset(queryset, request, view=self)
        return paginator.get_paginated_response(OperationOut(page, many=True).data)


class OperationDetailView(APIView):
    @extend_schema(responses={200: OperationOut, **_problems(404)}, tags=["operations"])
    def get(self, request: Request, operation_id: str) -> Response:
        op = selectors.operation_get_for_runner(runner=_runner(request), operation_id=operation_id)
        return Response(OperationOut(op).data)


class OperationEventsView(APIView):
    @extend_schema(responses={200: EventOut(many=True), **_problems(404)}, tags=["operations"])
    def get(self, request: Request, operation_id: str) -> Response:
        op = selectors.operation_get_for_runner(runner=_runner(request), operation_id=operation_id)
        return Response(EventOut(selectors.events_for_operation(op), many=True).data)


class ToolResultView(APIView):
    @extend_schema(responses={200: ToolResultOut, **_problems(404)}, tags=["operations"])
    def get(self, request: Request, operation_id: str) -> Response:
        op = selectors.operation_get_for_runner(runner=_runner(request), operation_id=operation_id)
        return Response(tool_result(op))


class AttemptListView(APIView):
    @extend_schema(
        request=LeaseIn,
        responses={201: AttemptOut, **_problems(403, 404, 409)},
        tags=["attempts"],
        description="Claim the next attempt. Refusals in api.md's order.",
    )
    def post(self, request: Request, operation_id: str) -> Response:
        body, status = answers.claim(
            runner=_runner(request),
            operation_id=operation_id,
            raw=request.data,
            validate=_serializer_validate,
        )
        return Response(body, status=status)


class HeartbeatView(APIView):
    @extend_schema(
        request=LeaseIn, responses={200: HeartbeatOut, **_problems(404, 409)}, tags=["attempts"]
    )
    def post(self, request: Request, operation_id: str, number: int) -> Response:
        body, status = answers.heartbeat(
            runner=_runner(request),
            operation_id=operation_id,
            number=number,
            raw=request.data,
            validate=_serializer_validate,
        )
        return Response(body, status=status)


class OutcomeView(APIView):
    @extend_schema(
        request=OutcomeIn,
        responses={200: OutcomeAnswerOut, **_problems(400, 404, 409)},
        tags=["attempts"],
        description="Post what an attempt did. The answer is the operation with "
        "`tool_result`, the envelope `GET .../tool-result` gives.",
    )
    def post(self, request: Request, operation_id: str, number: int) -> Response:
        body, status = answers.outcome(
            runner=_runner(request),
            operation_id=operation_id,
            number=number,
            raw=request.data,
            validate=_serializer_validate,
        )
        return Response(body, status=status)


class RunOutcomesView(APIView):
    def get_throttles(self) -> list[Any]:
        throttles = super().get_throttles()
        if isinstance(self.request.data, list):
            for throttle in throttles:  # a batch counts its items (api.md, Batches)
                throttle.cost = max(1, len(self.request.data))
        return throttles

    @extend_schema(
        request=OutcomeItemIn(many=True),
        responses={200: openapi.OUTCOME_BATCH_ANSWER, **_problems(400, 404)},
        tags=["attempts"],
        operation_id="runs_outcomes_create",
        description="Post what several attempts of the run did, 1 to 50 outcomes (api.md, "
        "Batches): 200 with each item's status and operation (with `tool_result`) or "
        "problem, in order; each item is recorded on its own. An operation that is not of "
        "this run is an item's 404.",
    )
    def post(self, request: Request, run_id: str) -> Response:
        body, status = answers.outcome_batch(
            runner=_runner(request),
            run_id=run_id,
            raw=request.data,
            validate=_serializer_validate,
            problem_of=lambda exc: _problem_body(exc, self, request),
        )
        return Response(body, status=status)


class ReconciliationView(APIView):
    @extend_schema(
        request=ReconciliationIn,
        responses={200: OperationOut, **_problems(400, 404, 409)},
        tags=["reconciliation"],
    )
    def post(self, request: Request, operation_id: str) -> Response:
        op = selectors.operation_get_for_runner(runner=_runner(request), operation_id=operation_id)
        data = _valid(ReconciliationIn, request)
        op = services.operation_reconcile(
            operation=op,
            result=data["result"],
            downstream_id=data.get("downstream_id", ""),
            evidence=data.get("evidence"),
            actor=services.Actor.of_runner(_runner(request)),
            source="runner",
        )
        return Response(_operation_body(op))


class CompensationView(APIView):
    @extend_schema(
        request=CompensationIn,
        responses={200: OperationOut, **_problems(400, 404, 409)},
        tags=["reconciliation"],
    )
    def post(self, request: Request, operation_id: str) -> Response:
        op = selectors.operation_get_for_runner(runner=_runner(request), operation_id=operation_id)
        data = _valid(CompensationIn, request)
        op = services.operation_compensate(
            operation=op,
            result=data["result"],
            evidence=data.get("evidence"),
            actor=services.Actor.of_runner(_runner(request)),
        )
        return Response(_operation_body(op))


class WebhookEndpointListView(APIView):
    @extend_schema(
        request=WebhookEndpointIn,
        responses={201: WebhookEndpointCreatedOut, **_problems(400, 422)},
        tags=["webhooks"],
        description="Register an endpoint. Its secret (whsec_...) is in this answer only.",
    )
    def post(self, request: Request) -> Response:
        data = _valid(WebhookEndpointIn, request)
        endpoint, secret = services.webhook_endpoint_create(
            runner=_runner(request), url=data["url"], events=data["events"]
        )
        body = {**WebhookEndpointOut(endpoint).data, "secret": secret}
        return Response(body, status=201)

    @extend_schema(responses={200: WebhookEndpointOut(many=True), **_problems()}, tags=["webhooks"])
    def get(self, request: Request) -> Response:
        endpoints = selectors.webhook_endpoints_for_runner(runner=_runner(request))
        return Response(WebhookEndpointOut(endpoints, many=True).data)


class WebhookEndpointDetailView(APIView):
    @extend_schema(responses={200: WebhookEndpointOut, **_problems(404)}, tags=["webhooks"])
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = selectors.webhook_endpoint_get_for_runner(
            runner=_runner(request), endpoint_id=endpoint_id
        )
        return Response(WebhookEndpointOut(endpoint).data)

    @extend_schema(responses={204: None, **_problems(404)}, tags=["webhooks"])
    def delete(self, request: Request, endpoint_id: str) -> Response:
        endpoint = selectors.webhook_endpoint_get_for_runner(
            runner=_runner(request), endpoint_id=endpoint_id
        )
        services.webhook_endpoint_delete(
            endpoint=endpoint, actor=services.Actor.of_runner(_runner(request))
        )
        return Response(status=204)


class WebhookSecretRotateView(APIView):
    @extend_schema(
        request=None,
        responses={200: WebhookEndpointCreatedOut, **_problems(404)},
        tags=["webhooks"],
        description="A new secret, shown once. For 24 hours deliveries carry a signature with "
        "the old secret and one with the new, so receivers can switch without losing events.",
    )
    def post(self, request: Request, endpoint_id: str) -> Response:
        endpoint = selectors.webhook_endpoint_get_for_runner(
            runner=_runner(request), endpoint_id=endpoint_id
        )
        secret = services.webhook_endpoint_rotate(
            endpoint=endpoint, actor=services.Actor.of_runner(_runner(request))
        )
        endpoint.refresh_from_db()
        return Response({**WebhookEndpointOut(endpoint).data, "secret": secret})


class InboundView(APIView):
    """Events a provider sends about effects (Standard Webhooks, signed per tool)."""

    authentication_classes: list = []
    permission_classes: list = []
    parser_classes: list = []

    @extend_schema(
        request={"application/json": {"type": "object"}},
        responses={200: InboundOut, **_problems(400, 404, 413)},
        tags=["inbound"],
        description="Signed with the tool's inbound secret (webhook-id, webhook-timestamp, "
        "webhook-signature). Recorded before anything else: a duplicate webhook-id answers "
        "200 with duplicate=true and changes nothing.",
    )
    def post(self, request: Request, tool: str) -> Response:
        receipt = services.inbound_receive(
            tool_name=tool,
            headers={name.lower(): value for name, value in request.headers.items()},
            body=request.body,
        )
        event = receipt.event
        return Response(
            {
                "id": event.id,
                "event_id": event.event_id,
                "status": event.status,
                "operation": event.operation_id,
                "duplicate": receipt.duplicate,
            }
        )


class ApprovalDetailView(APIView):
    @extend_schema(responses={200: ApprovalDetailOut, **_problems(404)}, tags=["approvals"])
    def get(self, request: Request, approval_id: str) -> Response:
        approval = selectors.approval_get_for_runner(
            runner=_runner(request), approval_id=approval_id
        )
        return Response(ApprovalDetailOut(approval).data)


urlpatterns = [
    path("tools", ToolListView.as_view()),
    path("tools/<str:name>", ToolDetailView.as_view()),
    path("tools/<str:name>/invokers/<str:runner_name>", ToolInvokerView.as_view()),
    path("runs", RunListView.as_view()),
    path("runs/<str:run_id>", RunDetailView.as_view()),
    path("runs/<str:run_id>/cancel", RunCancelView.as_view()),
    path(
        "runs/<str:run_id>/outcomes",
        hot.lean(RunOutcomesView.as_view(), hot.outcome_batch, "POST, OPTIONS"),
    ),
    # The hot endpoints: POST through their lean views (hot.py), the rest through DRF.
    path(
        "operations",
        hot.lean(OperationListView.as_view(), hot.register, "GET, POST, HEAD, OPTIONS"),
    ),
    path("operations/<str:operation_id>", OperationDetailView.as_view()),
    path("operations/<str:operation_id>/events", OperationEventsView.as_view()),
    path("operations/<str:operation_id>/tool-result", ToolResultView.as_view()),
    path(
        "operations/<str:operation_id>/attempts",
        hot.lean(AttemptListView.as_view(), hot.claim, "POST, OPTIONS"),
    ),
    path(
        "operations/<str:operation_id>/attempts/<count:number>/heartbeat",
        hot.lean(HeartbeatView.as_view(), hot.heartbeat, "POST, OPTIONS"),
    ),
    path(
        "operations/<str:operation_id>/attempts/<count:number>/outcome",
        hot.lean(OutcomeView.as_view(), hot.outcome, "POST, OPTIONS"),
    ),
    path("operations/<str:operation_id>/reconciliations", ReconciliationView.as_view()),
    path("operations/<str:operation_id>/compensations", CompensationView.as_view()),
    path("approvals/<str:approval_id>", ApprovalDetailView.as_view()),
    path("inbound/<str:tool>", InboundView.as_view()),
    path("webhook-endpoints", WebhookEndpointListView.as_view()),
    path("webhook-endpoints/<str:endpoint_id>", WebhookEndpointDetailView.as_view()),
    path("webhook-endpoints/<str:endpoint_id>/rotate-secret", WebhookSecretRotateView.as_view()),
    path("audit/checkpoints/latest", audit.CheckpointLatestView.as_view()),
    path("audit/checkpoints/<count:size>", audit.CheckpointDetailView.as_view()),
    path("audit/events/<count:event_id>/inclusion", audit.InclusionView.as_view()),
    path("audit/consistency", audit.ConsistencyView.as_view()),
]
