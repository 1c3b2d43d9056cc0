"""The runner protocol in one call: ``Runner.execute`` (docs/api.md, Operations).

``execute`` takes one intended effect from registration to an answer the model can
read:

1. Register it under the runner's ``operation_key`` and claim the first attempt in the
   same round trip. A replay (the runner crashed after registering, or the answer was
   lost) returns the same operation and claims nothing.
2. While the operation waits for a person, wait (``Waiter``: polling with backoff, or
   notifications from webhooks) until the request is decided or the wait budget ends.
3. Claim, obeying every refusal: wait ``retry_after_ms`` for ``retry_later`` and
   ``attempt_in_progress``, back off on ``concurrency_conflict``, go back to waiting on
   ``approval_required`` and ``grant_invalid``, stop on ``operation_closed``,
   ``reconciliation_required`` and ``budget_exhausted``, run the undo (when one is
   given) on ``compensation_required``, raise ``ToolForbidden``. When a person
   approved with changes (``superseded``), follow the successor and call the tool with
   the approver's edits applied to the runner's arguments.
4. With a claimed attempt, call the tool with the operation's idempotency key, beating
   the lease's heartbeat from a background thread (``AsyncRunner``: an asyncio task)
   while the call runs, and post what happened. Effectgate classifies it; a retry (a
   ``failed`` retryable code, or ``unknown`` for a repeatable tool) goes back to step 3.
5. Return the tool-result envelope: the one the final outcome's answer carries when the
   operation ended there, else ``GET /operations/{id}/tool-result``.

A ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``,
``SystemExit``, a crash) leaves the tool call without posting anything: the heartbeat
stops and the lease expires, which Effectgate treats as an unknown outcome, exactly as
when the process dies. Nothing here ever calls the tool again after an unknown outcome
of an irreversible or compensable tool: only Effectgate decides that, after
reconciliation.

``execute_many`` takes the parallel calls of one model turn through the same protocol
with one batch registration and batches of outcomes posted as the tools return
(``_many``).

``AsyncRunner`` is ``Runner`` for asyncio: ``await runner.execute(...)`` over an
``AsyncEffectgateClient``, with tool functions that may be coroutine functions. Both
drive the same plan (``_RunnerCore._execute_plan``, see ``_plan``), so every decision
above is made by one piece of code. A cancellation (``asyncio.CancelledError``) during
the tool call is such a ``BaseException``: nothing is posted, the heartbeat task is
cancelled and the lease runs out into an unknown outcome.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Required, TypedDict, Unpack, cast

from . import _many
from ._core import RETRY_STATUSES, _ClientCore
from ._effects import AttemptContext, _Await, _Hold, _Invoke, _Lease, _PostOutcome, _Register
from ._heartbeat import _Heartbeat
from ._plan import Plan, adrive, drive, resolved
from ._values import (
    _travels,
    apply_edits,
    exception_detail,
)
from .answers import Attempt, Operation, RegisteredOperation, ToolResult
from .client import AsyncEffectgateClient, EffectgateClient
from .errors import (
    ApprovalRequired,
    AttemptInProgress,
    BudgetExhausted,
    CompensationRequired,
    ConcurrencyConflict,
    EffectgateError,
    GrantInvalid,
    OperationClosed,
    OutcomeConflict,
    OutcomeNotRecorded,
    PayloadTooLarge,
    ProblemError,
    ReconciliationRequired,
    RetryLater,
    StaleAttempt,
    Superseded,
    TransportError,
    UnexpectedResponse,
)
from .outcomes import Succeeded, ToolOutcome
from .waiters import AsyncPollingWaiter, AsyncWaiter, PollingWaiter, Waiter

logger = logging.getLogger(__name__)

TERMINAL = frozenset(
    {
        "succeeded",
        "rejected",
        "failed_permanent",
        "budget_exhausted",
        "compensated",
        "cancelled",
        "superseded",
    }
)


@dataclass
class ToolCallResult:
    """What ``execute`` ends with.

    ``envelope`` is Effectgate's tool-result for the model; ``operation`` the last
    operation body read; ``output`` what the tool function returned in this process
    (``None`` unless an attempt run here succeeded); ``attempts`` the attempt numbers
    this call claimed; ``refusal`` the code of the refusal that ended the call while
    the operation can still move on (a wait that ran out), else ``None``.
    """

    operation: Operation
    envelope: ToolResult
    output: Any = None
    attempts: list[int] = field(default_factory=list)
    refusal: str | None = None

    @property
    def status(self) -> str:
        return self.envelope["status"]

    def for_model(self) -> dict[str, Any]:
        """The envelope, plus the tool's ``result`` once the operation succeeded."""
        body = dict(self.envelope)
        if self.envelope["status"] == "succeeded" and self.operation.get("result") is not None:
            body["result"] = self.operation["result"]
        return body


ToolFunction = Callable[[AttemptContext], Any]
# A tool function of ``AsyncRunner``: a coroutine function, or a plain one (which then
# runs on the event loop, holding it and the heartbeat until it returns).
AsyncToolFunction = Callable[[AttemptContext], Awaitable[Any] | Any]


class ExecuteOptions(TypedDict, total=False):
    """The optional arguments of ``execute`` (``Runner.execute`` says what each does)."""

    call_id: str | None
    turn: int | None
    approval: dict[str, Any] | None
    undo: Any
    approval_wait_s: float | None
    waiter: Any


class ToolCall(ExecuteOptions, total=False):
    """One call of ``execute_many``: ``execute``'s arguments (``run``, ``tool``,
    ``operation_key``, ``arguments`` and ``call`` required) as a dict."""

    run: Required[str]
    tool: Required[str]
    operation_key: Required[str]
    arguments: Required[dict[str, Any]]
    call: Required[Any]


class RunnerSettings(TypedDict, total=False):
    """The settings both runners take (``Runner`` says what each does; defaults in
    ``_RunnerCore``)."""

    lease_s: int
    heartbeat_every_s: float | None
    wait_s: float
    reconciliation_wait_s: float
    conflict_backoff_s: tuple[float, float]
    clock: Callable[[], float]


class _RunnerCore:
    """The protocol of ``execute`` as one plan, and the settings both runners share."""

    client: Any

    def __init__(
        self,
        client: _ClientCore,
        *,
        waiter: Any,
        lease_s: int = 30,
        heartbeat_every_s: float | None = None,
        wait_s: float = 300.0,
        reconciliation_wait_s: float = 0.0,
        conflict_backoff_s: tuple[float, float] = (0.2, 5.0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.waiter = waiter
        self.lease_s = lease_s
        self.heartbeat_every_s = heartbeat_every_s or max(0.2, lease_s / 3)
        # An attempt starts only while at least this much of its lease is left.
        self.lease_margin_s = min(5.0, lease_s / 5)
        self.wait_s = wait_s
        self.reconciliation_wait_s = reconciliation_wait_s
        self.conflict_backoff_s = conflict_backoff_s
        self.clock = clock

    def _execute_plan(
        self,
        *,
        run: str,
        tool: str,
        operation_key: str,
        arguments: dict[str, Any],
        call: Any,
        call_id: str | None = None,
        turn: int | None = None,
        approval: dict[str, Any] | None = None,
        undo: Any = None,
        approval_wait_s: float | None = None,
        waiter: Any = None,
    ) -> Plan[ToolCallResult]:
        # The lease runs from the server's clock at the claim, which is no earlier than
        # when the claim left here: measured from that moment, it cannot be overstated.
        started = self.clock()
        registered = yield _Register(
            {
                "run": run,
                "tool": tool,
                "operation_key": operation_key,
                "arguments": arguments,
                "call_id": call_id,
                "turn": turn,
                "approval": approval,
                "claim_lease_s": self.lease_s,
            }
        )
        return (
            yield from self._registered_plan(
                registered,
                call=call,
                arguments=arguments,
                started=started,
                undo=undo,
                approval_wait_s=approval_wait_s,
                waiter=waiter,
            )
        )

    def _registered_plan(
        self,
        registered: RegisteredOperation,
        *,
        call: Any,
        arguments: dict[str, Any],
        started: float,
        undo: Any = None,
        approval_wait_s: float | None = None,
        waiter: Any = None,
        lease: _Lease | None = None,
    ) -> Plan[ToolCallResult]:
        """``execute`` from the answer of its registration (sent at ``started``) on:
        ``execute_many`` goes on from each item of its batch registration here, with the
        ``lease`` its heartbeat keeps for an attempt claimed there."""
        client: _ClientCore = self.client
        waiter = waiter or self.waiter
        deadline = started + self.wait_s
        # How long to wait for a person, within the whole wait (0: ask once, go on).
        approval_deadline = (
            deadline if approval_wait_s is None else min(deadline, started + approval_wait_s)
        )
        claim_sent = started
        attempt: Attempt | None = registered.pop("attempt", None)
        registered.pop("claim_error", None)  # the claim below meets the same refusal, typed
        op: Operation = registered
        # The envelope is read once the loop below ends, before the result is returned.
        result = ToolCallResult(operation=op, envelope=cast(ToolResult, {}))
        conflicts = 0
        while True:
            if attempt is not None:
                result.attempts.append(attempt["attempt"])
                if lease is not None:
                    # The inline claim's lease, kept by the heartbeat since.
                    claim_sent, lease = max(claim_sent, lease.since), None
                op = yield from self._attempt_plan(op, attempt, call, arguments, result, claim_sent)
                attempt = None
                continue
            status = op["status"]
            successor = op.get("superseded_by")
            if status == "superseded" and successor:
                # A person approved an edited copy: run that one, with their changes.
                op = yield from client._get_operation_plan(successor)
                arguments = apply_edits(arguments, op.get("edits") or [])
                continue
            if status in TERMINAL:
                break
            if status == "outcome_unknown":
                wait_until = min(deadline, started + self.reconciliation_wait_s)
                if self.clock() >= wait_until:
                    break
                op = yield _Await(waiter, op, status, wait_until)
                continue
            if status == "compensating":
                if undo is None or op.get("error_code") == "compensation_failed":
                    break
                op = yield from self._compensate_plan(op, undo, arguments)
                continue
            if status == "awaiting_approval":
                if self.clock() >= approval_deadline:
                    result.refusal = ApprovalRequired.code
                    break
                op = yield _Await(waiter, op, status, approval_deadline)
                continue
            # ready, or executing under a lease this call does not hold
            try:
                claim_sent = self.clock()
                attempt = yield from client._claim_plan(op["id"], self.lease_s)
                conflicts = 0
            except (RetryLater, AttemptInProgress, ConcurrencyConflict) as refusal:
                if isinstance(refusal, ConcurrencyConflict):
                    low, high = self.conflict_backoff_s
                    wait = random.uniform(0, min(high, low * 2**conflicts))  # noqa: S311
                    conflicts += 1
                else:
                    wait = min((refusal.retry_after_ms or 1000) / 1000, client.max_retry_wait_s)
                if self.clock() + wait > deadline:
                    result.refusal = refusal.code
                    op = yield from client._get_operation_plan(op["id"])
                    break
                yield _Hold(wait)
            except (
                Superseded,
                OperationClosed,
                ReconciliationRequired,
                CompensationRequired,
                ApprovalRequired,
                GrantInvalid,
                BudgetExhausted,
            ):
                # The refusal says where the operation is (grant_invalid and
                # budget_exhausted moved it there); the loop acts on the state it reads.
                op = yield from client._get_operation_plan(op["id"])
        # An outcome's answer carries the envelope for the state it left (api.md): when
        # the call ended there, no further request; otherwise ask for it now.
        # (the answer of post_outcome is an OutcomeAnswer: an operation and its envelope)
        envelope: ToolResult | None = cast(dict[str, Any], op).pop("tool_result", None)
        result.operation = op
        if envelope is None or op["status"] not in TERMINAL:
            envelope = yield from client._tool_result_plan(op["id"])
        result.envelope = envelope
        return result

    def _attempt_plan(
        self,
        op: Operation,
        attempt: Attempt,
        call: Any,
        arguments: dict[str, Any],
        result: ToolCallResult,
        claim_sent: float,
    ) -> Plan[Operation]:
        number = attempt["attempt"]
        if self.clock() - claim_sent > self.lease_s - self.lease_margin_s:
            # The claim took so long to come back that the lease may be over by the
            # time the request reaches the outside world: a probe could then find
            # nothing while the request is still on its way. Do not send it.
            return (
                yield from self._post_outcome_plan(
                    op,
                    number,
                    {
                        "kind": "failed",
                        "code": "not_sent",
                        "detail": "The lease was about to expire before the call started.",
                    },
                )
            )
        context = AttemptContext(
            operation_id=op["id"],
            attempt=number,
            idempotency_key=attempt["idempotency_key"],
            arguments=arguments,
            lease_until=attempt["lease_until"],
        )
        try:
            value = yield _Invoke(call, context, beat=True)
        except ToolOutcome as outcome:
            body = outcome.body()
        except Exception as exc:
            # Whatever went wrong, the request may have left: unknown, never "failed".
            # Only the redacted detail is posted and logged (no traceback: it repeats
            # the message, secrets and all).
            detail = exception_detail(exc)
            logger.error("tool call %s #%d raised %s", op["id"], number, detail)
            body = {"kind": "unknown", "code": "runner_exception", "detail": detail}
        else:
            success = value if isinstance(value, Succeeded) else Succeeded(result=value)
            body = success.body()
            result.output = value
            if not _travels(body):
                # The effect happened: record it even if its result cannot travel
                # (Effectgate refuses what not every JSON reader reads the same).
                body["result"] = {"repr": repr(success.result).replace("\x00", "")[:4000]}
        return (yield from self._post_outcome_plan(op, number, body))

    def _post_outcome_plan(
        self, op: Operation, number: int, body: dict[str, Any]
    ) -> Plan[Operation]:
        client: _ClientCore = self.client
        try:
            return (yield _PostOutcome(op["run"], op["id"], number, body))
        except (StaleAttempt, OutcomeConflict):
            # Recorded as a late outcome (a late success still applies) or refused
            # because the attempt already has another outcome; the operation says which.
            return (yield from client._get_operation_plan(op["id"]))
        except (TransportError, UnexpectedResponse, ProblemError) as exc:
            # Unreachable, still a 429/5xx after every repeat, refused as too large, or
            # an answer that cannot be read: the outcome is not known to be recorded, and
            # the caller must keep it.
            if not isinstance(exc, TransportError) and not _not_recorded(exc):
                raise
            raise OutcomeNotRecorded(
                f"the outcome of {op['id']} attempt {number} could not be posted: {exc}",
                operation_id=op["id"],
                attempt=number,
                outcome=body,
                request_id=exc.request_id,
            ) from exc

    def _compensate_plan(
        self, op: Operation, undo: Any, arguments: dict[str, Any]
    ) -> Plan[Operation]:
        client: _ClientCore = self.client
        context = AttemptContext(
            operation_id=op["id"],
            attempt=op["attempts"],
            idempotency_key=f"{op['idempotency_key']}:undo",
            arguments=arguments,
            lease_until="",
        )
        try:
            evidence = yield _Invoke(undo, context, beat=False)
        except Exception as exc:
            detail = exception_detail(exc)
            logger.error("undo of %s failed: %s", op["id"], detail)
            return (yield from client._compensate_plan(op["id"], "failed", {"error": detail}))
        return (
            yield from client._compensate_plan(
                op["id"],
                "committed",
                evidence if isinstance(evidence, dict) else {"result": evidence},
            )
        )

    def _beat_plan(self, context: AttemptContext, lease: _Lease | None = None) -> Plan[bool]:
        """One heartbeat (noted in ``lease`` when it extended the lease); False once the
        lease is lost (no further beat helps)."""
        client: _ClientCore = self.client
        sent = self.clock()
        try:
            # One repeat at most: the next beat is a repeat too.
            yield from client._heartbeat_plan(
                context.operation_id, context.attempt, self.lease_s, 1
            )
            if lease is not None:
                lease.renewed(sent)
        except StaleAttempt:
            # Something acted on the expired lease (a paused process, a long GC): the
            # outcome will be recorded as a late outcome.
            logger.warning("attempt %s #%d lost its lease", context.operation_id, context.attempt)
            return False
        except EffectgateError as exc:
            logger.warning("heartbeat of %s failed: %s", context.operation_id, exc)
        return True


def _not_recorded(exc: UnexpectedResponse | ProblemError) -> bool:
    """Whether an outcome post answered ``exc`` may have left the outcome unrecorded
    (so it is kept, ``OutcomeNotRecorded``) rather than been refused."""
    if isinstance(exc, PayloadTooLarge):
        return True
    if isinstance(exc, UnexpectedResponse) and 200 <= exc.status < 300:
        return True
    return exc.status in RETRY_STATUSES


class Runner(_RunnerCore):
    """Runs tool calls through Effectgate. Thread-safe; share one per process.

    ``lease_s`` (default 30): the lease of each attempt; the heartbeat extends it every third of
    it, and the tool is not called (``not_sent``) when less than a fifth of it (at
    most 5 s) is left once the claim's answer arrives. ``wait_s``: how long one
    ``execute`` may wait in total (approvals, backoff, ``retry_after_ms``, conflicts)
    before returning with ``refusal`` set (300 s). ``heartbeat_every_s`` overrides the
    heartbeat's pace; ``conflict_backoff_s`` is the (first, largest) backoff after a
    ``concurrency_conflict``; ``clock`` and ``sleep`` are injectable for tests.
    ``reconciliation_wait_s``: how long to wait for an unknown outcome to be answered
    (by a probe or a person) before returning; 0 returns at once.
    """

    client: EffectgateClient
    waiter: Waiter

    def __init__(
        self,
        client: EffectgateClient,
        *,
        waiter: Waiter | None = None,
        sleep: Callable[[float], None] = time.sleep,
        **settings: Unpack[RunnerSettings],
    ) -> None:
        clock = settings.get("clock", time.monotonic)
        super().__init__(
            client, waiter=waiter or PollingWaiter(sleep=sleep, clock=clock), **settings
        )
        self.sleep = sleep

    def execute(
        self,
        *,
        run: str,
        tool: str,
        operation_key: str,
        arguments: dict[str, Any],
        call: ToolFunction,
        **options: Unpack[ExecuteOptions],
    ) -> ToolCallResult:
        """Take one intended effect as far as it can go now; see the module docstring.

        ``call(ctx)`` makes the call to the outside world with ``ctx.idempotency_key``
        and returns its result (or ``Succeeded``), or raises ``NotSent``, ``Failed`` or
        ``Unknown``; any other exception is posted as ``unknown``. ``undo(ctx)`` (for
        compensable tools) undoes the effect with ``ctx.idempotency_key`` (the
        operation's key suffixed ``:undo``); raising means the undo failed.
        ``call_id`` and ``turn`` name the model's call; ``approval`` is the runner's
        approval hint (api.md, Operations).
        ``approval_wait_s``: how long, within ``wait_s``, to wait for a person's decision
        (0 answers ``awaiting_approval`` at once; retries still get their backoff).
        ``waiter``: how this call waits for a person or a reconciliation, instead of the
        runner's own (the MCP gateway's tells its client while a person decides).
        """
        plan = self._execute_plan(
            run=run,
            tool=tool,
            operation_key=operation_key,
            arguments=arguments,
            call=call,
            **options,
        )
        return drive(plan, self._perform)

    def execute_many(
        self, calls: Sequence[ToolCall], *, max_workers: int | None = None
    ) -> list[ToolCallResult | Exception]:
        """The parallel tool calls of one model turn (1 to 50, of one run): one batch
        registration with inline claims, the claimed calls run in a thread pool of
        ``max_workers`` (default: one per call, at most 8; 1 runs them one after
        another; a call waiting for a worker keeps its lease), each under its heartbeat
        until its outcome is recorded, their outcomes posted in batches as the tools
        return. Each item of the answer, in order, is what ``execute`` returns for
        that call, or the exception it would raise (``OutcomeNotRecorded`` keeps an
        outcome that could not be posted, a call refused before sending); a refusal
        before any call was answered raises.
        The calls' tool functions may run at once in several threads. Interrupted (a
        ``BaseException``), it starts no further call, waits for those running and
        posts the outcomes of every tool that returned before re-raising."""
        return _many.execute_many(self, calls, max_workers)

    def _beating(self, context: AttemptContext, lease: _Lease | None = None) -> _Heartbeat:
        heartbeat = _Heartbeat(self, context, lease)
        heartbeat.start()
        return heartbeat

    def _perform(self, effect: Any) -> Any:
        if isinstance(effect, _Invoke):
            if not effect.beat:
                return effect.function(effect.context)
            heartbeat = _Heartbeat(self, effect.context)
            heartbeat.start()
            try:
                return effect.function(effect.context)
            finally:
                heartbeat.stop()
        if isinstance(effect, _Await):
            return effect.waiter.wait(
                self.client, effect.operation, status=effect.status, deadline=effect.deadline
            )
        if isinstance(effect, _Hold):
            return self.sleep(effect.seconds)
        if isinstance(effect, _Register | _PostOutcome):
            return drive(effect.plan(self.client), self.client._perform)
        return self.client._perform(effect)


class AsyncRunner(_RunnerCore):
    """``Runner`` for asyncio, over an ``AsyncEffectgateClient``: ``await
    runner.execute(...)`` with the same arguments and the same protocol. The heartbeat
    is an asyncio task; ``call`` and ``undo`` may be coroutine functions. Share one per
    event loop; concurrent ``execute`` calls are safe (the operation key decides which
    one runs an attempt, as for processes)."""

    client: AsyncEffectgateClient
    waiter: AsyncWaiter

    def __init__(
        self,
        client: AsyncEffectgateClient,
        *,
        waiter: AsyncWaiter | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        **settings: Unpack[RunnerSettings],
    ) -> None:
        clock = settings.get("clock", time.monotonic)
        super().__init__(
            client, waiter=waiter or AsyncPollingWaiter(sleep=sleep, clock=clock), **settings
        )
        self.sleep = sleep

    @classmethod
    def like(cls, runner: Runner) -> AsyncRunner:
        """An ``AsyncRunner`` with the settings of ``runner``, over
        ``AsyncEffectgateClient.like(runner.client)``; its ``PollingWaiter`` becomes an
        ``AsyncPollingWaiter`` with the same pacing. Its own ``sleep`` is not carried
        over (it blocks), nor another kind of waiter (make an ``AsyncRunner`` with an
        async one)."""
        waiter = runner.waiter
        if not isinstance(waiter, PollingWaiter):
            raise TypeError(
                f"a {type(waiter).__name__} cannot wait on an event loop: make an "
                "AsyncRunner with an async waiter (AsyncNotifiedWaiter, AsyncPollingWaiter)"
            )
        return cls(
            AsyncEffectgateClient.like(runner.client),
            waiter=AsyncPollingWaiter(
                initial_s=waiter.initial_s,
                max_s=waiter.max_s,
                factor=waiter.factor,
                clock=waiter.clock,
            ),
            lease_s=runner.lease_s,
            heartbeat_every_s=runner.heartbeat_every_s,
            wait_s=runner.wait_s,
            reconciliation_wait_s=runner.reconciliation_wait_s,
            conflict_backoff_s=runner.conflict_backoff_s,
            clock=runner.clock,
        )

    async def execute(
        self,
        *,
        run: str,
        tool: str,
        operation_key: str,
        arguments: dict[str, Any],
        call: AsyncToolFunction,
        **options: Unpack[ExecuteOptions],
    ) -> ToolCallResult:
        """``Runner.execute``, awaited; ``call`` and ``undo`` may be coroutine
        functions, ``waiter`` an async waiter."""
        plan = self._execute_plan(
            run=run,
            tool=tool,
            operation_key=operation_key,
            arguments=arguments,
            call=call,
            **options,
        )
        return await adrive(plan, self._perform)

    async def execute_many(self, calls: Sequence[ToolCall]) -> list[ToolCallResult | Exception]:
        """``Runner.execute_many``, awaited: the claimed calls run concurrently on the
        event loop, each with its heartbeat task. Cancelled, it cancels the tools still
        running and posts the outcomes of those that returned (shielded) first."""
        return await _many.aexecute_many(self, calls)

    async def _beat(self, context: AttemptContext, lease: _Lease | None = None) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_every_s)
            if not await adrive(self._beat_plan(context, lease), self.client._perform):
                return

    async def _perform(self, effect: Any) -> Any:
        if isinstance(effect, _Invoke):
            if not effect.beat:
                return await resolved(effect.function(effect.context))
            name = f"heartbeat-{effect.context.operation_id}-{effect.context.attempt}"
            heartbeat = asyncio.create_task(self._beat(effect.context), name=name)
            try:
                return await resolved(effect.function(effect.context))
            finally:
                # Also on a cancellation: the lease then runs out, as when a process dies.
                heartbeat.cancel()
        if isinstance(effect, _Await):
            return await effect.waiter.wait(
                self.client, effect.operation, status=effect.status, deadline=effect.deadline
            )
        if isinstance(effect, _Hold):
            return await self.sleep(effect.seconds)
        if isinstance(effect, _Register | _PostOutcome):
            return await adrive(effect.plan(self.client), self.client._perform)
        return await self.client._perform(effect)
