"""Batches: several registrations, or several outcomes of one run, in one request
(api.md, Batches), for the parallel tool calls of one model turn.

Each item is its own unit: the single call's service (``operation_register``,
``attempt_record_outcome``) in its own durable transaction, in the order of the batch.
So an item's transition commits with its audit event or not at all, one item's refusal
undoes no other, a refusal that leaves a trace (``raise_after_commit``) commits it as the
single call does, and budgets stay exact under racing batches: each registration takes
the run's budgets with the same conditional ``UPDATE`` at its own commit, so a batch
holds the run's row only for one item's commit at a time. One transaction with a
savepoint per item would save a commit per item, but it would hold the run's row (and
every key it inserted) from the first item to the last, serializing racing batches of
one run, and it would need every service to run nested instead of ``durable``: the
single calls' guarantee that an answer is committed before it is given.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from approvals.errors import Refusal

from ..models import Operation, Runner
from .outcomes import attempt_record_outcome
from .registration import Registration, operation_register

# Items per batch request (api.md): what one model turn asks at most, and a bound on
# the work one request holds a worker for.
BATCH_MAX_ITEMS = 50


@dataclass(frozen=True)
class OutcomeItem:
    operation_id: str
    number: int
    body: dict[str, Any]


def operations_register_batch(
    *, runner: Runner, items: Sequence[dict[str, Any]], traceparent: str = ""
) -> list[Registration | Refusal]:
    """Register each item (``operation_register``'s keyword arguments but the runner and
    the traceparent), in order, each in its own transaction; each item's answer is its
    ``Registration`` or the refusal the single call raises."""
    answers: list[Registration | Refusal] = []
    for item in items:
        try:
            answers.append(operation_register(runner=runner, traceparent=traceparent, **item))
        except Refusal as refusal:
            answers.append(refusal)
    return answers


def attempts_record_outcome_batch(
    *, runner: Runner, run_id: str, items: Sequence[OutcomeItem]
) -> list[Operation | Refusal]:
    """Record each outcome, in order, each in its own transaction, as
    ``attempt_record_outcome`` does; an operation that is not of the run ``run_id`` is
    ``not_found``, as one that is not the runner's."""
    answers: list[Operation | Refusal] = []
    for item in items:
        try:
            answers.append(
                attempt_record_outcome(
                    operation_id=item.operation_id,
                    number=item.number,
                    body=item.body,
                    runner=runner,
                    run_id=run_id,
                )
            )
        except Refusal as refusal:
            answers.append(refusal)
    return answers
