"""Dashboard figures: every query is bounded by a state index or a time window."""

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    Q,
    QuerySet,
)
from django.db.models.functions import TruncDate

from approvals.models import ApprovalRequest
from approvals.people import Person

from .. import access
from ..machine import TERMINAL, EventKind, Status
from ..models import (
    Event,
    Operation,
)
from .people import UNRESOLVED

# --- dashboard figures: every query is bounded by a state index or a time window ------


def dashboard_states(*, user: Person, since: datetime) -> dict[str, int]:
    """Operations by state: every open one, and those that ended since ``since``."""
    open_states = [s.value for s in Status if s not in TERMINAL]
    closed_states = [s.value for s in Status if s in TERMINAL]
    base = Operation.objects.filter(access.visible_filter(user, "tool"))
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


def dashboard_pending_ages(*, user: Person, now: datetime) -> list[tuple[str, int]]:
    """Pending approval requests by how long they have waited, in one query."""
    pending = ApprovalRequest.objects.filter(
        Q(status=ApprovalRequest.RequestStatus.PENDING)
        & access.visible_filter(user, "operation__tool")
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
    *, user: Person, now: datetime, windows: list[tuple[str, timedelta]]
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
        & access.visible_filter(user, "operation__tool")
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


def dashboard_unknown_rate(*, user: Person, start: datetime, days: int) -> list[dict[str, Any]]:
    """Per UTC day from ``start`` (a midnight): outcomes recorded, and how many were
    unknown (a posted ``unknown`` or an expired lease), from the events."""
    rows = {
        day.date(): {"day": day.date(), "outcomes": 0, "unknown": 0} for day in _days(start, days)
    }
    queryset = (
        Event.objects.filter(
            Q(at__gte=start, at__lt=start + timedelta(days=days))
            & Q(kind__in=[EventKind.OUTCOME, EventKind.LEASE_EXPIRED])
            & access.visible_filter(user, "tool_name")
        )
        .annotate(day=TruncDate("at", tzinfo=UTC))
        .values("day")
        .annotate(
            outcomes=Count("id"),
            unknown=Count("id", filter=Q(kind=EventKind.LEASE_EXPIRED) | Q(data__kind="unknown")),
        )
    )
    for row in queryset:
        if row["day"] in rows:
            rows[row["day"]].update(outcomes=row["outcomes"], unknown=row["unknown"])
    return list(rows.values())


def dashboard_backlog(
    *, user: Person, start: datetime, days: int, now: datetime
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
    visible = access.visible_filter(user, "tool_name")
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
        Q(status__in=unresolved) & access.visible_filter(user, "tool")
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
