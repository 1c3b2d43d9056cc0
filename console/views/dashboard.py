"""The dashboard: operations by state, pending approvals by age, approval latency,
unknown-outcome rate and reconciliation backlog over the last 14 days, as server-drawn
SVG charts with a table beside each. It refreshes itself while the tab is visible."""

from datetime import UTC, datetime, timedelta

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from operations import selectors
from operations.machine import TERMINAL, Status

from ..charts import bar_chart, duration_text, hbar_chart, line_chart
from ..middleware import AuthenticatedHtmxRequest
from .common import partial

DAYS = 14
STATE_TONES = {
    Status.AWAITING_APPROVAL: "warn",
    Status.READY: "info",
    Status.EXECUTING: "progress",
    Status.OUTCOME_UNKNOWN: "attention",
    Status.COMPENSATING: "undo",
    Status.SUCCEEDED: "ok",
    Status.REJECTED: "bad",
    Status.FAILED_PERMANENT: "bad",
    Status.BUDGET_EXHAUSTED: "bad",
    Status.COMPENSATED: "undo",
    Status.CANCELLED: "neutral",
    Status.SUPERSEDED: "neutral",
}


def _midnight(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _day_label(day) -> str:
    return day.strftime("%b %d")


def figures(user, now: datetime) -> dict:
    start = _midnight(now) - timedelta(days=DAYS - 1)
    states = selectors.dashboard_states(user=user, since=start)
    open_states = [s for s in Status if s not in TERMINAL]
    closed_states = [s for s in Status if s in TERMINAL]

    ages = selectors.dashboard_pending_ages(user=user, now=now)
    latency = selectors.dashboard_approval_latency(
        user=user,
        now=now,
        windows=[
            ("last 24 h", timedelta(days=1)),
            ("last 7 days", timedelta(days=7)),
            (f"last {DAYS} days", timedelta(days=DAYS)),
        ],
    )
    for row, short in zip(latency, ["24 h", "7 d", f"{DAYS} d"], strict=True):
        row["short"] = short
        row["p50_text"] = duration_text(row["p50"]) if row["p50"] is not None else "—"
        row["p95_text"] = duration_text(row["p95"]) if row["p95"] is not None else "—"

    rate = selectors.dashboard_unknown_rate(user=user, start=start, days=DAYS)
    for row in rate:
        row["label"] = _day_label(row["day"])
        row["percent"] = (
            round(100 * row["unknown"] / row["outcomes"], 1) if row["outcomes"] else None
        )
    backlog = selectors.dashboard_backlog(user=user, start=start, days=DAYS, now=now)
    for row in backlog:
        row["label"] = _day_label(row["day"])
        row["age_text"] = duration_text(row["oldest_age"]) if row["oldest_age"] else "—"

    return {
        "now": now,
        "days": DAYS,
        "open_states": [(s.value, states[s.value]) for s in open_states],
        "closed_states": [(s.value, states[s.value]) for s in closed_states],
        "open_total": sum(states[s.value] for s in open_states),
        "open_chart": hbar_chart(
            [(s.value.replace("_", " "), states[s.value]) for s in open_states],
            tones=[STATE_TONES[s] for s in open_states],
        ),
        "closed_chart": hbar_chart(
            [(s.value.replace("_", " "), states[s.value]) for s in closed_states],
            tones=[STATE_TONES[s] for s in closed_states],
        ),
        "ages": ages,
        "pending_total": sum(n for _, n in ages),
        "ages_chart": bar_chart(ages, tones=["warn"] * len(ages)),
        "latency": latency,
        "latency_chart": bar_chart(
            [
                (f"{name} {row['short']}", row[name].total_seconds() if row[name] else 0)
                for row in latency
                for name in ("p50", "p95")
            ],
            unit="s",
            tones=["info", "progress"] * len(latency),
        ),
        "rate": rate,
        "rate_chart": line_chart(
            [(row["label"], row["percent"]) for row in rate], unit="%", label_every=3
        ),
        "backlog": backlog,
        "backlog_chart": line_chart(
            [
                (
                    row["label"],
                    row["oldest_age"].total_seconds() if row["oldest_age"] else 0,
                )
                for row in backlog
            ],
            unit="s",
            label_every=3,
        ),
    }


@require_GET
@login_required
def dashboard(request: AuthenticatedHtmxRequest) -> HttpResponse:
    context = figures(request.user, timezone.now())
    return render(request, partial(request, "console/dashboard.html", "panels"), context)
