"""``Runner.execute_many`` and ``AsyncRunner.execute_many``: the parallel tool calls of
one model turn in few batch requests (api.md, Batches).

1. One ``register_many`` registers every call with its inline claim (split into
   requests of at most ``max_batch_bytes`` when the calls are large).
2. Every call claimed there runs (``AsyncRunner``: concurrently; ``Runner``: in a small
   thread pool), each under a heartbeat that lasts until its outcome is recorded, and
   goes on as ``execute`` would until the outcome is to be posted. The calls not claimed
   inline go on as ``execute`` from their registration's answer at once.
3. Outcomes are posted as their tools return: the first with those that return within
   2 ms of it, those that come back while a post is in flight together as soon as it is
   answered (a single outcome goes
   as the single call, a batch too large goes in several requests). Each item's answer,
   or its refusal, or its request's failure, is handed to its call exactly as the
   single ``post_outcome`` would hand it.
4. Every call then goes on to its end as ``execute`` (``_RunnerCore._registered_plan``)
   from there: retries, approvals, replays of finished operations, unknown outcomes.

So each call gets what ``execute`` gives it, decided by the same code; a refusal that
``execute`` raises (an invalid argument, an exhausted budget, an outcome that could not
be recorded: ``OutcomeNotRecorded`` keeps it) is that call's item of the answer, as
``asyncio.gather(..., return_exceptions=True)`` would give it; so is a call ``execute``
would refuse before sending (no operation key, arguments that are not JSON), and, when
some calls were answered, the refusal or failure of a later request (or repeat) for
each call it left unanswered. Only a refusal before any call was answered raises,
before any tool ran.

An interruption (``AsyncRunner``: a cancellation; ``Runner``: a ``BaseException`` such
as ``KeyboardInterrupt``) still posts the outcome of every tool that returned before it
goes on; ``AsyncRunner`` cancels the tools still running (nothing is posted for them,
as for a cancelled ``execute``), ``Runner`` starts no further call and waits for those
running, whose outcomes it posts too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ._effects import AttemptContext, _Invoke, _Lease, _PostOutcome, _Register
from ._plan import Paused, Plan, adrive, adrive_until, drive, drive_until
from ._wire import BATCH_MAX_ITEMS, _chunks, _encoded_size, _register_many_bodies
from .errors import UnexpectedResponse, own_copy

if TYPE_CHECKING:
    from ._core import _ClientCore
    from .runner import AsyncRunner, Runner, ToolCallResult, _RunnerCore

# A sync ``execute_many`` runs at most this many tool calls at once by default.
DEFAULT_WORKERS = 8
# How long the first outcome to post waits for others (the MCP gateway's window).
GATHER_WINDOW_S = 0.002


@dataclass
class _Start:
    """A call after the batch registration: its plan from there on and, when the
    registration claimed, the attempt's context and lease; or the refusal ``execute``
    raises."""

    plan: Plan[ToolCallResult] | None = None
    context: AttemptContext | None = None
    error: Exception | None = None
    lease: _Lease | None = None


def _is_outcome(effect: Any) -> bool:
    return isinstance(effect, _PostOutcome)


def start_plan(runner: _RunnerCore, calls: Sequence[Any]) -> Plan[list[_Start]]:
    if not 1 <= len(calls) <= BATCH_MAX_ITEMS:
        raise ValueError(f"execute_many takes 1 to {BATCH_MAX_ITEMS} calls, not {len(calls)}")
    runs = {call["run"] for call in calls}
    if len(runs) != 1:
        raise ValueError("the calls of one execute_many must be of one run")
    client: _ClientCore = runner.client
    started = runner.clock()
    run = runs.pop()
    # Each call's request body on its own: a call ``execute`` would refuse before
    # sending (no operation key, arguments that are not JSON) is refused alone, and the
    # others go.
    bodies: list[dict[str, Any] | Exception] = []
    for call in calls:
        try:
            bodies.append(_registration_body(run, call, runner.lease_s))
        except (KeyError, TypeError, ValueError) as exc:
            bodies.append(exc)
    valid = [body for body in bodies if not isinstance(body, Exception)]
    answered = iter((yield from client._batch_plan("/operations", valid)) if valid else [])
    starts = []
    for call, body in zip(calls, bodies, strict=True):
        if isinstance(body, Exception):
            starts.append(_Start(error=body))
            continue
        item = next(answered)
        if item.error is not None or item.operation is None:
            starts.append(_Start(error=item.error or UnexpectedResponse(item.status, "no item")))
            continue
        registered = item.operation
        attempt = registered.get("attempt")
        context = lease = None
        if attempt is not None:
            context = AttemptContext(
                operation_id=registered["id"],
                attempt=attempt["attempt"],
                idempotency_key=attempt["idempotency_key"],
                arguments=call["arguments"],
                lease_until=attempt["lease_until"],
            )
            lease = _Lease(started)
        plan = runner._registered_plan(
            registered,
            call=call["call"],
            arguments=call["arguments"],
            started=started,
            undo=call.get("undo"),
            approval_wait_s=call.get("approval_wait_s"),
            waiter=call.get("waiter"),
            lease=lease,
        )
        starts.append(_Start(plan=plan, context=context, lease=lease))
    return starts


def _registration_body(run: str, call: Any, lease_s: int) -> dict[str, Any]:
    """The body ``register_many`` sends for one call, checked as ``httpx`` would encode
    it (``TypeError`` or ``ValueError`` for arguments that are not JSON)."""
    registration = {
        "tool": call["tool"],
        "operation_key": call["operation_key"],
        "arguments": call["arguments"],
        "call_id": call.get("call_id"),
        "turn": call.get("turn"),
        "approval": call.get("approval"),
        "claim_lease_s": lease_s,
    }
    (body,) = _register_many_bodies(run, [registration])
    _encoded_size(body)
    return body


def batch_plan(
    client: _ClientCore, effects: Sequence[_Register] | Sequence[_PostOutcome]
) -> Plan[list[tuple[Any, Exception | None]]]:
    """Perform ``effects`` (all registrations or all outcomes, of one run) in requests of
    at most 50 items and ``client.max_batch_bytes``: a group of one as the single call,
    more as one batch request. Each effect's result, or the exception to throw into its
    plan: its item's refusal, or the failure of the request that carried it (a copy of
    its own)."""
    answers: list[tuple[Any, Exception | None]] = [(None, None)] * len(effects)
    for chunk in _chunks([effect.batch_item() for effect in effects], client.max_batch_bytes):
        group = [effects[i] for i in chunk]
        replies: list[tuple[Any, Exception | None]]
        try:
            if len(group) == 1:
                replies = [((yield from group[0].plan(client)), None)]
            else:
                items = yield from group[0].many_plan(client, [e.batch_item() for e in group])
                replies = [(item.operation, item.error) for item in items]
        except Exception as exc:
            # The whole request failed: each call meets what its single one would.
            replies = [(None, exc if n == 0 else own_copy(exc)) for n in range(len(group))]
        for index, reply in zip(chunk, replies, strict=True):
            answers[index] = reply
    return answers


def _paused(future: Future[Any] | asyncio.Future[Any]) -> bool:
    """Whether a call's step ended at an outcome to post."""
    return (
        not future.cancelled()
        and future.exception() is None
        and isinstance(future.result(), Paused)
    )


def _without_beat(effect: Any) -> Any:
    """A tool call without a heartbeat of its own: the driver beats each claimed
    attempt from the claim until its outcome is recorded."""
    return replace(effect, beat=False) if isinstance(effect, _Invoke) else effect


def _caught(function: Callable[[], Any]) -> Any:
    try:
        return function()
    except Exception as exc:
        return exc


def execute_many(
    runner: Runner, calls: Sequence[Any], max_workers: int | None
) -> list[ToolCallResult | Exception]:
    client = runner.client
    starts = drive(start_plan(runner, calls), runner._perform)
    answers: list[Any] = [start.error for start in starts]
    workers = max_workers or max(1, min(len(starts), DEFAULT_WORKERS))
    beats = {
        i: runner._beating(start.context, start.lease)
        for i, start in enumerate(starts)
        if start.context is not None
    }
    running: dict[Future[Any], int] = {}
    waiting: dict[int, Paused] = {}

    def quiet(effect: Any) -> Any:
        return runner._perform(_without_beat(effect))

    def first(plan: Plan[Any]) -> Any:
        return _caught(lambda: drive_until(plan, quiet, _is_outcome))

    def whole(plan: Plan[Any], reply: Any = None, error: Exception | None = None) -> Any:
        return _caught(lambda: drive(plan, runner._perform, reply=reply, error=error))

    def post(indexes: list[int]) -> list[tuple[Any, Exception | None]]:
        try:
            effects = [waiting[i].effect for i in indexes]
            return drive(batch_plan(client, effects), client._perform)
        finally:
            for i in indexes:
                beats.pop(i).stop()

    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="execute-many")
    try:
        for i, start in enumerate(starts):
            if start.plan is not None:
                running[pool.submit(first if i in beats else whole, start.plan)] = i
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            if running.keys() - done and any(_paused(future) for future in done):
                # Others that return within the window share the first one's post.
                done, _ = wait(running, timeout=GATHER_WINDOW_S)
            for future in sorted(done, key=running.__getitem__):
                i = running.pop(future)
                answer = future.result()
                if isinstance(answer, Paused):
                    waiting[i] = answer
                else:
                    answers[i] = answer
                    if i in beats:
                        beats.pop(i).stop()
            if waiting:
                # The outcomes that came back while the last post was in flight.
                indexes = sorted(waiting)
                replies = post(indexes)
                for i, (reply, error) in zip(indexes, replies, strict=True):
                    plan = waiting.pop(i).plan
                    running[pool.submit(whole, plan, reply, error)] = i
    except BaseException:
        # Interrupted: start no further call, let those running end, and post the
        # outcome of every tool that returned before going on.
        pool.shutdown(wait=True, cancel_futures=True)
        for future, i in running.items():
            if future.done() and _paused(future):
                waiting[i] = future.result()
        if waiting:
            drive(batch_plan(client, [waiting[i].effect for i in sorted(waiting)]), client._perform)
        raise
    finally:
        for beat in beats.values():
            beat.stop()
        pool.shutdown(wait=True)
    return answers


async def aexecute_many(
    runner: AsyncRunner, calls: Sequence[Any]
) -> list[ToolCallResult | Exception]:
    client = runner.client
    starts = await adrive(start_plan(runner, calls), runner._perform)
    answers: list[Any] = [start.error for start in starts]
    beats = {
        i: asyncio.create_task(runner._beat(start.context, start.lease))
        for i, start in enumerate(starts)
        if start.context is not None
    }
    running: dict[asyncio.Future[Any], int] = {}
    waiting: dict[int, Paused] = {}
    posting: asyncio.Future[Any] | None = None

    async def quiet(effect: Any) -> Any:
        return await runner._perform(_without_beat(effect))

    async def first(plan: Plan[Any]) -> Any:
        try:
            return await adrive_until(plan, quiet, _is_outcome)
        except Exception as exc:
            return exc

    async def whole(plan: Plan[Any], reply: Any = None, error: Exception | None = None) -> Any:
        try:
            return await adrive(plan, runner._perform, reply=reply, error=error)
        except Exception as exc:
            return exc

    async def post(indexes: list[int]) -> list[tuple[Any, Exception | None]]:
        try:
            effects = [waiting[i].effect for i in indexes]
            return await adrive(batch_plan(client, effects), client._perform)
        finally:
            for i in indexes:
                beats.pop(i).cancel()

    try:
        for i, start in enumerate(starts):
            if start.plan is not None:
                step = first if i in beats else whole
                running[asyncio.ensure_future(step(start.plan))] = i
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            if running.keys() - done and any(_paused(task) for task in done):
                # Others that return within the window share the first one's post.
                done, _ = await asyncio.wait(running, timeout=GATHER_WINDOW_S)
            for task in sorted(done, key=running.__getitem__):
                i = running.pop(task)
                answer = task.result()
                if isinstance(answer, Paused):
                    waiting[i] = answer
                else:
                    answers[i] = answer
                    if i in beats:
                        beats.pop(i).cancel()
            if waiting:
                # The outcomes that came back while the last post was in flight.
                indexes = sorted(waiting)
                posting = asyncio.ensure_future(post(indexes))
                replies = await asyncio.shield(posting)
                posting = None
                for i, (reply, error) in zip(indexes, replies, strict=True):
                    plan = waiting.pop(i).plan
                    running[asyncio.ensure_future(whole(plan, reply, error))] = i
    except BaseException:
        # Cancelled: the tools still running are cancelled (nothing is posted for them,
        # as for a cancelled ``execute``); the outcome of every tool that returned is
        # posted, shielded, before the cancellation goes on.
        for task in running:
            if task.done() and _paused(task):
                waiting[running[task]] = task.result()
            task.cancel()
        if posting is not None:
            await asyncio.shield(posting)
        rest = sorted(i for i in waiting if i in beats)
        if rest:
            await asyncio.shield(asyncio.ensure_future(post(rest)))
        raise
    finally:
        for beat in beats.values():
            beat.cancel()
    return answers
