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
from typing import Any, TypeVar

T = TypeVar("T")

# A plan yields effects, is sent their results and returns its answer.
Plan = Generator[Any, Any, T]


def drive(plan: Plan[T], perform: Callable[[Any], Any]) -> T:
    """Run ``plan`` to its answer, performing each effect with ``perform``."""
    reply: Any = None
    error: Exception | None = None
    try:
        while True:
            try:
                effect = plan.send(reply) if error is None else plan.throw(error)
            except StopIteration as done:
                return done.value
            reply, error = None, None
            try:
                reply = perform(effect)
            except Exception as exc:
                error = exc
    finally:
        plan.close()


async def adrive(plan: Plan[T], perform: Callable[[Any], Awaitable[Any]]) -> T:
    """``drive`` with effects that are awaited."""
    reply: Any = None
    error: Exception | None = None
    try:
        while True:
            try:
                effect = plan.send(reply) if error is None else plan.throw(error)
            except StopIteration as done:
                return done.value
            reply, error = None, None
            try:
                reply = await perform(effect)
            except Exception as exc:
                error = exc
    finally:
        plan.close()


async def resolved(value: Any) -> Any:
    """``value``, awaited if it is awaitable: a tool function of ``AsyncRunner`` may be
    a coroutine function or a plain one."""
    if inspect.isawaitable(value):
        return await value
    return value
