"""What a reviewer should know before deciding one approval request, read once per page:
the reasons in words, the amount at stake, and the risk signals (another operation of
the run unknown or failed, the principal's first operation of those the person may see,
the amount against the tool's usual range, edits an earlier approver made).

Every read is bounded: the run's other operations (at most ``SIBLINGS``), one index
probe for the principal, and the value at the amount's pointer of the tool's last
``RANGE_WINDOW`` succeeded operations, each through an index. Amounts are plain
decimals of at most 30 digits a side (``display.AMOUNT``): "1e9999999" is no amount.
Operations the person may not see are never named.
"""

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from approvals.models import ApprovalRequest
from approvals.people import Person
from approvals.policy import is_missing, resolve_pointer

from ..contracts import display, explain
from ..machine import Status
from ..models import Operation
from .dashboard import text_at
from .people import operations_visible_to

SIBLINGS = 5
RANGE_WINDOW = 200
# Fewer earlier amounts than this say nothing about what is usual.
RANGE_MINIMUM = 5
TROUBLE = {
    Status.OUTCOME_UNKNOWN: "is still outcome unknown",
    Status.COMPENSATING: "is being undone (compensating)",
    Status.FAILED_PERMANENT: "failed",
    Status.BUDGET_EXHAUSTED: "ran out of retries or time",
}


@dataclass(frozen=True)
class Signal:
    """One thing that should make a reviewer look twice (tone ``bad``, ``warn``) or that
    reassures (``info``)."""

    tone: str
    text: str
    operation_id: str = ""


@dataclass(frozen=True)
class Brief:
    reasons: list[str]
    runner_reason: str
    amount: str
    signals: list[Signal] = field(default_factory=list)


def _amount(value: Any) -> tuple[Decimal, Any] | None:
    """A plain decimal amount (``display.AMOUNT``: at most 30 digits each side, so no
    exponent a runner could make costly), with the JSON value it reads as; else None."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    text = str(value)
    if not display.AMOUNT.fullmatch(text):
        return None
    # Read back from the database as text: an integer is the integer it was.
    shown = int(text) if "." not in text else value
    return Decimal(text), shown


def _percentile(values: list[tuple[Decimal, Any]], share: float) -> tuple[Decimal, Any]:
    ordered = sorted(values, key=lambda pair: pair[0])
    return ordered[min(len(ordered) - 1, int(share * (len(ordered) - 1) + 0.5))]


def _siblings(op: Operation, user: Person) -> list[Signal]:
    others = (
        operations_visible_to(user)
        .filter(run_id=op.run_id, status__in=list(TROUBLE))
        .exclude(pk=op.pk)
        .select_related("tool_version")
        .order_by("-id")[:SIBLINGS]
    )
    signals = []
    for other in others:
        what = display.summary(other.tool_version.contract, other.arguments)
        signals.append(
            Signal(
                tone="bad",
                text=f"Another operation of this run {TROUBLE[Status(other.status)]}: "
                f"{other.tool_id}, {what}",
                operation_id=other.id,
            )
        )
    return signals


def _usual_range(op: Operation, contract: dict[str, Any], pointer: str) -> Signal | None:
    # Only the value at the pointer, not 200 whole argument documents.
    earlier = (
        Operation.objects.filter(tool_id=op.tool_id, status=Status.SUCCEEDED, id__lt=op.id)
        .order_by("-id")
        .values_list(text_at(pointer), flat=True)[:RANGE_WINDOW]
    )
    amounts = [amount for value in earlier if (amount := _amount(value)) is not None]
    current = _amount(resolve_pointer(op.arguments, pointer))
    if current is None or len(amounts) < RANGE_MINIMUM:
        return None
    low, high = _percentile(amounts, 0.1), _percentile(amounts, 0.9)
    span = (
        f"{display.describe(contract, pointer, low[1])} to "
        f"{display.describe(contract, pointer, high[1])}"
    )
    usual = f"for 8 in 10 of its last {len(amounts)} succeeded operations"
    if current[0] > high[0]:
        return Signal("warn", f"Above this tool's usual range: {span} {usual}")
    if current[0] < low[0]:
        return Signal("info", f"Below this tool's usual range: {span} {usual}")
    return Signal("info", f"Within this tool's usual range: {span} {usual}")


def approval_brief(*, request: ApprovalRequest, user: Person) -> Brief:
    op = request.operation
    contract = op.tool_version.contract
    context = request.context if isinstance(request.context, dict) else {}
    pointer = display.amount_pointer(contract)
    value = resolve_pointer(op.arguments, pointer) if pointer else None
    amount = display.describe(contract, pointer, value) if pointer and not is_missing(value) else ""
    signals = _siblings(op, user)
    # Of the operations this person may see (another tool's would tell them of it).
    # Ordered as the index (op_principal_id) is: one index probe, also where most of
    # the ledger is one principal's and a plain EXISTS would scan the table.
    earlier = (
        operations_visible_to(user)
        .filter(principal=op.principal, id__lt=op.id)
        .order_by("principal", "id")
        .values_list("id", flat=True)[:1]
    )
    if not list(earlier):
        signals.append(Signal("warn", f"The first operation for {op.principal}"))
    if pointer is not None:
        usual = _usual_range(op, contract, pointer)
        if usual is not None:
            signals.append(usual)
    for change in op.edits or []:
        path = str(change.get("path", ""))
        label = display.field_for(contract, path)["label"]
        before = display.describe(contract, path, change.get("from"))
        after = display.describe(contract, path, change.get("to"))
        signals.append(Signal("warn", f"An earlier approver changed {label}: {before} → {after}"))
    return Brief(
        reasons=explain.reasons_in_words(
            contract, context, arguments=op.arguments, tool=op.tool_id
        ),
        runner_reason=explain.runner_reason(context, contract, op.arguments),
        amount=amount,
        signals=signals,
    )
