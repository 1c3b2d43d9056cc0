"""Helpers for the client tests: a transport that loses answers, a recording sleep, and
an event loop in its own thread for the asynchronous client."""

import asyncio
import re
import threading
import time
from asyncio import run_coroutine_threadsafe
from collections.abc import Coroutine
from typing import Any

import httpx


class LosingTransport(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Passes each request to the live server, then loses the answer of the first
    ``count`` requests matching ``METHOD path-regex``: the server did the work, the
    client sees a broken connection, as when a proxy or the network drops a response.
    ``delay`` holds back the first answer matching a pattern for some seconds.

    One transport serves both clients (``EffectgateClient`` and
    ``AsyncEffectgateClient``), with one record of what was sent and lost."""

    def __init__(
        self, lose: dict[str, int] | None = None, delay: dict[str, float] | None = None
    ) -> None:
        self.inner = httpx.HTTPTransport()
        self.inner_async = httpx.AsyncHTTPTransport()
        self.lose = [(re.compile(pattern), count) for pattern, count in (lose or {}).items()]
        # Answers held back once for this long (a slow network, a paused process).
        self.delay = [(re.compile(pattern), seconds) for pattern, seconds in (delay or {}).items()]
        self.lost: list[str] = []
        self.sent: list[str] = []
        self._lock = threading.Lock()

    def _held(self, line: str) -> float:
        with self._lock:
            self.sent.append(line)
            for index, (pattern, seconds) in enumerate(self.delay):
                if seconds and pattern.fullmatch(line):
                    self.delay[index] = (pattern, 0.0)
                    return seconds
        return 0.0

    def _loses(self, line: str) -> bool:
        with self._lock:
            for index, (pattern, count) in enumerate(self.lose):
                if count and pattern.fullmatch(line):
                    self.lose[index] = (pattern, count - 1)
                    self.lost.append(line)
                    return True
        return False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        line = f"{request.method} {request.url.path}"
        response = self.inner.handle_request(request)
        response.read()
        held = self._held(line)
        if held:
            time.sleep(held)
        if self._loses(line):
            response.close()
            raise httpx.ReadError("the answer was lost", request=request)
        return response

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        line = f"{request.method} {request.url.path}"
        response = await self.inner_async.handle_async_request(request)
        await response.aread()
        held = self._held(line)
        if held:
            await asyncio.sleep(held)
        if self._loses(line):
            await response.aclose()
            raise httpx.ReadError("the answer was lost", request=request)
        return response

    def close(self) -> None:
        self.inner.close()

    async def aclose(self) -> None:
        await self.inner_async.aclose()


class RecordingSleep:
    """A real sleep that remembers how long each wait was; awaitable as
    ``await sleep.wait(seconds)`` for the asynchronous runner."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        time.sleep(seconds)

    async def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        await asyncio.sleep(seconds)


class LoopThread:
    """An event loop running in a thread of its own, for tests that drive the
    asynchronous client from synchronous test code (the database checks stay in the
    test's thread, where Django allows them)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self.thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, Any]):
        """The coroutine scheduled on the loop, as a ``concurrent.futures.Future``
        (imported by name: a test may make ``asyncio.run_coroutine_threadsafe`` fail
        for the code it checks)."""
        return run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout: float = 120) -> Any:
        return self.submit(coroutine).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
