"""How a runner waits for an operation to leave a state (approval, reconciliation).

A waiter answers one question: "tell me when operation X is no longer in state S, or
when the deadline passes". ``PollingWaiter`` asks the API with capped exponential
backoff. ``NotifiedWaiter`` sleeps until something calls ``notify(operation_id)``
(typically the runner's webhook receiver, once it has checked the signature of an
``operation.*`` or ``approval.decided`` event) and falls back to slow polling, so a lost
webhook delays the runner but never strands it. Both re-read the operation from the
API after waking up: a notification says "look now", never what the new state is.

``AsyncPollingWaiter`` and ``AsyncNotifiedWaiter`` are the same waiters for
``AsyncRunner``: the loops are written once (plans, see ``_plan``), only the sleeping
differs. ``AsyncNotifiedWaiter.notify`` may be called from the event loop or from any
other thread (a webhook receiver served by a threaded server).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ._plan import Plan, adrive, drive
from .answers import Operation

if TYPE_CHECKING:
    from .client import AsyncEffectgateClient, EffectgateClient


class Waiter(Protocol):
    def wait(
        self, client: EffectgateClient, operation: Operation, *, status: str, deadline: float
    ) -> Operation:
        """The operation once its status is not ``status``, or as it is at ``deadline``
        (a ``time.monotonic()`` value)."""
        ...


class AsyncWaiter(Protocol):
    async def wait(
        self,
        client: AsyncEffectgateClient,
        operation: Operation,
        *,
        status: str,
        deadline: float,
    ) -> Operation:
        """``Waiter.wait``, awaited."""
        ...


@dataclass(frozen=True)
class _Read:
    """Effect: ``client.get_operation(operation_id)``."""

    operation_id: str


@dataclass(frozen=True)
class _Nap:
    """Effect: the waiter's sleep between two polls."""

    seconds: float


@dataclass(frozen=True)
class _Doze:
    """Effect: sleep until ``operation_id``'s version is no longer ``seen``, or
    ``timeout`` seconds."""

    operation_id: str
    seen: int
    timeout: float


class _Polling:
    def __init__(
        self, *, initial_s: float, max_s: float, factor: float, clock: Callable[[], float]
    ) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.factor = factor
        self.clock = clock
        self.polls = 0

    def _plan(self, operation: Operation, status: str, deadline: float) -> Plan[Operation]:
        ceiling = self.initial_s
        while True:
            operation = yield _Read(operation["id"])
            self.polls += 1
            remaining = deadline - self.clock()
            if operation["status"] != status or remaining <= 0:
                return operation
            # Full jitter spreads the polls of many runners waiting on one approver.
            delay = random.uniform(ceiling / 2, ceiling)  # noqa: S311
            yield _Nap(min(delay, remaining))
            ceiling = min(self.max_s, ceiling * self.factor)


class PollingWaiter(_Polling):
    """Poll ``GET /operations/{id}`` with capped exponential backoff and full jitter."""

    def __init__(
        self,
        *,
        initial_s: float = 0.5,
        max_s: float = 15.0,
        factor: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(initial_s=initial_s, max_s=max_s, factor=factor, clock=clock)
        self.sleep = sleep

    def wait(
        self, client: EffectgateClient, operation: Operation, *, status: str, deadline: float
    ) -> Operation:
        def perform(effect: Any) -> Any:
            if isinstance(effect, _Nap):
                return self.sleep(effect.seconds)
            return client.get_operation(effect.operation_id)

        return drive(self._plan(operation, status, deadline), perform)


class AsyncPollingWaiter(_Polling):
    """``PollingWaiter`` for ``AsyncRunner``."""

    def __init__(
        self,
        *,
        initial_s: float = 0.5,
        max_s: float = 15.0,
        factor: float = 2.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(initial_s=initial_s, max_s=max_s, factor=factor, clock=clock)
        self.sleep = sleep

    async def wait(
        self,
        client: AsyncEffectgateClient,
        operation: Operation,
        *,
        status: str,
        deadline: float,
    ) -> Operation:
        async def perform(effect: Any) -> Any:
            if isinstance(effect, _Nap):
                return await self.sleep(effect.seconds)
            return await client.get_operation(effect.operation_id)

        return await adrive(self._plan(operation, status, deadline), perform)


class _Notified:
    def __init__(self, *, fallback_poll_s: float, clock: Callable[[], float]) -> None:
        self.fallback_poll_s = fallback_poll_s
        self.clock = clock
        self._lock = threading.Lock()
        self._versions: dict[str, int] = {}

    def _version(self, operation_id: str) -> int:
        with self._lock:
            return self._versions.get(operation_id, 0)

    def _bump(self, operation_id: str) -> None:
        with self._lock:
            self._versions[operation_id] = self._versions.get(operation_id, 0) + 1

    def _plan(self, operation: Operation, status: str, deadline: float) -> Plan[Operation]:
        op_id = operation["id"]
        while True:
            # A notification that arrives while the GET is in flight counts: the version
            # moves, so the doze ends at once and the operation is read again.
            seen = self._version(op_id)
            operation = yield _Read(op_id)
            remaining = deadline - self.clock()
            if operation["status"] != status or remaining <= 0:
                return operation
            yield _Doze(op_id, seen, min(self.fallback_poll_s, remaining))


class NotifiedWaiter(_Notified):
    """Wait for ``notify(operation_id)``; poll every ``fallback_poll_s`` regardless."""

    def __init__(
        self, *, fallback_poll_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(fallback_poll_s=fallback_poll_s, clock=clock)
        self._condition = threading.Condition()

    def notify(self, operation_id: str) -> None:
        """Something about ``operation_id`` changed: wake whoever waits for it."""
        self._bump(operation_id)
        with self._condition:
            self._condition.notify_all()

    def wait(
        self, client: EffectgateClient, operation: Operation, *, status: str, deadline: float
    ) -> Operation:
        def perform(effect: Any) -> Any:
            if isinstance(effect, _Doze):
                with self._condition:
                    return self._condition.wait_for(
                        lambda: self._version(effect.operation_id) != effect.seen,
                        timeout=effect.timeout,
                    )
            return client.get_operation(effect.operation_id)

        return drive(self._plan(operation, status, deadline), perform)


class AsyncNotifiedWaiter(_Notified):
    """``NotifiedWaiter`` for ``AsyncRunner``; ``notify`` is safe from any thread."""

    def __init__(
        self, *, fallback_poll_s: float = 30.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(fallback_poll_s=fallback_poll_s, clock=clock)
        self._sleepers: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def notify(self, operation_id: str) -> None:
        """Something about ``operation_id`` changed: wake whoever waits for it."""
        self._bump(operation_id)
        with self._lock:
            sleepers = list(self._sleepers)
        for loop, event in sleepers:
            with contextlib.suppress(RuntimeError):  # that loop has closed
                loop.call_soon_threadsafe(event.set)

    async def _doze(self, effect: _Doze) -> None:
        sleeper = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._sleepers.add(sleeper)
        event = sleeper[1]
        try:
            async with asyncio.timeout(effect.timeout):
                # The version is read after registering and after each clear, on the
                # loop: a notification in between sets the event again, never lost.
                while True:
                    event.clear()
                    if self._version(effect.operation_id) != effect.seen:
                        return
                    await event.wait()
        except TimeoutError:
            return
        finally:
            with self._lock:
                self._sleepers.discard(sleeper)

    async def wait(
        self,
        client: AsyncEffectgateClient,
        operation: Operation,
        *,
        status: str,
        deadline: float,
    ) -> Operation:
        async def perform(effect: Any) -> Any:
            if isinstance(effect, _Doze):
                return await self._doze(effect)
            return await client.get_operation(effect.operation_id)

        return await adrive(self._plan(operation, status, deadline), perform)
