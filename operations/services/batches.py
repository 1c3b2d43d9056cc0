"""Batches: several registrations, or several outcomes of one run, in one request
(api.md, Batches), for the parallel tool calls of one model turn.

Registrations, on PostgreSQL: every item is worked out as a single call is, before any
transaction (the run and tool read once per pair in the batch; permission, arguments,
intent hash, policies). Consecutive items that take the single call's lean path
(``registration._lean``: no approval, no retry link, no limit over time, a closed
breaker, no webhook subscriber) are then written together, set-based, in one
transaction: one read of their runs and of the keys already taken, one ``INSERT`` of
their operations (``ON CONFLICT DO NOTHING``), one of their attempts and events, and per
run one conditional ``UPDATE`` of its budgets, last, as a single call's. Which items the
budgets admit is decided in order from the run as read, the later ones refused
``budget_exhausted`` as a single call would be; the ``UPDATE`` checks that the run still
affords them all at its commit. When it does not (a racing batch or call of the same
run took some), or a key or concurrency key was taken since the read, the transaction
writes nothing and those items go one by one instead. Every other item (an approval,
a known key's replay, a refusal) is the single call's service, ``operation_register``,
in its own durable transaction, in the batch's order. So each item commits with its
events or not at all, one item's refusal undoes no other, and budgets are exact
whatever races.

Outcomes, on PostgreSQL: one transaction for the batch, each item applied by the single
call's own code with the rows written together at the end
(``attempts_record_outcome_batch`` says how); a refusal that leaves a trace (an
outcome conflict, a late outcome) commits it with the others and is that item's answer.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

from approvals.errors import Refusal

from .. import errors, tokencache
from ..machine import Status
from ..models import Operation, Run, Runner
from . import policies, shadow
from .core import Actor
from .intents import _check_run_budgets, _context, _Intent, _intent
from .outcomes import attempt_record_outcome, attempts_lock, outcome_body, outcome_record_locked
from .registration import (
    Registration,
    _lean,
    lean_rows,
    operation_build,
    operation_register,
)
from .rows import (
    DeferredConflict,
    approvals_known_none,
    db_datetime,
    deferred,
    insert_all,
    insert_each_unless_conflict,
)

# Items per batch request (api.md): what one model turn asks at most, and a bound on
# the work one request holds a worker for.
BATCH_MAX_ITEMS = 50


@dataclass(frozen=True)
class OutcomeItem:
    operation_id: str
    number: int
    body: dict[str, Any]


Answer = Registration | Refusal


@dataclass
class _Planned:
    """An item bound for the set-based write: its place, its call and its intent."""

    index: int
    item: dict[str, Any]
    intent: _Intent


class _Raced(Exception):
    """The set-based write found the runs or keys changed since it read them."""


def _single(runner: Runner, item: dict[str, Any], traceparent: str) -> Answer:
    try:
        return operation_register(runner=runner, traceparent=traceparent, **item)
    except Refusal as refusal:
        return refusal


def operations_register_batch(
    *, runner: Runner, items: Sequence[dict[str, Any]], traceparent: str = ""
) -> list[Answer]:
    """Register each item (``operation_register``'s keyword arguments but the runner and
    the traceparent), in order; each item's answer is its ``Registration`` or the
    refusal the single call raises (the module's docstring says how)."""
    if connection.vendor != "postgresql":
        # The set-based write needs RETURNING and row locks as PostgreSQL takes them.
        return [_single(runner, item, traceparent) for item in items]
    batch = _Batch(runner, traceparent, items)
    with tokencache.policy_generation_held():
        for index, item in enumerate(items):
            batch.place(index, item)
        batch.flush()
    return [answer for answer in batch.answers if answer is not None]


_TAKEN_SQL = (
    "SELECT operation_key FROM operations_operation "
    "WHERE runner_id = %s AND operation_key = ANY(%s)"
)


class _Batch:
    """A registration batch's items, gathered into sets of consecutive lean items.

    People's policies read the run as it is before each registration (its tool calls
    and turns so far: docs/policies.md): the items of a set are judged in order against
    the run as read at the set's start and counted up by the items before them in the
    set, and the run is read again after every set and single call. Keys already taken
    are known before (their items are replays, counting nothing)."""

    def __init__(self, runner: Runner, traceparent: str, items: Sequence[dict[str, Any]]) -> None:
        self.runner, self.traceparent = runner, traceparent
        self.answers: list[Answer | None] = [None] * len(items)
        self.contexts: dict[tuple[str, str], Any] = {}
        self.runs: dict[str, Run] = {}
        self.chunk: list[_Planned] = []
        self.keys: set[str] = set()
        with connection.cursor() as cursor:
            cursor.execute(_TAKEN_SQL, [runner.pk, [item["operation_key"] for item in items]])
            self.taken = {row[0] for row in cursor.fetchall()}

    def place(self, index: int, item: dict[str, Any]) -> None:
        """The item joins the set being gathered, or, in order, the set is written (a
        key twice in the batch is then the first one's replay) and the item goes as a
        single call."""
        key = item["operation_key"]
        planned = None
        if key not in self.taken and key not in self.keys:
            planned = _plan(self.runner, index, item, self.contexts, self.runs)
        if planned is not None:
            self.chunk.append(planned)
            self.keys.add(key)
            return
        self.flush()
        self.answers[index] = _single(self.runner, item, self.traceparent)
        self._forget()

    def flush(self) -> None:
        if not self.chunk:
            return
        for index, answer in _register_set(self.runner, self.chunk, self.traceparent).items():
            self.answers[index] = answer
        self.chunk, self.keys = [], set()
        self._forget()

    def _forget(self) -> None:
        # What was written since moved the runs: read them again for the next items.
        self.contexts.clear()
        self.runs.clear()


def _plan(
    runner: Runner,
    index: int,
    item: dict[str, Any],
    contexts: dict[tuple[str, str], Any],
    runs: dict[str, Run],
) -> _Planned | None:
    """The item's intent when it can be written set-based, else None (it goes as a
    single call, which works it out again and refuses, replays or asks a person). The
    run it is judged against (``runs``, one per run of the set) then counts it."""
    pair = (item["run_id"], item["tool_name"])
    try:
        context = contexts.get(pair)
        if context is None:
            context = contexts[pair] = _context(
                runner=runner, run_id=item["run_id"], tool_name=item["tool_name"]
            )
        fresh, tool, owners = context
        run = runs.setdefault(item["run_id"], fresh)
        intent = _intent(
            runner=runner,
            run=run,
            tool=tool,
            owners=owners,
            tool_name=item["tool_name"],
            arguments=item["arguments"],
            approval=item.get("approval"),
            retry_of=item.get("retry_of"),
        )
    except errors.DomainError:
        return None
    if intent.windowed or not _lean(intent, runner=runner, claim_lease_s=item["claim_lease_s"]):
        return None
    run.tool_calls = (run.tool_calls or 0) + 1
    run.turns = max(run.turns or 0, item.get("turn") or 0)
    return _Planned(index=index, item=item, intent=intent)


_READ_SQL = (
    "SELECT r.id, r.status, r.deadline_at, r.tool_calls, r.max_tool_calls, r.spend, "
    "r.max_spend, r.turns, r.max_turns, ARRAY(SELECT o.operation_key "
    "FROM operations_operation o WHERE o.runner_id = %s AND o.operation_key = ANY(%s)) "
    "FROM operations_run r WHERE r.id = ANY(%s) AND r.runner_id = %s"
)
_COUNT_SQL = (
    "UPDATE operations_run SET tool_calls = tool_calls + %s, "
    "turns = GREATEST(turns, %s), updated_at = %s "
    "WHERE id = %s AND status = %s "
    "AND (deadline_at IS NULL OR deadline_at > %s) "
    "AND (max_tool_calls IS NULL OR tool_calls + %s <= max_tool_calls) "
    "AND (max_spend IS NULL OR spend < max_spend) "
    "AND (max_turns IS NULL OR %s <= max_turns)"
)
_RUN_FIELDS = [
    "id",
    "status",
    "deadline_at",
    "tool_calls",
    "max_tool_calls",
    "spend",
    "max_spend",
    "turns",
    "max_turns",
]


def _register_set(runner: Runner, chunk: list[_Planned], traceparent: str) -> dict[int, Answer]:
    """Write ``chunk`` set-based (the module's docstring); items it cannot write so go
    as single calls, after it, in order."""
    answers: dict[int, Answer] = {}
    try:
        with transaction.atomic(durable=True):
            _write_set(runner, chunk, traceparent, answers)
    except (_Raced, IntegrityError, OperationalError):
        # Nothing was written: every item goes as a single call, in order.
        answers = {planned.index: _single(runner, planned.item, traceparent) for planned in chunk}
    return answers


def _write_set(
    runner: Runner, chunk: list[_Planned], traceparent: str, answers: dict[int, Answer]
) -> None:
    """The set-based transaction's statements, each item's answer into ``answers``;
    ``_Raced`` when the runs or keys moved since the batch read them."""
    now = timezone.now()
    run_ids = sorted({planned.item["run_id"] for planned in chunk})
    with connection.cursor() as cursor:
        cursor.execute(
            _READ_SQL,
            [runner.pk, [planned.item["operation_key"] for planned in chunk], run_ids, runner.pk],
        )
        rows = cursor.fetchall()
    taken = set(rows[0][-1]) if rows else set()
    runs = {row[0]: Run(**dict(zip(_RUN_FIELDS, row[:-1], strict=True))) for row in rows}
    admitted: list[tuple[_Planned, Operation, Any, list[Any]]] = []
    counted: dict[str, list[int]] = {}
    actor = Actor.of_runner(runner)
    refused = False
    for planned in chunk:
        item = planned.item
        run = runs.get(item["run_id"])
        if run is None or item["operation_key"] in taken:
            # A key taken, or a run gone, since the batch read them.
            raise _Raced()
        try:
            _check_run_budgets(run, turn=item.get("turn"), now=now)
        except Refusal as refusal:
            answers[planned.index] = refusal
            refused = True
            continue
        if refused and policies.in_force():
            # The policies judged this item against a run that counted the refused one.
            raise _Raced()
        run.tool_calls += 1
        counted.setdefault(run.pk, []).append(item.get("turn") or 0)
        op, attempt, events = lean_rows(
            _build(runner, planned.intent, item, traceparent, now),
            actor=actor,
            claim_lease_s=item["claim_lease_s"],
            now=now,
        )
        admitted.append((planned, op, attempt, events))
    if not admitted:
        return
    written = insert_each_unless_conflict([op for _, op, _, _ in admitted])
    if len(written) != len(admitted):
        # A key or a concurrency key taken since the read: the budgets counted it.
        raise _Raced()
    insert_all(
        *(attempt for _, _, attempt, _ in admitted if attempt is not None),
        *(event for _, _, _, events in admitted for event in events),
    )
    stamp = db_datetime(now)
    with connection.cursor() as cursor:
        for run_id in sorted(counted):
            turns = counted[run_id]
            top = max(turns)
            cursor.execute(
                _COUNT_SQL,
                [len(turns), top, stamp, run_id, Run.RunStatus.ACTIVE, stamp, len(turns), top],
            )
            if cursor.rowcount != 1:
                raise _Raced()
    for planned, op, attempt, _ in admitted:
        approvals_known_none(op)
        answers[planned.index] = Registration(operation=op, created=True, attempt=attempt)
        if planned.intent.shadow is not None:
            transaction.on_commit(
                partial(shadow.shadow_record, planned.intent.shadow, operation_id=op.id),
                robust=True,
            )


def _build(
    runner: Runner, intent: _Intent, item: dict[str, Any], traceparent: str, now: datetime
) -> Operation:
    run = intent.run
    deadline_s = intent.version.contract["retry"]["deadline_s"]
    return operation_build(
        runner=runner,
        run=run,
        tool=intent.tool,
        version=intent.version,
        operation_key=item["operation_key"],
        frozen=intent.frozen,
        digest=intent.digest,
        principal=run.principal,
        principal_user_id=run.principal_user_id,
        status=Status.READY,
        deadline_at=now + timedelta(seconds=deadline_s) if deadline_s else None,
        now=now,
        call_id=item.get("call_id", ""),
        turn=item.get("turn"),
        traceparent=traceparent,
    )


def _outcome_single(runner: Runner, run_id: str, item: OutcomeItem) -> Operation | Refusal:
    try:
        return attempt_record_outcome(
            operation_id=item.operation_id,
            number=item.number,
            body=item.body,
            runner=runner,
            run_id=run_id,
        )
    except Refusal as refusal:
        return refusal


def attempts_record_outcome_batch(
    *, runner: Runner, run_id: str, items: Sequence[OutcomeItem]
) -> list[Operation | Refusal]:
    """Record each outcome as ``attempt_record_outcome`` does (an operation that is not
    of the run ``run_id`` is ``not_found``, as one that is not the runner's).

    On PostgreSQL, in one transaction: one locking read of every named attempt with its
    operation (in the operations' order), each item's outcome applied by the single
    call's code (``outcome_record_locked``) with the rows it writes gathered
    (``rows.deferred``) and written at the end, three statements for the whole batch.
    An item the read did not find, or a second item for one operation, goes after it as
    a single call; anything unexpected (an item's code raising, a conflict at the
    write) writes nothing and every item goes as a single call.
    """
    if connection.vendor != "postgresql" or len(items) < 2:
        return [_outcome_single(runner, run_id, item) for item in items]
    answers: dict[int, Operation | Refusal] = {}
    later: list[int] = []
    together: list[int] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        (later if item.operation_id in seen else together).append(index)
        seen.add(item.operation_id)
    try:
        with transaction.atomic(durable=True), deferred() as pending:
            later.extend(_outcomes_set(runner, run_id, items, together, answers))
            pending.finish()
    except (_Raced, DeferredConflict, IntegrityError, OperationalError):
        answers, later = {}, list(range(len(items)))
    for index in sorted(later):
        answers[index] = _outcome_single(runner, run_id, items[index])
    return [answers[index] for index in range(len(items))]


def _outcomes_set(
    runner: Runner,
    run_id: str,
    items: Sequence[OutcomeItem],
    together: list[int],
    answers: dict[int, Operation | Refusal],
) -> list[int]:
    """The items ``together`` applied under one lock; those left for single calls."""
    found = attempts_lock(
        [(items[index].operation_id, items[index].number) for index in together], runner=runner
    )
    actor = Actor.of_runner(runner)
    left: list[int] = []
    for index in together:
        item = items[index]
        pair = found.get((item.operation_id, item.number))
        if pair is None:
            # The single call says what is missing: the operation or its attempt.
            left.append(index)
            continue
        op, attempt = pair
        if op.run_id != run_id:
            missing = f"No operation {item.operation_id!r} in run {run_id!r}."
            answers[index] = errors.NotFound(missing)
            continue
        try:
            answers[index] = outcome_record_locked(
                op, attempt=attempt, posted=outcome_body(item.body), actor=actor
            )
        except Refusal as refusal:
            # Raised part-way through, after writes: undo the batch, item by item instead.
            raise _Raced() from refusal
    return left
