"""The MCP gateway's coalescing of concurrent calls (api.md, Batches).

A model turn that asks for several tools at once reaches the gateway as concurrent
``tools/call`` requests. ``CoalescingRunner`` is ``AsyncRunner`` with its registrations
and outcome posts gathered per run: the first one of a run waits ``window_s`` (2 ms by
default, ``batch_window_ms``) for others, then goes; those arriving while it is in flight
go together as soon as it is back. A batch of one goes as the single call; more as one
``register_many`` or ``post_outcomes`` (several when they are larger than the client's
``max_batch_bytes``; a call too large for a batch goes alone). A call whose request
could not be sent (an invalid one) is refused alone, before it joins a queue; a call
cancelled while queued is left out; a failed request fails only the calls it carried,
each with an exception of its own. An outcome waiting in its queue keeps its attempt's
heartbeat. Each call then gets its own item's answer, or
its typed refusal, at the point where its plan sent it, so every rule of ``execute``
(retries, unknown outcomes, ``OutcomeNotRecorded``) is unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .._effects import AttemptContext, _PostOutcome, _Register
from .._many import batch_plan
from .._plan import adrive
from .._wire import BATCH_MAX_ITEMS
from ..client import AsyncEffectgateClient
from ..errors import own_copy
from ..runner import AsyncRunner

DEFAULT_WINDOW_S = 0.002


class _Coalescer:
    """One run's queue of one kind of request: at most one request in flight."""

    def __init__(
        self,
        send: Callable[[list[Any]], Awaitable[list[tuple[Any, Any]]]],
        window_s: float,
        on_idle: Callable[[_Coalescer], None] = lambda queue: None,
    ):
        self.send = send
        self.window_s = window_s
        self.on_idle = on_idle
        self.pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self.task: asyncio.Task[None] | None = None

    async def submit(self, effect: Any) -> Any:
        # What its single call would refuse to send is this call's refusal, not its
        # batch's.
        effect.check()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append((effect, future))
        if self.task is None:
            self.task = asyncio.create_task(self._flush())
        return await future

    def _take(self) -> list[tuple[Any, asyncio.Future[Any]]]:
        """The next batch: the calls still waiting (one cancelled while queued is left
        out, as its own request would never have been sent)."""
        self.pending = [(effect, future) for effect, future in self.pending if not future.done()]
        batch = self.pending[:BATCH_MAX_ITEMS]
        del self.pending[:BATCH_MAX_ITEMS]
        return batch

    async def _flush(self) -> None:
        batch: list[tuple[Any, asyncio.Future[Any]]] = []
        try:
            await asyncio.sleep(self.window_s)
            while batch := self._take():
                try:
                    answers = await self.send([effect for effect, _ in batch])
                except Exception as exc:
                    # The whole request failed: each call meets what its single one
                    # would, with an exception of its own.
                    answers = [(None, own_copy(exc)) for _ in batch]
                for (_, future), (reply, error) in zip(batch, answers, strict=True):
                    if future.done():
                        continue
                    if error is not None:
                        future.set_exception(error)
                    else:
                        future.set_result(reply)
        finally:
            self.task = None
            # Cancelled (the loop is closing): no call waits for an answer that will not
            # come; each is cancelled, as its own request would have been.
            for _, future in batch + self.pending:
                future.cancel()
            self.pending.clear()
            self.on_idle(self)


class CoalescingRunner(AsyncRunner):
    """``AsyncRunner`` whose concurrent calls of one run share batch requests."""

    def __init__(
        self, client: AsyncEffectgateClient, *, window_s: float = DEFAULT_WINDOW_S, **options: Any
    ) -> None:
        super().__init__(client, **options)
        self.window_s = window_s
        # The queues with calls in them (a queue goes once it is empty).
        self._queues: dict[tuple[str, str], _Coalescer] = {}

    def _queue(self, kind: str, run: str) -> _Coalescer:
        key = (kind, run)
        queue = self._queues.get(key)
        if queue is None:

            def idle(done: _Coalescer) -> None:
                if self._queues.get(key) is done:
                    del self._queues[key]

            queue = self._queues[key] = _Coalescer(
                lambda effects: self._send(effects), self.window_s, idle
            )
        return queue

    async def _send(self, effects: list[Any]) -> list[tuple[Any, Any]]:
        return await adrive(batch_plan(self.client, effects), self.client._perform)

    async def _perform(self, effect: Any) -> Any:
        if isinstance(effect, _Register):
            return await self._queue("register", effect.fields["run"]).submit(effect)
        if isinstance(effect, _PostOutcome):
            # The attempt's lease is kept while its outcome waits for its batch.
            context = AttemptContext(effect.operation_id, effect.attempt, "", {}, "")
            heartbeat = asyncio.create_task(self._beat(context))
            try:
                return await self._queue("outcome", effect.run).submit(effect)
            finally:
                heartbeat.cancel()
        return await super()._perform(effect)
