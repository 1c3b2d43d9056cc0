"""Helpers for the client tests: a transport that loses answers, a recording sleep."""

import re
import threading
import time

import httpx


class LosingTransport(httpx.BaseTransport):
    """Passes each request to the live server, then loses the answer of the first
    ``count`` requests matching ``METHOD path-regex``: the server did the work, the
    client sees a broken connection, as when a proxy or the network drops a response.
    ``delay`` holds back the first answer matching a pattern for some seconds."""

    def __init__(
        self, lose: dict[str, int] | None = None, delay: dict[str, float] | None = None
    ) -> None:
        self.inner = httpx.HTTPTransport()
        self.lose = [(re.compile(pattern), count) for pattern, count in (lose or {}).items()]
        # Answers held back once for this long (a slow network, a paused process).
        self.delay = [(re.compile(pattern), seconds) for pattern, seconds in (delay or {}).items()]
        self.lost: list[str] = []
        self.sent: list[str] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        line = f"{request.method} {request.url.path}"
        response = self.inner.handle_request(request)
        response.read()
        with self._lock:
            self.sent.append(line)
            held = 0.0
            for index, (pattern, seconds) in enumerate(self.delay):
                if seconds and pattern.fullmatch(line):
                    self.delay[index] = (pattern, 0.0)
                    held = seconds
        if held:
            time.sleep(held)
        with self._lock:
            for index, (pattern, count) in enumerate(self.lose):
                if count and pattern.fullmatch(line):
                    self.lose[index] = (pattern, count - 1)
                    self.lost.append(line)
                    response.close()
                    raise httpx.ReadError("the answer was lost", request=request)
        return response

    def close(self) -> None:
        self.inner.close()


class RecordingSleep:
    """A real sleep that remembers how long each wait was."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        time.sleep(seconds)
