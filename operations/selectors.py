"""Reads shared by the API and the console. Access rules live here, not in views.

A runner sees only its own runs and operations: anything else answers ``not_found``,
never ``forbidden``, so ids of other runners' objects cannot be probed.
"""

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db.models import (
    Count,
    DurationField,
    Exists,
    ExpressionWrapper,
    F,
    Max,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
)
from django.db.models.functions import TruncDate
from django.utils import timezone
from guardian.shortcuts import get_groups_with_perms, get_objects_for_user, get_users_with_perms

from approvals.models import ApprovalRequest

from .errors import NotFound
from .machine import TERMINAL, Status
from .models import (
    Event,
    InboundEvent,
    Operation,
    OutboxMessage,
    Run,
    Runner,
    Tool,
    ToolVersion,
    WebhookEndpoint,
)


def _with_approvals(queryset: QuerySet[Operation]) -> QuerySet[Operation]:
    return queryset.select_related("tool_version", "run").prefetch_related(
        Prefetch(
            "approval_requests",
            queryset=ApprovalRequest.objects.select_related("grant").prefetch_related(
                "decisions__user"
            ),
        )
    )


def run_get_for_runner(*, runner: Runner, run_id: str) -> Run:
    run = Run.objects.filter(pk=run_id, runner=runner).first()
    if run is None:
        raise NotFound(f"No run {run_id!r}.")
    return run


def operation_get_for_runner(*, runner: Runner, operation_id: str) -> Operation:
    op = _with_approvals(Operation.objects.filter(pk=operation_id, runner=runner)).first()
    if op is None:
        raise NotFound(f"No operation {operation_id!r}.")
    return op


def operation_refresh(op: Operation) -> Operation:
    """The operation as stored now, with what its representation needs."""
    return _with_approvals(Operation.objects.filter(pk=op.pk)).get()


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
    return _with_approvals(queryset)


def approval_get_for_runner(*, runner: Runner, approval_id: str) -> ApprovalRequest:
    request = (
        ApprovalRequest.objects.select_related("grant", "operation")
        .prefetch_related("decisions__user")
        .filter(pk=approval_id, operation__runner=runner)
        .first()
    )
    if request is None:
        raise NotFound(f"No approval {approval_id!r}.")
    return request


def outbox_message_get_for_user(*, user: Any, message_id: str) -> OutboxMessage:
    message = (
        OutboxMessage.objects.filter(pk=message_id, operation__tool__in=tools_for_user(user))
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


def tools_all() -> QuerySet[Tool]:
    return Tool.objects.select_related("active_version").prefetch_related("versions")


# --- people (the console) ------------------------------------------------------------

DECIDE = "operations.decide_tool"
RECONCILE = "operations.reconcile_tool"


def tools_for_user(user: Any, perms: list[str] | None = None) -> QuerySet[Tool]:
    """Tools on which ``user`` holds any of ``perms`` (object, group or global)."""
    if not user.is_active:
        return Tool.objects.none()
    return get_objects_for_user(
        user, perms or [DECIDE, RECONCILE], klass=Tool, any_perm=True, accept_global_perms=True
    )


def operations_for_user(user: Any) -> QuerySet[Operation]:
    """Operations a person may see: those of tools they may decide on or reconcile."""
    return Operation.objects.filter(tool__in=tools_for_user(user))


def operation_get_for_user(*, user: Any, operation_id: str) -> Operation:
    op = _with_approvals(operations_for_user(user).filter(pk=operation_id)).first()
    if op is None:
        raise NotFound(f"No operation {operation_id!r}.")
    return op


def requests_pending_for_user(
    *,
    user: Any,
    tool: str | None = None,
    effect_class: str | None = None,
    run: str | None = None,
) -> QuerySet[ApprovalRequest]:
    """The inbox: pending requests the user may decide on, most urgent first."""
    queryset = (
        ApprovalRequest.objects.filter(
            status=ApprovalRequest.RequestStatus.PENDING,
            operation__tool__in=tools_for_user(user, [DECIDE]),
        )
        .select_related("operation", "operation__run", "operation__tool_version")
        .prefetch_related("decisions")
        .order_by("expires_at", "created_at", "id")
    )
    if tool:
        queryset = queryset.filter(operation__tool_id=tool)
    if effect_class:
        queryset = queryset.filter(operation__effect_class=effect_class)
    if run:
        queryset = queryset.filter(operation__run_id=run)
    return queryset


def approval_get_for_user(*, user: Any, approval_id: str) -> ApprovalRequest:
    request = (
        ApprovalRequest.objects.filter(pk=approval_id, operation__tool__in=tools_for_user(user))
        .select_related("grant", "operation", "operation__run", "operation__tool_version")
        .prefetch_related("decisions__user")
        .first()
    )
    if request is None:
        raise NotFound(f"No approval {approval_id!r}.")
    return request


def approval_comparison(request: ApprovalRequest) -> tuple[str, Operation] | None:
    """An earlier intent to compare this request with, and what it was.

    The same operation's earlier request when there is one (a new approval after a
    grant became invalid or reconciliation found nothing); otherwise the operation this
    one retries, or the latest earlier operation of the same tool in the same run.
    """
    op = request.operation
    if ApprovalRequest.objects.filter(operation=op, created_at__lt=request.created_at).exists():
        return ("an earlier request for this operation", op)
    if op.previous_id:
        return ("the operation this one retries", op.previous)
    earlier = (
        Operation.objects.filter(run_id=op.run_id, tool_id=op.tool_id, id__lt=op.id)
        .order_by("-id")
        .first()
    )
    if earlier is not None:
        return (f"the previous {op.tool_id} call in this run", earlier)
    return None


# --- the reconciliation queue -----------------------------------------------------------

SAVED_QUEUES = {
    "all": "Unknown and compensating",
    "unknown_15m": "Unknown > 15 min",
    "lease_expired": "Lease expired",
    "approved_unclaimed": "Approved but never claimed",
    "probes_failing": "Probes failing",
}
STALE_AFTER = timedelta(minutes=15)


def _queue(base: QuerySet[Operation], name: str, now: datetime) -> QuerySet[Operation]:
    unresolved = [Status.OUTCOME_UNKNOWN, Status.COMPENSATING]
    if name == "unknown_15m":
        return base.filter(status=Status.OUTCOME_UNKNOWN, status_changed_at__lte=now - STALE_AFTER)
    if name == "lease_expired":
        return base.filter(
            Q(status__in=unresolved, error_code="lease_expired")
            | Q(status=Status.EXECUTING, lease_until__lte=now)
        )
    if name == "approved_unclaimed":
        return base.filter(
            status=Status.READY,
            status_changed_at__lte=now - STALE_AFTER,
            approval_requests__status=ApprovalRequest.RequestStatus.APPROVED,
        ).distinct()
    if name == "probes_failing":
        return base.filter(status=Status.OUTCOME_UNKNOWN, probes__gte=1)
    return base.filter(status__in=unresolved)


def reconciliation_queue(
    *,
    user: Any,
    queue: str = "all",
    tool: str | None = None,
    effect_class: str | None = None,
    run: str | None = None,
    min_age_s: int | None = None,
    include_snoozed: bool = False,
    now: datetime | None = None,
) -> QuerySet[Operation]:
    """Operations that need a person's answer, oldest first."""
    now = now or timezone.now()
    base = Operation.objects.filter(tool__in=tools_for_user(user, [RECONCILE]))
    if tool:
        base = base.filter(tool_id=tool)
    if effect_class:
        base = base.filter(effect_class=effect_class)
    if run:
        base = base.filter(run_id=run)
    if min_age_s:
        base = base.filter(status_changed_at__lte=now - timedelta(seconds=min_age_s))
    if not include_snoozed:
        base = base.exclude(snoozed_until__gt=now)
    return (
        _queue(base, queue if queue in SAVED_QUEUES else "all", now)
        .select_related("run", "tool_version")
        .order_by("status_changed_at", "id")
    )


def reconciliation_counts(*, user: Any, now: datetime | None = None) -> dict[str, int]:
    now = now or timezone.now()
    base = Operation.objects.filter(tool__in=tools_for_user(user, [RECONCILE])).exclude(
        snoozed_until__gt=now
    )
    return {name: _queue(base, name, now).count() for name in SAVED_QUEUES}


def operation_trace(op: Operation) -> dict[str, Any]:
    """Everything the operation page shows about one operation, in few queries."""
    events = list(Event.objects.filter(stream=op.id).select_related("actor_user").order_by("seq"))
    return {
        "events": events,
        "attempts": list(op.attempt_set.order_by("number")),
        "approvals": list(
            op.approval_requests.select_related("grant")
            .prefetch_related("decisions__user")
            .order_by("created_at")
        ),
        "resolutions": list(op.resolutions.select_related("declared_by", "review", "review__user")),
        "deliveries": list(
            op.outbox_messages.select_related("endpoint")
            .prefetch_related("delivery_attempts")
            .order_by("created_at", "id")
        ),
        "probes": [e for e in events if e.kind in {"probe", "reconciled", "late_success"}],
        "notes": [
            e
            for e in events
            if e.kind in {"note", "snoozed", "resolution_proposed", "resolution_disputed"}
        ],
    }


# --- the rest of the console: search, lists, runs, tools, audit log, dashboard --------

ACTIVATE = "operations.activate_tool"
INVOKE = "operations.invoke_tool"
CANCEL_RUN = "operations.change_run"
# States in which an operation waits for a person's answer (the reconciliation backlog).
UNRESOLVED = (Status.OUTCOME_UNKNOWN, Status.COMPENSATING)


def _sees_everything(user: Any) -> bool:
    return bool(user.is_active and user.is_superuser)


def inbound_events_for_user(
    *, user: Any, status: str | None = None, tool: str | None = None
) -> QuerySet[InboundEvent]:
    """Provider events of the tools a person may see, newest first."""
    queryset = InboundEvent.objects.filter(tool__in=tools_for_user(user)).select_related(
        "operation"
    )
    if status:
        queryset = queryset.filter(status=status)
    if tool:
        queryset = queryset.filter(tool_id=tool)
    return queryset.order_by("-received_at", "-id")
