"""``Runner.execute_many`` and ``AsyncRunner.execute_many``: the parallel tool calls of
one model turn in two batch requests (api.md, Batches).

1. One ``register_many`` registers every call with its inline claim.
2. Every call claimed there runs (``AsyncRunner``: concurrently; ``Runner``: in a small
   thread pool), each under a heartbeat that lasts until its outcome is recorded, and
   goes on as ``execute`` would until the outcome is to be posted.
3. One ``post_outcomes`` posts those outcomes (a single outcome goes as the single
   call); each item's answer, or its refusal, or the whole request's failure, is handed
   to its call exactly as the single ``post_outcome`` would hand it.
4. Every call then goes on to its end as ``execute`` (``_RunnerCore._registered_plan``)
   from its registration's answer: retries, approvals, replays of finished operations,
   unknown outcomes. The calls not claimed inline start here.

So each call gets what ``execute`` gives it, decided by the same code; a refusal that
``execute`` raises (an invalid argument, an exhausted budget, an outcome that could not
be recorded: ``OutcomeNotRecorded`` keeps it) is that call's item of the answer, as
``asyncio.gather(..., return_exceptions=True)`` would give it. Only a refusal of the
whole registration request raises, before any tool ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ._effects import AttemptContext, _Invoke, _PostOutcome
from ._plan import Paused, Plan, adrive, adrive_until, drive, drive_until
from ._wire import BATCH_MAX_ITEMS

if TYPE_CHECKING:
    from .client import _ClientCore
    from .runner import AsyncRunner, Runner, ToolCallResult, _RunnerCore

# A sync ``execute_many`` runs at most this many tool calls at once by default.
DEFAULT_WORKERS = 8


@dataclass
class _Start:
    """A call after the batch registration: its plan from there on and, when the
    registration claimed, the attempt's context; or the refusal ``execute`` raises."""

    plan: Plan[ToolCallResult] | None = None
    context: AttemptContext | None = None
    error: Exception | None = None


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
    registrations = [
        {
            "tool": call["tool"],
            "operation_key": call["operation_key"],
            "arguments": call["arguments"],
            "call_id": call.get("call_id"),
            "turn": call.get("turn"),
            "approval": call.get("approval"),
            "claim_lease_s": runner.lease_s,
        }
        for call in calls
    ]
    items = yield from client._register_many_plan(runs.pop(), registrations)
    starts = []
    for call, item in zip(calls, items, strict=True):
        if item.error is not None or item.operation is None:
            starts.append(_Start(error=item.error))
            continue
        registered = item.operation
        attempt = registered.get("attempt")
        context = None
        if attempt is not None:
            context = AttemptContext(
                operation_id=registered["id"],
                attempt=attempt["attempt"],
                idempotency_key=attempt["idempotency_key"],
                arguments=call["arguments"],
                lease_until=attempt["lease_until"],
            )
        plan = runner._registered_plan(
            registered,
            call=call["call"],
            arguments=call["arguments"],
            started=started,
            undo=call.get("undo"),
            approval_wait_s=call.get("approval_wait_s"),
            waiter=call.get("waiter"),
        )
        starts.append(_Start(plan=plan, context=context))
    return starts


def outcomes_plan(
    client: _ClientCore, effects: list[_PostOutcome]
) -> Plan[list[tuple[Any, Exception | None]]]:
    """Post the outcomes of ``effects`` (of one run) in one request; each effect's
    result or the exception to throw into its plan."""
    if not effects:
        return []
    try:
        if len(effects) == 1:
            return [((yield from effects[0].plan(client)), None)]
        items = yield from client._post_outcomes_plan(
            effects[0].run, [effect.batch_item() for effect in effects]
        )
    except Exception as exc:
        # The whole request failed: each outcome meets what its single post would.
        return [(None, exc) for _ in effects]
    return [(item.operation, item.error) for item in items]


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
    starts = drive(start_plan(runner, calls), runner._perform)
    answers: list[Any] = [start.error for start in starts]
    claimed = [i for i, start in enumerate(starts) if start.context is not None]
    workers = max_workers or max(1, min(len(starts), DEFAULT_WORKERS))
    paused: dict[int, Paused] = {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="execute-many") as pool:
        beats = [runner._beating(starts[i].context) for i in claimed]  # type: ignore[arg-type]
        try:

            def first(i: int) -> Any:
                def quiet(effect: Any) -> Any:
                    return runner._perform(_without_beat(effect))

                plan = starts[i].plan
                return _caught(lambda: drive_until(plan, quiet, _is_outcome))  # type: ignore[arg-type]

            for i, answer in zip(claimed, pool.map(first, claimed), strict=True):
                if isinstance(answer, Paused):
                    paused[i] = answer
                else:
                    answers[i] = answer
            order = sorted(paused)
            posted = drive(
                outcomes_plan(runner.client, [paused[i].effect for i in order]),
                runner.client._perform,
            )
        finally:
            for beat in beats:
                beat.stop()
        replies = dict(zip(order, posted, strict=True))

        def finish(i: int) -> Any:
            if i in paused:
                reply, error = replies[i]
                plan = paused[i].plan
                return _caught(lambda: drive(plan, runner._perform, reply=reply, error=error))
            return _caught(lambda: drive(starts[i].plan, runner._perform))  # type: ignore[arg-type]

        done = _ended_early(claimed, paused)
        rest = [i for i, start in enumerate(starts) if start.plan is not None and i not in done]
        for i, answer in zip(rest, pool.map(finish, rest), strict=True):
            answers[i] = answer
    return answers


def _ended_early(claimed: list[int], paused: dict[int, Paused]) -> set[int]:
    """The claimed calls that ended before posting an outcome (their answer is in)."""
    return {i for i in claimed if i not in paused}


async def aexecute_many(
    runner: AsyncRunner, calls: Sequence[Any]
) -> list[ToolCallResult | Exception]:
    starts = await adrive(start_plan(runner, calls), runner._perform)
    answers: list[Any] = [start.error for start in starts]
    claimed = [i for i, start in enumerate(starts) if start.context is not None]
    paused: dict[int, Paused] = {}

    async def quiet(effect: Any) -> Any:
        return await runner._perform(_without_beat(effect))

    async def first(i: int) -> Any:
        try:
            return await adrive_until(starts[i].plan, quiet, _is_outcome)  # type: ignore[arg-type]
        except Exception as exc:
            return exc

    beats = [
        asyncio.create_task(runner._beat(starts[i].context))  # type: ignore[arg-type]
        for i in claimed
    ]
    try:
        for i, answer in zip(claimed, await asyncio.gather(*map(first, claimed)), strict=True):
            if isinstance(answer, Paused):
                paused[i] = answer
            else:
                answers[i] = answer
        order = sorted(paused)
        posted = await adrive(
            outcomes_plan(runner.client, [paused[i].effect for i in order]),
            runner.client._perform,
        )
    finally:
        for beat in beats:
            beat.cancel()
    replies = dict(zip(order, posted, strict=True))

    async def finish(i: int) -> Any:
        try:
            if i in paused:
                reply, error = replies[i]
                return await adrive(paused[i].plan, runner._perform, reply=reply, error=error)
            return await adrive(starts[i].plan, runner._perform)  # type: ignore[arg-type]
        except Exception as exc:
            return exc

    done = _ended_early(claimed, paused)
    rest = [i for i, start in enumerate(starts) if start.plan is not None and i not in done]
    for i, answer in zip(rest, await asyncio.gather(*map(finish, rest)), strict=True):
        answers[i] = answer
    return answers
