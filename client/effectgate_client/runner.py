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
   the lease's heartbeat from a background thread while the call runs, and post what
   happened. Effectgate classifies it; a retry (a ``failed`` retryable code, or
   ``unknown`` for a repeatable tool) goes back to step 3.
5. Return the tool-result envelope: the one the final outcome's answer carries when the
   operation ended there, else ``GET /operations/{id}/tool-result``.

A ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``,
``SystemExit``, a crash) leaves the tool call without posting anything: the heartbeat
stops and the lease expires, which Effectgate treats as an unknown outcome, exactly as
when the process dies. Nothing here ever calls the tool again after an unknown outcome
of an irreversible or compensable tool: only Effectgate decides that, after
reconciliation.
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .client import EffectgateClient
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
    ReconciliationRequired,
    RetryLater,
    StaleAttempt,
    Superseded,
    TransportError,
)
from .outcomes import Succeeded, ToolOutcome
from .waiters import PollingWaiter, Waiter

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


SAFE_INTEGER = 2**53 - 1
MAX_DEPTH = 64


def _travels(value: Any, depth: int = 0) -> bool:
    """Whether Effectgate's strict JSON accepts ``value``: no NaN or infinity, numbers
    within 2**53 (a float beyond is an integer beyond, 1e300 included), no U+0000 or
    lone surrogate, nesting under 64 levels."""
    if depth > MAX_DEPTH:
        return False
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -SAFE_INTEGER <= value <= SAFE_INTEGER
    if isinstance(value, float):
        return math.isfinite(value) and abs(value) <= SAFE_INTEGER
    if isinstance(value, str):
        if "\x00" in value:
            return False
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, list | tuple):
        return all(_travels(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(
            isinstance(key, str) and _travels(key, depth) and _travels(item, depth + 1)
            for key, item in value.items()
        )
    return False


def apply_edits(arguments: dict[str, Any], edits: list[dict[str, Any]]) -> dict[str, Any]:
    """The runner's own arguments with an approver's edits applied (each edit's ``path``
    is a JSON pointer, ``to`` the new value). Applied to the runner's copy, not to the
    stored arguments, because sensitive values are stored as digests; an approver
    cannot edit a sensitive field."""
    edited = json.loads(json.dumps(arguments))
    for edit in edits:
        tokens = [
            token.replace("~1", "/").replace("~0", "~") for token in edit["path"].split("/")[1:]
        ]
        parent: Any = edited
        for token in tokens[:-1]:
            parent = (
                parent[int(token)] if isinstance(parent, list) else parent.setdefault(token, {})
            )
        if isinstance(parent, list):
            parent[int(tokens[-1])] = edit["to"]
        else:
            parent[tokens[-1]] = edit["to"]
    return edited


@dataclass(frozen=True)
class AttemptContext:
    """What a tool function needs to make its call."""

    operation_id: str
    attempt: int
    idempotency_key: str
    arguments: dict[str, Any]
    lease_until: str


@dataclass
class ToolCallResult:
    """What ``execute`` ends with.

    ``envelope`` is Effectgate's tool-result for the model; ``operation`` the last
    operation body read; ``output`` what the tool function returned in this process
    (``None`` unless an attempt run here succeeded); ``attempts`` the attempt numbers
    this call claimed; ``refusal`` the code of the refusal that ended the call while
    the operation can still move on (a wait that ran out), else ``None``.
    """

    operation: dict[str, Any]
    envelope: dict[str, Any]
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


class _Heartbeat:
    """Extends an attempt's lease from a daemon thread until stopped."""

    def __init__(
        self,
        client: EffectgateClient,
        operation_id: str,
        attempt: int,
        lease_s: int,
        every_s: float,
    ) -> None:
        self.client = client
        self.operation_id = operation_id
        self.attempt = attempt
        self.lease_s = lease_s
        self.every_s = every_s
        self.beats = 0
        self.stale = False
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{operation_id}-{attempt}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                # One repeat at most: the next beat is a repeat too.
                self.client.heartbeat(
                    self.operation_id, self.attempt, lease_s=self.lease_s, max_retries=1
                )
                self.beats += 1
            except StaleAttempt:
                # Something acted on the expired lease (a paused process, a long GC):
                # the outcome will be recorded as a late outcome.
                self.stale = True
                logger.warning("attempt %s #%d lost its lease", self.operation_id, self.attempt)
                return
            except EffectgateError as exc:
                logger.warning("heartbeat of %s failed: %s", self.operation_id, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.every_s + 1)


ToolFunction = Callable[[AttemptContext], Any]


class Runner:
    """Runs tool calls through Effectgate. Thread-safe; share one per process.

    ``lease_s``: the lease of each attempt; the heartbeat extends it every third of
    it, and the tool is not called (``not_sent``) when less than a fifth of it (at
    most 5 s) is left once the claim's answer arrives. ``wait_s``: how long one
    ``execute`` may wait in total (approvals, backoff, ``retry_after_ms``, conflicts)
    before returning with ``refusal`` set.
    ``reconciliation_wait_s``: how long to wait for an unknown outcome to be answered
    (by a probe or a person) before returning; 0 returns at once.
    """

    def __init__(
        self,
        client: EffectgateClient,
        *,
        waiter: Waiter | None = None,
        lease_s: int = 30,
        heartbeat_every_s: float | None = None,
        wait_s: float = 300.0,
        reconciliation_wait_s: float = 0.0,
        conflict_backoff_s: tuple[float, float] = (0.2, 5.0),
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.waiter: Waiter = waiter or PollingWaiter(sleep=sleep, clock=clock)
        self.lease_s = lease_s
        self.heartbeat_every_s = heartbeat_every_s or max(0.2, lease_s / 3)
        # An attempt starts only while at least this much of its lease is left.
        self.lease_margin_s = min(5.0, lease_s / 5)
        self.wait_s = wait_s
        self.reconciliation_wait_s = reconciliation_wait_s
        self.conflict_backoff_s = conflict_backoff_s
        self.sleep = sleep
        self.clock = clock

    def execute(
        self,
        *,
        run: str,
        tool: str,
        operation_key: str,
        arguments: dict[str, Any],
        call: ToolFunction,
        call_id: str | None = None,
        turn: int | None = None,
        approval: dict[str, Any] | None = None,
        undo: ToolFunction | None = None,
        approval_wait_s: float | None = None,
        waiter: Waiter | None = None,
    ) -> ToolCallResult:
        """Take one intended effect as far as it can go now; see the module docstring.

        ``call(ctx)`` makes the call to the outside world with ``ctx.idempotency_key``
        and returns its result (or ``Succeeded``), or raises ``NotSent``, ``Failed`` or
        ``Unknown``; any other exception is posted as ``unknown``. ``undo(ctx)`` (for
        compensable tools) undoes the effect with ``ctx.idempotency_key`` (the
        operation's key suffixed ``:undo``); raising means the undo failed.
        ``approval_wait_s``: how long, within ``wait_s``, to wait for a person's decision
        (0 answers ``awaiting_approval`` at once; retries still get their backoff).
        ``waiter``: how this call waits for a person or a reconciliation, instead of the
        runner's own (the MCP gateway's tells its client while a person decides).
        """
        waiter = waiter or self.waiter
        started = self.clock()
        deadline = started + self.wait_s
        # How long to wait for a person, within the whole wait (0: ask once, go on).
        approval_deadline = (
            deadline if approval_wait_s is None else min(deadline, started + approval_wait_s)
        )
        # The lease runs from the server's clock at the claim, which is no earlier than
        # when the claim left here: measured from that moment, it cannot be overstated.
        claim_sent = self.clock()
        op = self.client.register(
            run=run,
            tool=tool,
            operation_key=operation_key,
            arguments=arguments,
            call_id=call_id,
            turn=turn,
            approval=approval,
            claim_lease_s=self.lease_s,
        )
        attempt = op.pop("attempt", None)
        op.pop("claim_error", None)  # the claim below meets the same refusal, typed
        result = ToolCallResult(operation=op, envelope={})
        conflicts = 0
        while True:
            if attempt is not None:
                result.attempts.append(attempt["attempt"])
                op = self._run_attempt(op, attempt, call, arguments, result, claim_sent)
                attempt = None
                continue
            status = op["status"]
            if status == "superseded" and op.get("superseded_by"):
                # A person approved an edited copy: run that one, with their changes.
                op = self.client.get_operation(op["superseded_by"])
                arguments = apply_edits(arguments, op.get("edits") or [])
                continue
            if status in TERMINAL:
                break
            if status == "outcome_unknown":
                wait_until = min(deadline, started + self.reconciliation_wait_s)
                if self.clock() >= wait_until:
                    break
                op = waiter.wait(self.client, op, status=status, deadline=wait_until)
                continue
            if status == "compensating":
                if undo is None or op.get("error_code") == "compensation_failed":
                    break
                op = self._compensate(op, undo, arguments)
                continue
            if status == "awaiting_approval":
                if self.clock() >= approval_deadline:
                    result.refusal = ApprovalRequired.code
                    break
                op = waiter.wait(self.client, op, status=status, deadline=approval_deadline)
                continue
            # ready, or executing under a lease this call does not hold
            try:
                claim_sent = self.clock()
                attempt = self.client.claim(op["id"], lease_s=self.lease_s)
                conflicts = 0
            except (RetryLater, AttemptInProgress) as refusal:
                wait = (refusal.retry_after_ms or 1000) / 1000
                if self.clock() + wait > deadline:
                    result.refusal = refusal.code
                    op = self.client.get_operation(op["id"])
                    break
                self.sleep(wait)
            except ConcurrencyConflict as refusal:
                low, high = self.conflict_backoff_s
                wait = random.uniform(0, min(high, low * 2**conflicts))  # noqa: S311
                conflicts += 1
                if self.clock() + wait > deadline:
                    result.refusal = refusal.code
                    op = self.client.get_operation(op["id"])
                    break
                self.sleep(wait)
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
                op = self.client.get_operation(op["id"])
        # An outcome's answer carries the envelope for the state it left (api.md): when
        # the call ended there, no further request; otherwise ask for it now.
        envelope = op.pop("tool_result", None)
        result.operation = op
        if envelope is None or op["status"] not in TERMINAL:
            envelope = self.client.tool_result(op["id"])
        result.envelope = envelope
        return result

    def _run_attempt(
        self,
        op: dict[str, Any],
        attempt: dict[str, Any],
        call: ToolFunction,
        arguments: dict[str, Any],
        result: ToolCallResult,
        claim_sent: float,
    ) -> dict[str, Any]:
        number = attempt["attempt"]
        if self.clock() - claim_sent > self.lease_s - self.lease_margin_s:
            # The claim took so long to come back that the lease may be over by the
            # time the request reaches the outside world: a probe could then find
            # nothing while the request is still on its way. Do not send it.
            return self._post_outcome(
                op,
                number,
                {
                    "kind": "failed",
                    "code": "not_sent",
                    "detail": "The lease was about to expire before the call started.",
                },
            )
        context = AttemptContext(
            operation_id=op["id"],
            attempt=number,
            idempotency_key=attempt["idempotency_key"],
            arguments=arguments,
            lease_until=attempt["lease_until"],
        )
        heartbeat = _Heartbeat(self.client, op["id"], number, self.lease_s, self.heartbeat_every_s)
        heartbeat.start()
        try:
            try:
                value = call(context)
            except ToolOutcome as outcome:
                body = outcome.body()
            except Exception as exc:
                # Whatever went wrong, the request may have left: unknown, never "failed".
                logger.exception("tool call %s #%d raised", op["id"], number)
                body = {
                    "kind": "unknown",
                    "code": "runner_exception",
                    "detail": f"{type(exc).__name__}: {exc}"[:4000],
                }
            else:
                success = value if isinstance(value, Succeeded) else Succeeded(result=value)
                body = success.body()
                result.output = value
                if not _travels(body):
                    # The effect happened: record it even if its result cannot travel
                    # (Effectgate refuses what not every JSON reader reads the same).
                    body["result"] = {"repr": repr(success.result).replace("\x00", "")[:4000]}
        finally:
            heartbeat.stop()
        return self._post_outcome(op, number, body)

    def _post_outcome(self, op: dict[str, Any], number: int, body: dict[str, Any]) -> dict:
        try:
            return self.client.post_outcome(op["id"], number, body)
        except (StaleAttempt, OutcomeConflict):
            # Recorded as a late outcome (a late success still applies) or refused
            # because the attempt already has another outcome; the operation says which.
            return self.client.get_operation(op["id"])
        except TransportError as exc:
            raise OutcomeNotRecorded(
                f"the outcome of {op['id']} attempt {number} could not be posted: {exc}",
                operation_id=op["id"],
                attempt=number,
                outcome=body,
            ) from exc

    def _compensate(
        self, op: dict[str, Any], undo: ToolFunction, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        context = AttemptContext(
            operation_id=op["id"],
            attempt=op["attempts"],
            idempotency_key=f"{op['idempotency_key']}:undo",
            arguments=arguments,
            lease_until="",
        )
        try:
            evidence = undo(context)
        except Exception as exc:
            logger.exception("undo of %s failed", op["id"])
            return self.client.compensate(
                op["id"],
                result="failed",
                evidence={"error": f"{type(exc).__name__}: {exc}"[:2000]},
            )
        return self.client.compensate(
            op["id"],
            result="committed",
            evidence=evidence if isinstance(evidence, dict) else {"result": evidence},
        )
