"""The terms a row that decides what may run was opened with, as its opening event
records them and as ``audit verify`` reads them back from the row.

An approval request's quorum, lifetimes, escalation, barred people and editable fields,
a standing grant's family and limits, and a run's budgets, are not statuses: no later
event repeats them, and a plain UPDATE changes them. So the event that opens the row
holds them (``terms`` in its data), and ``audit.state_verify`` compares the row with
that record, column by column. Both sides use the functions here, so what is written
and what is compared cannot drift apart; the values are plain JSON (times as RFC 3339,
money as an exact decimal string), as an event's data is stored.
"""

from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from ..payloads import iso

# Run.max_spend is numeric(20, 6). PostgreSQL rounds a longer value half away from zero
# as it stores it; SQLite keeps a binary float and rounds it as it reads it. Rounded here
# once, the row holds on every database exactly what the event records.
MONEY_PLACES = Decimal("0.000001")


def money(value: float | Decimal | None) -> Decimal | None:
    if value is None:
        return None
    return Decimal(str(value)).quantize(MONEY_PLACES, rounding=ROUND_HALF_UP)


def approval_terms(request: Any, *, editable: list[str] | None) -> dict[str, Any]:
    """What an approval request (``approvals.ApprovalRequest``) decides beside its
    status: who must agree (quorum, barred people, the escalation group and when it may
    decide), until when, on which intent, what the grant is worth, and which argument
    fields a person may change when approving (``editable``, from the contract version
    of the request's operation)."""
    return {
        "intent_hash": request.intent_hash,
        "approvals_required": request.approvals_required,
        "expires_at": iso(request.expires_at),
        "grant_ttl_s": request.grant_ttl_s,
        "escalate_at": iso(request.escalate_at),
        "escalate_to": request.escalate_to,
        # As stored: the context's list is sorted when the request opens, and the
        # contract's list never changes.
        "barred_user_ids": request.context.get("barred_user_ids", []),
        "editable": editable or [],
    }


# The columns of a run its budgets set: the keys of ``run_budgets`` and ``run_terms``.
RUN_BUDGET_COLUMNS = ("max_tool_calls", "max_turns", "deadline_s", "max_spend", "deadline_at")


def run_budgets(budgets: dict[str, Any], *, now: datetime) -> dict[str, Any]:
    """The columns a run's budgets (as the runner sent them, validated) set."""
    deadline_s = budgets.get("deadline_s")
    return {
        "max_tool_calls": budgets.get("max_tool_calls"),
        "max_turns": budgets.get("max_turns"),
        "deadline_s": deadline_s,
        "max_spend": money(budgets.get("max_spend")),
        "deadline_at": now + timedelta(seconds=deadline_s) if deadline_s else None,
    }


def run_terms(run: Any) -> dict[str, Any]:
    """What a run (``operations.Run``) decides for every operation registered in it,
    beside whose it is and on whose behalf (its ``run_created`` event's actor and
    ``principal``): its budgets."""
    max_spend = money(run.max_spend)
    return {
        "max_tool_calls": run.max_tool_calls,
        "max_turns": run.max_turns,
        "deadline_s": run.deadline_s,
        "max_spend": format(max_spend, "f") if max_spend is not None else None,
        "deadline_at": iso(run.deadline_at),
    }


def money_text(value: Decimal | None) -> str | None:
    """An amount as an event records it: the exact decimal, rounded as the row holds it."""
    rounded = money(value)
    return format(rounded, "f") if rounded is not None else None


def standing_grant_terms(grant: Any) -> dict[str, Any]:
    """What a standing grant (``approvals.StandingGrant``) decides beside its status and
    its count of uses: the family it covers, how much of it, until when, and the quorum
    it was issued with."""
    return {
        "tool": grant.tool,
        "principal": grant.principal,
        "run": grant.run_id,
        "pins": grant.pins,
        "max_uses": grant.max_uses,
        "sum_path": grant.sum_path,
        "max_sum": money_text(grant.max_sum),
        "expires_at": iso(grant.expires_at),
        "approvals_required": grant.approvals_required,
    }
