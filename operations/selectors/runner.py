"""Reads for the runner API: a runner sees only its own runs and operations; anything
else answers ``not_found``, never ``forbidden``, so ids of other runners' objects cannot
be probed."""

from django.db.models import (
    F,
    Prefetch,
    QuerySet,
)

from approvals.models import ApprovalRequest
from approvals.people import Person

from .. import access
from ..errors import NotFound
from ..models import (
    Event,
    Operation,
    OutboxMessage,
    Run,
    Runner,
    Tool,
    ToolVersion,
    WebhookEndpoint,
)


def with_approvals(queryset: QuerySet[Operation]) -> QuerySet[Operation]:
    return queryset.select_related("tool_version", "run").prefetch_related(
        Prefetch(
            "approval_requests",
            queryset=ApprovalRequest.objects.select_related(
                "grant__standing_grant"
            ).prefetch_related("decisions__user", "grant__standing_grant__signatures__user"),
        )
    )


def run_get_for_runner(*, runner: Runner, run_id: str) -> Run:
    run = Run.objects.filter(pk=run_id, runner=runner).first()
    if run is None:
        raise NotFound(f"No run {run_id!r}.")
    return run


def operation_get_for_runner(*, runner: Runner, operation_id: str) -> Operation:
    op = with_approvals(Operation.objects.filter(pk=operation_id, runner=runner)).first()
    if op is None:
        raise NotFound(f"No operation {operation_id!r}.")
    return op


def operation_refresh(op: Operation) -> Operation:
    """The operation as stored now, with what its representation needs."""
    return with_approvals(Operation.objects.filter(pk=op.pk)).get()


def operations_for_runner(
    *,
    runner: Runner,
    status: str | None = None,
    run_id: str | None = None,
    tool: str | None = None,
) -> QuerySet[Operation]:
    queryset = Operation.objects.filter(runner=runner)
    if status:
        queryset = queryset.filter(status=status)
    if run_id:
        queryset = queryset.filter(run_id=run_id)
    if tool:
        queryset = queryset.filter(tool_id=tool)
    return with_approvals(queryset)


def approval_get_for_runner(*, runner: Runner, approval_id: str) -> ApprovalRequest:
    request = (
        ApprovalRequest.objects.select_related("grant__standing_grant", "operation")
        .prefetch_related("decisions__user", "grant__standing_grant__signatures__user")
        .filter(pk=approval_id, operation__runner=runner)
        .first()
    )
    if request is None:
        raise NotFound(f"No approval {approval_id!r}.")
    return request


def outbox_message_get_for_user(*, user: Person, message_id: str) -> OutboxMessage:
    message = (
        OutboxMessage.objects.filter(pk=message_id, operation__tool__in=access.tools_for_user(user))
        .select_related("operation")
        .first()
    )
    if message is None:
        raise NotFound(f"No webhook message {message_id!r}.")
    return message


def webhook_endpoints_for_runner(*, runner: Runner) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(runner=runner).order_by("created_at")


def webhook_endpoint_get_for_runner(*, runner: Runner, endpoint_id: str) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id, runner=runner).first()
    if endpoint is None:
        raise NotFound(f"No webhook endpoint {endpoint_id!r}.")
    return endpoint


def events_for_operation(op: Operation) -> QuerySet[Event]:
    return Event.objects.filter(stream=op.id).order_by("seq")


def tool_get(name: str) -> Tool:
    tool = Tool.objects.select_related("active_version").filter(pk=name).first()
    if tool is None:
        raise NotFound(f"No tool {name!r}.")
    return tool


def runners_active() -> QuerySet[Runner]:
    return Runner.objects.filter(is_active=True).order_by("name")


def runner_get_by_name(name: str) -> Runner:
    runner = Runner.objects.filter(name=name).select_related("service_user").first()
    if runner is None:
        raise NotFound(f"No runner {name!r}.")
    return runner


def tool_versions_active() -> QuerySet[ToolVersion]:
    """The version in force of every tool that has one, with what ``ToolOut`` reads
    (the tool, its owner and active version) in the same query; every runner may read
    contracts."""
    return ToolVersion.objects.filter(tool__active_version=F("pk")).select_related(
        "tool__owner", "tool__active_version"
    )
