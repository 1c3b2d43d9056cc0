"""Dashboard figures: every query is bounded by a state index or a time window."""

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models import (
    Aggregate,
    Case,
    Count,
    DecimalField,
    DurationField,
    Expression,
    ExpressionWrapper,
    F,
    Func,
    Max,
    Q,
    QuerySet,
    Sum,
    TextField,
    Value,
    When,
)
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import TruncDate

from approvals.models import ApprovalRequest
from approvals.people import Person
from approvals.policy import parse_pointer

from .. import access
from ..contracts.display import EXACT, UNSIGNED_AMOUNT, in_currency_units, money_field
from ..machine import TERMINAL, EventKind, Status
from ..models import (
    Event,
    Operation,
    ToolVersion,
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


class _PercentileDisc(Aggregate):
    """PostgreSQL's ``percentile_disc``: the first value whose rank reaches
    ``fraction`` of the count, the nearest rank ``_percentile`` takes."""

    function = "percentile_disc"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: Any, *, fraction: float, **extra: Any) -> None:
        super().__init__(expression, fraction=float(fraction), **extra)


PERCENTILES = {"p50": 0.5, "p95": 0.95}


def dashboard_approval_latency(
    *, user: Person, now: datetime, windows: list[tuple[str, timedelta]]
) -> list[dict[str, Any]]:
    """p50 and p95 of the time from request to decision, for each window.

    The database orders the latencies and returns only the ranks asked for, so the
    cost does not grow with the number of decided requests held in memory: on
    PostgreSQL one query for every window (ordered-set aggregates, one filter per
    window), elsewhere a count and a read of each rank per window.
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
    ).annotate(latency=ExpressionWrapper(F("decided_at") - F("created_at"), DurationField()))
    if connection.vendor == "postgresql":
        longest = max((span for _, span in windows), default=timedelta(0))
        aggregates: dict[str, Any] = {}
        for index, (_, span) in enumerate(windows):
            within = Q(decided_at__gte=now - span)
            aggregates[f"count{index}"] = Count("id", filter=within)
            for name, fraction in PERCENTILES.items():
                aggregates[f"{name}{index}"] = _PercentileDisc(
                    "latency", fraction=fraction, filter=within, output_field=DurationField()
                )
        found = decided.filter(decided_at__gte=now - longest, decided_at__lte=now).aggregate(
            **aggregates
        )
        return [
            {
                "label": label,
                "count": found[f"count{index}"],
                **{name: found[f"{name}{index}"] for name in PERCENTILES},
            }
            for index, (label, _) in enumerate(windows)
        ]
    rows = []
    for label, span in windows:
        window = decided.filter(decided_at__gte=now - span, decided_at__lte=now)
        count = window.count()
        ordered = window.order_by("latency").values_list("latency", flat=True)
        rows.append(
            {
                "label": label,
                "count": count,
                **{name: _percentile(ordered, count, f) for name, f in PERCENTILES.items()},
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


# --- money at stake ------------------------------------------------------------------


@dataclass(frozen=True)
class StakeState:
    """A column of the money at stake: the operations in ``statuses``."""

    key: str
    label: str
    statuses: tuple[Status, ...]


# Money not yet settled, in the order it moves through the ledger: waiting for a
# person's decision; allowed and about to move, or moving; perhaps moved (reconciliation
# must say); being undone. Settled money (succeeded, failed, compensated) is not at
# stake, and adding up a day of it would read the whole day's operations on every
# refresh: these states are the queues, found through the status index.
STAKE_STATES = (
    StakeState("awaiting_approval", "Awaiting approval", (Status.AWAITING_APPROVAL,)),
    StakeState("ready", "Ready or running", (Status.READY, Status.EXECUTING)),
    StakeState("outcome_unknown", "Outcome unknown", (Status.OUTCOME_UNKNOWN,)),
    StakeState("compensating", "Compensating", (Status.COMPENSATING,)),
)
_STATE_OF = {status.value: state.key for state in STAKE_STATES for status in state.statuses}
# What counts: a plain non-negative amount, the display's own pattern without the sign
# (a negative one must not hide another's exposure). PostgreSQL's "^" and "$" anchor at
# the very start and end of the text (no final newline slips through, unlike Python's
# "$"); Python matches the pattern in full.
_COUNTED = r"^" + UNSIGNED_AMOUNT + r"$"
_COUNTED_RE = re.compile(UNSIGNED_AMOUNT)


@dataclass
class MoneyAtStake:
    """What ``dashboard_money_at_stake`` found, never adding two currencies."""

    # (state key, tool, currency) -> the amount in the currency's units, and how many
    # operations it adds up.
    amounts: dict[tuple[str, str, str], Decimal] = field(default_factory=dict)
    operations: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # Operations of a tool with a money field whose amount is not a plain non-negative
    # amount (text, negative, over 30 digits, missing, a sensitive value's digest).
    not_counted: dict[str, int] = field(default_factory=dict)
    # Operations at stake of tool versions that declare no money field, by tool.
    without_field: dict[str, int] = field(default_factory=dict)

    def add(self, state: str, tool: str, currency: str, amount: Decimal, operations: int) -> None:
        key = (state, tool, currency)
        # Exactly: the default context keeps 28 digits, an amount may have 60.
        self.amounts[key] = EXACT.add(self.amounts.get(key, Decimal(0)), amount)
        self.operations[key] = self.operations.get(key, 0) + operations

    @property
    def currencies(self) -> list[str]:
        return sorted({currency for _, _, currency in self.amounts})

    @property
    def tools(self) -> list[tuple[str, str]]:
        """Every (tool, currency) with money at stake, by tool."""
        return sorted({(tool, currency) for _, tool, currency in self.amounts})

    def total(
        self, state: str, currency: str, tool: str | None = None
    ) -> tuple[Decimal, int] | None:
        """The amount in ``currency`` in ``state`` (of ``tool``, or of every tool) and
        how many operations it adds up; None when there is none."""
        keys = [
            key
            for key in self.amounts
            if key[0] == state and key[2] == currency and tool in (None, key[1])
        ]
        if not keys:
            return None
        amount = Decimal(0)
        for key in keys:
            amount = EXACT.add(amount, self.amounts[key])
        return amount, sum(self.operations[key] for key in keys)


class _Numeric(Func):
    """Text as PostgreSQL's ``numeric`` without a precision: exact, never rounded
    (Django's ``Cast`` to a ``DecimalField`` would fix one)."""

    template = "(%(expressions)s)::numeric"
    output_field = DecimalField()


def text_at(pointer: str) -> Expression:
    """The arguments' value at ``pointer`` as text (None where there is none; the
    arguments as a whole, an object, are never an amount)."""
    tokens = parse_pointer(pointer)
    if not tokens:
        return Value(None, output_field=TextField())
    *parents, last = tokens
    expression: Any = "arguments"
    for token in parents:
        expression = KeyTransform(token, expression)
    return KeyTextTransform(last, expression)


def dashboard_money_at_stake(*, user: Person) -> MoneyAtStake:
    """The money at stake per state (``STAKE_STATES``), tool and currency, read from
    each tool version's money field (``display.money_field``) in the database.

    1. The versions of the tools the person sees are read with their display only (the
       tool registry, not the ledger), and grouped by the pointer of their money field.
    2. One grouped query over the operations at stake (found through the status
       indexes) takes each one's value at its version's pointer; PostgreSQL keeps the
       plain amounts and adds them exactly (``numeric``) per version and state. SQLite
       (the local mode) has no exact decimal type: it groups by the value instead, and
       Python adds the distinct values.
    3. Each version's sum is turned into its currency's units and added per currency.
    """
    visible = access.visible_filter(user, "tool")
    fields: dict[int, tuple[str, dict[str, Any]]] = {}
    tools: dict[int, str] = {}
    by_pointer: dict[str, list[int]] = defaultdict(list)
    for version_id, tool, display, schema in ToolVersion.objects.filter(visible).values_list(
        "id", "tool_id", "contract__display", "contract__input_schema"
    ):
        tools[version_id] = tool
        # The display's money field, else an argument the schema gives a currency.
        contract = {
            "display": display if isinstance(display, dict) else {},
            "input_schema": schema if isinstance(schema, dict) else {},
        }
        money = money_field(contract)
        if money is not None:
            fields[version_id] = money
            by_pointer[money[0]].append(version_id)
    whens = [When(tool_version_id__in=ids, then=text_at(p)) for p, ids in by_pointer.items()]
    amount_text = Case(*whens, default=Value(None), output_field=TextField())
    operations = Operation.objects.filter(visible & Q(status__in=list(_STATE_OF))).order_by()
    # (version, status) -> operations, those with an amount, and their sum as stored.
    groups: dict[tuple[int, str], list[Any]] = defaultdict(lambda: [0, 0, Decimal(0)])
    if connection.vendor == "postgresql":
        rows = (
            operations.alias(amount_text=amount_text)
            .alias(
                amount=Case(
                    When(amount_text__regex=_COUNTED, then=_Numeric("amount_text")),
                    output_field=DecimalField(),
                )
            )
            .values_list("tool_version_id", "status")
            .annotate(n=Count("id"), counted=Count("amount"), total=Sum("amount"))
        )
        for version_id, status, n, counted, total in rows:
            groups[version_id, status] = [n, counted, total or Decimal(0)]
    else:
        for version_id, status, text, n in (
            operations.annotate(amount_text=amount_text)
            .values_list("tool_version_id", "status", "amount_text")
            .annotate(n=Count("id"))
        ):
            group = groups[version_id, status]
            group[0] += n
            if text is not None and _COUNTED_RE.fullmatch(str(text)):
                group[1] += n
                group[2] = EXACT.add(group[2], EXACT.multiply(Decimal(str(text)), n))

    found = MoneyAtStake()
    for (version_id, status), (n, counted, total) in sorted(groups.items()):
        tool = tools[version_id]
        if version_id not in fields:
            found.without_field[tool] = found.without_field.get(tool, 0) + n
            continue
        if n > counted:
            found.not_counted[tool] = found.not_counted.get(tool, 0) + n - counted
        if counted:
            spec = fields[version_id][1]
            amount = in_currency_units(total, spec)
            found.add(_STATE_OF[status], tool, spec["currency"], amount, counted)
    return found
