"""The ledger's gauges for ``/metrics``, each one bounded read: counts of what is open
(operations not yet ended, pending requests, undelivered webhooks: few, found through
partial or status indexes), and the oldest of each through an index's first row. No
scrape reads the ended part of the ledger, however large it grows."""

from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection
from django.db.models import Count, Min

from approvals.models import ApprovalRequest

from ..machine import TERMINAL, Status
from ..models import Operation, OutboxMessage, Tool

OPEN_STATES = [status.value for status in Status if status not in TERMINAL]
# At most this many open operations are counted per scrape (a cap, not a sample: the
# gauge says "at least" past it, and effectgate_operations_capped says so).
COUNT_CAP = 100_000


@dataclass
class Gauges:
    operations: dict[tuple[str, str], int] = field(default_factory=dict)
    operations_capped: bool = False
    unknown_oldest_s: float = 0.0
    approvals_pending: dict[str, int] = field(default_factory=dict)
    approvals_oldest_s: float = 0.0
    webhook_backlog: int = 0
    webhook_oldest_s: float = 0.0
    breaker_open: dict[str, int] = field(default_factory=dict)


def _age(now: datetime, since: datetime | None) -> float:
    return max(0.0, (now - since).total_seconds()) if since is not None else 0.0


def gauges(*, now: datetime) -> Gauges:
    result = Gauges()
    # Aggregated over the capped rows themselves (an IN over a capped id list may be
    # planned as a join over the whole table): the status index finds the open rows.
    marks = ", ".join(["%s"] * len(OPEN_STATES))
    sql = (
        "SELECT status, tool_id, count(*) FROM (SELECT status, tool_id "  # noqa: S608
        f"FROM operations_operation WHERE status IN ({marks}) LIMIT %s) AS open "
        "GROUP BY status, tool_id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*OPEN_STATES, COUNT_CAP])
        for status, tool, count in cursor.fetchall():
            result.operations[(status, tool)] = count
    result.operations_capped = sum(result.operations.values()) >= COUNT_CAP
    oldest_unknown = (
        Operation.objects.filter(status=Status.OUTCOME_UNKNOWN)
        .order_by("status_changed_at")
        .values_list("status_changed_at", flat=True)
        .first()
    )
    result.unknown_oldest_s = _age(now, oldest_unknown)
    pending = ApprovalRequest.objects.filter(status=ApprovalRequest.RequestStatus.PENDING)
    for row in pending.values("operation__tool_id").annotate(n=Count("pk")).order_by():
        result.approvals_pending[row["operation__tool_id"]] = row["n"]
    result.approvals_oldest_s = _age(now, pending.aggregate(oldest=Min("created_at"))["oldest"])
    backlog = OutboxMessage.objects.filter(status=OutboxMessage.MessageStatus.PENDING)
    result.webhook_backlog = backlog.count()
    result.webhook_oldest_s = _age(now, backlog.aggregate(oldest=Min("created_at"))["oldest"])
    for name, state in Tool.objects.values_list("name", "breaker_state"):
        result.breaker_open[name] = int(state != Tool.BreakerState.CLOSED)
    return result
