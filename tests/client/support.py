"""Helpers for the client tests: a transport that loses answers, a recording sleep."""

import re
import threading
import time

import httpx


class LosingTransport(httpx.BaseTransport):
    """Passes each request to the live server, then loses the answer of the first
    ``count`` requests matching ``METHOD path-regex``: the server did the work, the
    client sees a broken connection, as when a proxy or the network drops a response."""

    def __init__(self, lose: dict[str, int] | None = None) -> None:
        self.inner = httpx.HTTPTransport()
        self.lose = [(re.compile(pattern), count) for pattern, count in (lose or {}).items()]
        self.lost: list[str] = []
        self.sent: list[str] = []
        self._lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        line = f"{request.method} {request.url.path}"
        response = self.inner.handle_request(request)
        response.read()
        with self._lock:
            self.sent.append(line)
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
