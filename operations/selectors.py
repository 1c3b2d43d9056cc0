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


def visible_tool_names(user: Any) -> list[str] | None:
    """The names of the tools whose operations a person may see, or ``None`` for every
    tool. The tools table is small; a literal list (rather than the permission
    subquery) lets the database plan the big tables' scans well."""
    if _sees_everything(user):
        return None
    names = list(tools_for_user(user).values_list("name", flat=True))
    if len(names) == Tool.objects.count():
        return None
    return names


def _visible(user: Any, field: str) -> Q:
    names = visible_tool_names(user)
    return Q() if names is None else Q(**{f"{field}__in": names})


def operations_visible(user: Any) -> QuerySet[Operation]:
    """The operations of ``operations_for_user``, filtered by a literal list of tools."""
    if not user.is_active:
        return Operation.objects.none()
    return Operation.objects.filter(_visible(user, "tool_id"))


def operation_search(*, user: Any, query: str, limit: int = 50) -> list[Operation]:
    """Operations whose id, operation key, idempotency key, call id or downstream
    reference is exactly ``query``, among those the person may see; newest first.

    Ids and idempotency keys are minted by the server, prefixed and random, and both are
    indexed: a match there is the answer. Only otherwise are the runner-chosen fields
    compared.
    """
    query = query.strip()
    if not query:
        return []
    visible = operations_visible(user).select_related("run", "tool_version").order_by("-id")
    minted = list(visible.filter(Q(pk=query) | Q(idempotency_key=query))[:limit])
    if minted:
        return minted
    chosen = Q(operation_key=query) | Q(call_id=query) | Q(downstream_id=query)
    return list(visible.filter(chosen)[:limit])


def operations_list_for_user(
    *,
    user: Any,
    status: str | None = None,
    tool: str | None = None,
    run: str | None = None,
) -> QuerySet[Operation]:
    """The operations list, newest first (ids sort in creation order)."""
    queryset = operations_visible(user)
    if status:
        queryset = queryset.filter(status=status)
    if tool:
        queryset = queryset.filter(tool_id=tool)
    if run:
        queryset = queryset.filter(run_id=run)
    return queryset.select_related("run", "tool_version").order_by("-id")


def runs_for_user(user: Any) -> QuerySet[Run]:
    """Runs with at least one operation the person may see; superusers see all."""
    if not user.is_active:
        return Run.objects.none()
    names = visible_tool_names(user)
    if names is None:
        return Run.objects.all()
    return Run.objects.filter(
        Exists(Operation.objects.filter(run=OuterRef("pk"), tool_id__in=names))
    )


def run_get_for_user(*, user: Any, run_id: str) -> Run:
    run = runs_for_user(user).select_related("runner").filter(pk=run_id).first()
    if run is None:
        raise NotFound(f"No run {run_id!r}.")
    return run


def may_cancel_run(user: Any) -> bool:
    return bool(user.is_active and user.has_perm(CANCEL_RUN))


def tools_visible_to_user(user: Any) -> QuerySet[Tool]:
    """Tools whose page a person may open: deciders, reconcilers and activators."""
    return tools_for_user(user, [DECIDE, RECONCILE, ACTIVATE])


def tool_get_for_user(*, user: Any, name: str) -> Tool:
    tool = tools_visible_to_user(user).select_related("active_version").filter(pk=name).first()
    if tool is None:
        raise NotFound(f"No tool {name!r}.")
    return tool


def _global_holders(codename: str) -> QuerySet[Any]:
    """Active people holding the model-wide permission, directly or through a group."""
    permission = Permission.objects.filter(
        content_type__app_label="operations", codename=codename
    ).first()
    user_model = get_user_model()
    if permission is None:
        return user_model.objects.none()
    return (
        user_model.objects.filter(is_active=True)
        .filter(Q(user_permissions=permission) | Q(groups__permissions=permission))
        .distinct()
    )


def tool_access(tool: Tool) -> list[dict[str, Any]]:
    """Who may decide on, reconcile or activate versions of ``tool``, and how.

    One row per permission: people and groups holding it on this tool, people holding
    it for every tool, and whether superusers exist (they hold every permission;
    separation of duties still applies to them).
    """
    rows = []
    superusers = list(
        get_user_model()
        .objects.filter(is_active=True, is_superuser=True)
        .order_by("username")
        .values_list("username", flat=True)
    )
    for perm, label in ((DECIDE, "Decide"), (RECONCILE, "Reconcile"), (ACTIVATE, "Activate")):
        codename = perm.split(".", 1)[1]
        users = get_users_with_perms(tool, only_with_perms_in=[codename], with_group_users=False)
        groups = get_groups_with_perms(tool, only_with_perms_in=[codename])
        rows.append(
            {
                "permission": perm,
                "label": label,
                "users": sorted(u.get_username() for u in users if u.is_active),
                "groups": sorted(g.name for g in groups),
                "global_users": sorted(
                    u.get_username() for u in _global_holders(codename).exclude(is_superuser=True)
                ),
                "superusers": superusers,
            }
        )
    return rows


def tool_runners(tool: Tool) -> dict[str, list[Runner]]:
    """Runners that may invoke ``tool`` (unrestricted ones invoke every tool) and the
    restricted runners that may not."""
    granted = get_users_with_perms(tool, only_with_perms_in=["invoke_tool"])
    may = Q(restrict_tools=False) | Q(service_user__in=granted)
    may |= Q(service_user__in=_global_holders("invoke_tool"))
    runners = Runner.objects.filter(is_active=True).select_related("owner").order_by("name")
    allowed = list(runners.filter(may).distinct())
    allowed_ids = {runner.pk for runner in allowed}
    return {
        "allowed": allowed,
        "refused": [r for r in runners.filter(restrict_tools=True) if r.pk not in allowed_ids],
    }


def tool_versions(tool: Tool) -> list[ToolVersion]:
    return list(tool.versions.select_related("registered_by", "activated_by").order_by("-number"))


def events_for_user(user: Any) -> QuerySet[Event]:
    """Audit events a person may read.

    Superusers read everything. Others read the events of tools they may see: every
    event about a tool they decide on or reconcile, and the contract events (stream
    ``tool:<name>``) of tools they may activate. Events about no tool (runners, sign-ins,
    runs) are for superusers.
    """
    if _sees_everything(user):
        return Event.objects.all()
    if not user.is_active:
        return Event.objects.none()
    seen = list(tools_for_user(user).values_list("name", flat=True))
    activatable = list(tools_for_user(user, [ACTIVATE]).values_list("name", flat=True))
    return Event.objects.filter(
        Q(tool_name__in=seen)
        | Q(stream__in=[f"tool:{name}" for name in activatable if name not in seen])
    )


def _actor_filter(actor: str) -> Q:
    """Events by ``actor``: a label (``user:ann``, ``runner:bot``, ``system:sweep``) or a
    bare name. People and runners are matched through their indexed foreign keys."""
    kind, _, name = actor.partition(":") if ":" in actor else ("", "", actor)
    people = runners = []
    if kind in ("", "user"):
        people = list(get_user_model().objects.filter(username=name).values_list("pk", flat=True))
    if kind in ("", "runner"):
        runners = list(Runner.objects.filter(name=name).values_list("pk", flat=True))
    if not (people or runners):
        return Q(actor=actor if kind else f"system:{name}")
    return Q(actor_user_id__in=people) | Q(actor_runner_id__in=runners)


def audit_events(
    *,
    user: Any,
    actor: str | None = None,
    kind: str | None = None,
    tool: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[Event]:
    """The audit log, newest first. ``actor`` is a full label (``user:ann``) or a bare
    name matched against people, runners and system actors."""
    queryset = events_for_user(user)
    if actor:
        queryset = queryset.filter(_actor_filter(actor))
    if kind:
        queryset = queryset.filter(kind=kind)
    if tool:
        queryset = queryset.filter(tool_name=tool)
    if since:
        queryset = queryset.filter(at__gte=since)
    if until:
        queryset = queryset.filter(at__lt=until)
    return queryset.order_by("-id")


# --- dashboard figures: every query is bounded by a state index or a time window ------


def _visible_tool_filter(user: Any, field: str) -> Q:
    if not user.is_active:
        return Q(pk__in=[])
    return _visible(user, field)


def dashboard_states(*, user: Any, since: datetime) -> dict[str, int]:
    """Operations by state: every open one, and those that ended since ``since``."""
    open_states = [s.value for s in Status if s not in TERMINAL]
    closed_states = [s.value for s in Status if s in TERMINAL]
    base = Operation.objects.filter(_visible_tool_filter(user, "tool"))
    counts = dict.fromkeys([s.value for s in Status], 0)
    for status, n in (
        base.filter(status__in=open_states).values_list("status").annotate(n=Count("id"))
    ):
        counts[status] = n
    for status, n in (
        base.filter(status__in=closed_states, status_changed_at__gte=since)
        .values_list("status")
        .annotate(n=Count("id"))
    ):
        counts[status] = n
    return counts


APPROVAL_AGE_BUCKETS = [
    ("under 15 min", 0, 15 * 60),
    ("15-60 min", 15 * 60, 3600),
    ("1-4 h", 3600, 4 * 3600),
    ("4-24 h", 4 * 3600, 24 * 3600),
    ("over 1 day", 24 * 3600, None),
]


def dashboard_pending_ages(*, user: Any, now: datetime) -> list[tuple[str, int]]:
    """Pending approval requests by how long they have waited, in one query."""
    pending = ApprovalRequest.objects.filter(
        Q(status=ApprovalRequest.RequestStatus.PENDING)
        & _visible_tool_filter(user, "operation__tool")
    )
    aggregates = {}
    for index, (_, low, high) in enumerate(APPROVAL_AGE_BUCKETS):
        window = Q(created_at__lte=now - timedelta(seconds=low))
        if high is not None:
            window &= Q(created_at__gt=now - timedelta(seconds=high))
        aggregates[f"b{index}"] = Count("id", filter=window)
    counts = pending.aggregate(**aggregates)
    return [
        (label, counts[f"b{index}"] or 0)
        for index, (label, _, _) in enumerate(APPROVAL_AGE_BUCKETS)
    ]


def _percentile(ordered: QuerySet[Any], count: int, fraction: float) -> timedelta | None:
    """The nearest-rank percentile of an ordered queryset of durations."""
    if count == 0:
        return None
    rank = max(1, math.ceil(fraction * count))
    return ordered[rank - 1]


def dashboard_approval_latency(
    *, user: Any, now: datetime, windows: list[tuple[str, timedelta]]
) -> list[dict[str, Any]]:
    """p50 and p95 of the time from request to decision, for each window.

    The database orders the latencies and returns only the two ranks, so the cost
    does not grow with the number of decided requests held in memory.
    """
    decided = ApprovalRequest.objects.filter(
        Q(
            status__in=[
                ApprovalRequest.RequestStatus.APPROVED,
                ApprovalRequest.RequestStatus.REJECTED,
            ]
        )
        & Q(decided_at__isnull=False)
        & _visible_tool_filter(user, "operation__tool")
    )
    rows = []
    for label, span in windows:
        window = decided.filter(decided_at__gte=now - span, decided_at__lte=now)
        count = window.count()
        ordered = (
            window.annotate(
                latency=ExpressionWrapper(F("decided_at") - F("created_at"), DurationField())
            )
            .order_by("latency")
            .values_list("latency", flat=True)
        )
        rows.append(
            {
                "label": label,
                "count": count,
                "p50": _percentile(ordered, count, 0.5),
                "p95": _percentile(ordered, count, 0.95),
            }
        )
    return rows


def _days(start: datetime, days: int) -> list[datetime]:
    return [start + timedelta(days=offset) for offset in range(days)]


def dashboard_unknown_rate(*, user: Any, start: datetime, days: int) -> list[dict[str, Any]]:
    """Per UTC day from ``start`` (a midnight): outcomes recorded, and how many were
    unknown (a posted ``unknown`` or an expired lease), from the events."""
    rows = {
        day.date(): {"day": day.date(), "outcomes": 0, "unknown": 0} for day in _days(start, days)
    }
    queryset = (
        Event.objects.filter(
            Q(at__gte=start, at__lt=start + timedelta(days=days))
            & Q(kind__in=["outcome", "lease_expired"])
            & _visible_tool_filter(user, "tool_name")
        )
        .annotate(day=TruncDate("at", tzinfo=UTC))
        .values("day")
        .annotate(
            outcomes=Count("id"),
            unknown=Count("id", filter=Q(kind="lease_expired") | Q(data__kind="unknown")),
        )
    )
    for row in queryset:
        if row["day"] in rows:
            rows[row["day"]].update(outcomes=row["outcomes"], unknown=row["unknown"])
    return list(rows.values())


def dashboard_backlog(
    *, user: Any, start: datetime, days: int, now: datetime
) -> list[dict[str, Any]]:
    """The reconciliation backlog (``outcome_unknown`` and ``compensating``) at the end
    of each UTC day from ``start``: how many operations waited, and for how long the
    oldest had waited.

    1. The backlog at ``start`` is reconstructed from today's backlog and the window's
       entry and exit events: an operation is in it if its first event in the window
       leaves the backlog, or if it is in the backlog now and has no event in the
       window. Entry times from before the window come from one query.
    2. The window's entry and exit events are then replayed in order, and the backlog
       is measured at the end of each day (or at ``now`` for today).

    Only events of the window that enter or leave the backlog are read.
    """
    unresolved = [s.value for s in UNRESOLVED]
    visible = _visible_tool_filter(user, "tool_name")
    enters = Q(to_status__in=unresolved) & ~Q(from_status__in=unresolved)
    leaves = Q(from_status__in=unresolved) & ~Q(to_status__in=unresolved)
    moves = list(
        Event.objects.filter(Q(at__gte=start) & (enters | leaves) & visible)
        .exclude(operation_id=None)
        .order_by("at", "id")
        .values_list("operation_id", "at", "to_status")
    )
    first_move: dict[str, bool] = {}
    for operation_id, _, to_status in moves:
        first_move.setdefault(operation_id, to_status in unresolved)
    waiting: dict[str, datetime] = {}
    current = Operation.objects.filter(
        Q(status__in=unresolved) & _visible_tool_filter(user, "tool")
    ).values_list("id", "status_changed_at", "created_at")
    for operation_id, since, created in current:
        if operation_id not in first_move:
            waiting[operation_id] = since or created
    left_first = [op_id for op_id, entered in first_move.items() if not entered]
    if left_first:
        earlier = (
            Event.objects.filter(Q(operation_id__in=left_first, at__lt=start) & enters)
            .values("operation_id")
            .annotate(entered=Max("at"))
        )
        for row in earlier:
            waiting[row["operation_id"]] = row["entered"]
        for op_id in left_first:
            waiting.setdefault(op_id, start)

    series = []
    cursor = 0
    for day in _days(start, days):
        end = min(day + timedelta(days=1), now)
        while cursor < len(moves) and moves[cursor][1] < end:
            operation_id, at, to_status = moves[cursor]
            if to_status in unresolved:
                waiting[operation_id] = at
            else:
                waiting.pop(operation_id, None)
            cursor += 1
        oldest = min(waiting.values(), default=None)
        series.append(
            {
                "day": day.date(),
                "count": len(waiting),
                "oldest_age": (end - oldest) if oldest is not None else None,
            }
        )
    return series


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


def tool_breaker_history(tool: Tool, limit: int = 20) -> list[Event]:
    """The latest circuit-breaker changes of a tool, newest first."""
    return list(
        Event.objects.filter(stream=f"tool:{tool.name}", kind__startswith="breaker_").order_by(
            "-seq"
        )[:limit]
    )
