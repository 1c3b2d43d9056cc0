"""The MCP gateway's coalescing of concurrent calls (api.md, Batches).

A model turn that asks for several tools at once reaches the gateway as concurrent
``tools/call`` requests. ``CoalescingRunner`` is ``AsyncRunner`` with its registrations
and outcome posts gathered per run: the first one of a run waits ``window_s`` (2 ms by
default, ``batch_window_ms``) for others, then goes; those arriving while it is in flight
go together as soon as it is back. A batch of one goes as the single call; more as one
``register_many`` or ``post_outcomes``. Each call then gets its own item's answer, or
its typed refusal, at the point where its plan sent it, so every rule of ``execute``
(retries, unknown outcomes, ``OutcomeNotRecorded``) is unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .._effects import _PostOutcome, _Register
from .._plan import adrive
from .._wire import BATCH_MAX_ITEMS
from ..client import AsyncEffectgateClient
from ..runner import AsyncRunner

DEFAULT_WINDOW_S = 0.002


class _Coalescer:
    """One run's queue of one kind of request: at most one request in flight."""

    def __init__(
        self, send: Callable[[list[Any]], Awaitable[list[tuple[Any, Any]]]], window_s: float
    ):
        self.send = send
        self.window_s = window_s
        self.pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self.task: asyncio.Task[None] | None = None

    async def submit(self, effect: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append((effect, future))
        if self.task is None:
            self.task = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        batch: list[tuple[Any, asyncio.Future[Any]]] = []
        try:
            await asyncio.sleep(self.window_s)
            while self.pending:
                batch = self.pending[:BATCH_MAX_ITEMS]
                del self.pending[:BATCH_MAX_ITEMS]
                try:
                    answers = await self.send([effect for effect, _ in batch])
                except Exception as exc:
                    # The whole request failed: each call meets what its single one would.
                    answers = [(None, exc)] * len(batch)
                for (_, future), (reply, error) in zip(batch, answers, strict=True):
                    if future.done():
                        continue
                    if error is not None:
                        future.set_exception(error)
                    else:
                        future.set_result(reply)
                batch = []
        finally:
            self.task = None
            # Cancelled (the loop is closing): no call waits for an answer that will not
            # come; each is cancelled, as its own request would have been.
            for _, future in batch + self.pending:
                future.cancel()
            self.pending.clear()


class CoalescingRunner(AsyncRunner):
    """``AsyncRunner`` whose concurrent calls of one run share batch requests."""

    def __init__(
        self, client: AsyncEffectgateClient, *, window_s: float = DEFAULT_WINDOW_S, **options: Any
    ) -> None:
        super().__init__(client, **options)
        self.window_s = window_s
        self._queues: dict[tuple[str, str], _Coalescer] = {}

    def _queue(self, kind: str, run: str) -> _Coalescer:
        queue = self._queues.get((kind, run))
        if queue is None:
            send = self._registrations if kind == "register" else self._outcomes
            queue = self._queues[(kind, run)] = _Coalescer(
                lambda effects: send(run, effects), self.window_s
            )
        return queue

    async def _registrations(self, run: str, effects: list[_Register]) -> list[tuple[Any, Any]]:
        if len(effects) == 1:
            return [(await adrive(effects[0].plan(self.client), self.client._perform), None)]
        items = await self.client.register_many(run, [effect.batch_item() for effect in effects])
        return [(item.operation, item.error) for item in items]

    async def _outcomes(self, run: str, effects: list[_PostOutcome]) -> list[tuple[Any, Any]]:
        if len(effects) == 1:
            return [(await adrive(effects[0].plan(self.client), self.client._perform), None)]
        items = await self.client.post_outcomes(run, [effect.batch_item() for effect in effects])
        return [(item.operation, item.error) for item in items]

    async def _perform(self, effect: Any) -> Any:
        if isinstance(effect, _Register):
            return await self._queue("register", effect.fields["run"]).submit(effect)
        if isinstance(effect, _PostOutcome):
            return await self._queue("outcome", effect.run).submit(effect)
        return await super()._perform(effect)
