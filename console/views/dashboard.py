"""The dashboard: money at stake, operations by state, pending approvals by age,
approval latency, unknown-outcome rate and reconciliation backlog over the last 14
days. Charts are server-drawn SVG for the eye, each with its figures in a table only
assistive technology reads; figures people act on (money, states) are tables with
links. It refreshes itself while the tab is visible."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from operations import selectors
from operations.contracts.display import money_text
from operations.machine import TERMINAL, Status

from ..charts import bar_chart, duration_text, grouped_bar_chart, line_chart, shares
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


def _state_rows(states: dict[str, int], chosen: list[Status]) -> list[dict[str, Any]]:
    counts = [states[s.value] for s in chosen]
    return [
        {"status": s.value, "count": n, "share": share, "tone": STATE_TONES[s]}
        for s, n, share in zip(chosen, counts, shares(counts), strict=True)
    ]


def _money_cell(total: tuple[Decimal, int] | None, currency: str) -> dict[str, Any] | None:
    if total is None:
        return None
    amount, operations = total
    return {"text": money_text(amount, currency), "operations": operations}


def money_figures(found: selectors.MoneyAtStake) -> dict[str, Any]:
    """The money at stake as two tables: per state and currency, and per tool and
    currency; a cell adds one currency only."""
    currencies = found.currencies
    states = selectors.STAKE_STATES
    return {
        "states": states,
        "currencies": currencies,
        "by_state": [
            {
                "label": state.label,
                "cells": [_money_cell(found.total(state.key, c), c) for c in currencies],
            }
            for state in states
        ],
        "by_tool": [
            {
                "tool": tool,
                "currency": currency,
                "cells": [
                    _money_cell(found.total(state.key, currency, tool), currency)
                    for state in states
                ],
            }
            for tool, currency in found.tools
        ],
        "not_counted": sorted(found.not_counted.items()),
        "without_field": sorted(found.without_field.items()),
    }


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
    for row in latency:
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
        "money": money_figures(selectors.dashboard_money_at_stake(user=user)),
        "open_states": _state_rows(states, open_states),
        "closed_states": _state_rows(states, closed_states),
        "open_total": sum(states[s.value] for s in open_states),
        "ages": ages,
        "pending_total": sum(n for _, n in ages),
        "ages_chart": bar_chart(ages, tones=["warn"] * len(ages)),
        "latency": latency,
        # Two series side by side per window, each bar named and valued: p50 blue,
        # p95 orange (told apart without colour vision too).
        "latency_chart": grouped_bar_chart(
            [(row["label"], [_seconds(row["p50"]), _seconds(row["p95"])]) for row in latency],
            series=[("p50", "info"), ("p95", "attention")],
            unit="s",
        ),
        "rate": rate,
        "rate_today": rate[-1],
        "rate_chart": line_chart(
            [(row["label"], row["percent"]) for row in rate], unit="%", label_every=3
        ),
        "backlog": backlog,
        "backlog_now": backlog[-1],
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


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


@require_GET
@login_required
def dashboard(request: AuthenticatedHtmxRequest) -> HttpResponse:
    context = figures(request.user, timezone.now())
    return render(request, partial(request, "console/dashboard.html", "panels"), context)
