"""Protocol logic written once for the synchronous and the asynchronous client.

The client's repeats and the runner's protocol are generators ("plans") that never do
I/O themselves: they yield an effect (send this request, wait this long, call the tool)
and are sent its result, or have its exception thrown in at the ``yield``. ``drive``
performs the effects with blocking calls, ``adrive`` with awaited ones, so
``EffectgateClient`` and ``AsyncEffectgateClient``, ``Runner`` and ``AsyncRunner``
decide exactly alike: there is one copy of every rule, and two ways to wait.

Only an ``Exception`` is thrown into a plan. A ``BaseException`` that is not one
(``KeyboardInterrupt``, ``SystemExit``, ``asyncio.CancelledError``) propagates and
closes the plan, so nothing after it runs: no outcome is posted for a tool call it
interrupted (runner.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

T = TypeVar("T")

# A plan yields effects, is sent their results and returns its answer.
Plan = Generator[Any, Any, T]


@dataclass(frozen=True)
class Paused:
    """What ``drive_until`` ends with when the plan yielded an effect it stops at: the
    plan waits at that ``yield``; ``drive(paused.plan, ..., reply=...)`` (or
    ``error=``) goes on with that effect's result (``Runner.execute_many`` posts the
    outcomes of several plans in one request this way)."""

    plan: Plan[Any]
    effect: Any


def drive_until(
    plan: Plan[T],
    perform: Callable[[Any], Any],
    until: Callable[[Any], bool] | None = None,
    *,
    reply: Any = None,
    error: Exception | None = None,
) -> T | Paused:
    """Run ``plan``, performing each effect with ``perform``, to its answer or to the
    first effect ``until`` picks (``Paused``; the plan is then left open). ``reply`` or
    ``error`` resume a paused plan with the result of the effect it stopped at."""
    paused = False
    try:
        while True:
            try:
                effect = plan.send(reply) if error is None else plan.throw(error)
            except StopIteration as done:
                return done.value
            if until is not None and until(effect):
                paused = True
                return Paused(plan, effect)
            reply, error = None, None
            try:
                reply = perform(effect)
            except Exception as exc:
                error = exc
    finally:
        if not paused:
            plan.close()


async def adrive_until(
    plan: Plan[T],
    perform: Callable[[Any], Awaitable[Any]],
    until: Callable[[Any], bool] | None = None,
    *,
    reply: Any = None,
    error: Exception | None = None,
) -> T | Paused:
    """``drive_until`` with effects that are awaited."""
    paused = False
    try:
        while True:
            try:
                effect = plan.send(reply) if error is None else plan.throw(error)
            except StopIteration as done:
                return done.value
            if until is not None and until(effect):
                paused = True
                return Paused(plan, effect)
            reply, error = None, None
            try:
                reply = await perform(effect)
            except Exception as exc:
                error = exc
    finally:
        if not paused:
            plan.close()


def drive(
    plan: Plan[T],
    perform: Callable[[Any], Any],
    *,
    reply: Any = None,
    error: Exception | None = None,
) -> T:
    """Run ``plan`` to its answer, performing each effect with ``perform``."""
    return cast(T, drive_until(plan, perform, reply=reply, error=error))


async def adrive(
    plan: Plan[T],
    perform: Callable[[Any], Awaitable[Any]],
    *,
    reply: Any = None,
    error: Exception | None = None,
) -> T:
    """``drive`` with effects that are awaited."""
    return cast(T, await adrive_until(plan, perform, reply=reply, error=error))


async def resolved(value: Any) -> Any:
    """``value``, awaited if it is awaitable: a tool function of ``AsyncRunner`` may be
    a coroutine function or a plain one."""
    if inspect.isawaitable(value):
        return await value
    return value
