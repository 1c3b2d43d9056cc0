"""A fake payment provider: a real HTTP server on loopback that records every refund.

``POST /refunds`` with ``{"payment_id", "amount_cents"}`` and an optional
``Idempotency-Key`` header commits a refund (an *effect*) and answers
``{"id": "re_...", "status": "succeeded"}``, unless the fault schedule says otherwise
for this request (see ``bench.faults``):

- ``timeout_after_commit``: commits, then answers only after the client's timeout;
- ``unavailable``: answers 503 and commits nothing;
- ``refused``: closes the connection without answering and commits nothing;
- ``slow``: commits and answers after ``slow_s``, within the client's timeout;
- ``runner_crash``: commits and answers normally with ``X-Fault: runner_crash``: the
  runner harness kills the runner that sent the request, right after sending.

With ``honour_keys`` a repeat with a committed key returns the first answer and commits
nothing (a "deduplicated" provider); without it every request that commits is another
refund, as with a provider that ignores idempotency keys (irreversible effects).

``GET /refunds/lookup/{key}`` answers in the shape Effectgate's reconciliation probes
read (``operations/dispatch/probes.py``): ``committed`` with the refund id, ``not_found``, or
``still_unknown`` while a request with that key is being processed.

The provider's own records (``effects``) are the ground truth of every chaos run.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from .faults import (
    NONE,
    REFUSED,
    RUNNER_CRASH,
    SLOW,
    TIMEOUT_AFTER_COMMIT,
    UNAVAILABLE,
    FaultSchedule,
)


@dataclass(frozen=True)
class Effect:
    id: str
    ref: str
    idempotency_key: str | None
    amount_cents: int
    request_number: int
    at: float


@dataclass
class ProviderLog:
    requests: Counter[str] = field(default_factory=Counter)  # per payment_id
    faults: Counter[str] = field(default_factory=Counter)  # per fault injected
    lookups: Counter[str] = field(default_factory=Counter)  # per payment_id looked up
    lookup_answers: Counter[str] = field(default_factory=Counter)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # Many runners connect at once; the default backlog of 5 would drop SYNs and turn
    # into one-second connect delays that have nothing to do with the faults.
    request_queue_size = 512

    def handle_error(self, request, client_address) -> None:
        # Clients that gave up (timeouts) close their end; that is the point here.
        pass


class FakeProvider:
    def __init__(
        self,
        schedule: FaultSchedule | None = None,
        *,
        honour_keys: bool = False,
        client_timeout_s: float = 1.0,
        slow_s: float = 0.5,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.schedule = schedule
        self.honour_keys = honour_keys
        self.client_timeout_s = client_timeout_s
        self.slow_s = slow_s
        self.effects: list[Effect] = []
        self.log = ProviderLog()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._by_key: dict[str, Effect] = {}
        self._ref_by_key: dict[str, str] = {}
        self._requests_by_key: Counter[str] = Counter()
        self._in_flight: Counter[str] = Counter()
        self._httpd = _Server((host, port), self._handler_class())
        self.host, self.port = self._httpd.server_address[:2]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-provider",
            daemon=True,
        )
        self._thread.start()

    # --- what the harness reads -----------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def lookup_template(self) -> str:
        return f"{self.url}/refunds/lookup/{{idempotency_key}}"

    def effects_by_ref(self) -> Counter[str]:
        with self._lock:
            return Counter(effect.ref for effect in self.effects)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FakeProvider:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- behaviour ------------------------------------------------------------------------

    def _refund(self, body: dict[str, Any], key: str | None) -> tuple[str, Effect | None, int]:
        """Decide the fault and commit when it commits: (fault, effect, HTTP status), the
        status 0 meaning "close the connection without an answer"."""
        ref = str(body.get("payment_id", ""))
        amount = int(body.get("amount_cents", 0))
        with self._lock:
            self.log.requests[ref] += 1
            number = self.log.requests[ref]
            fault = self.schedule.fault(ref, number) if self.schedule else NONE
            self.log.faults[fault] += 1
            if key:
                self._ref_by_key[key] = ref
                self._requests_by_key[key] += 1
            if fault == REFUSED:
                return fault, None, 0
            if fault == UNAVAILABLE:
                return fault, None, 503
            if key and self.honour_keys:
                if key in self._by_key:
                    return fault, self._by_key[key], 200
                if self._in_flight[key] > 1:
                    return fault, None, 409
            effect = Effect(
                id=f"re_{next(self._ids):07d}",
                ref=ref,
                idempotency_key=key,
                amount_cents=amount,
                request_number=number,
                at=time.time(),
            )
            self.effects.append(effect)
            if key:
                self._by_key.setdefault(key, effect)
            return fault, effect, 200

    def _lookup(self, key: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            ref = self._ref_by_key.get(key)
            if ref is not None:
                self.log.lookups[ref] += 1
                if self.schedule and self.schedule.lookup_fails(ref, self.log.lookups[ref]):
                    self.log.lookup_answers["unavailable"] += 1
                    return 503, {"error": "lookup unavailable"}
            first = self._by_key.get(key)
            if first is not None:
                answer = {
                    "result": "committed",
                    "downstream_id": first.id,
                    "evidence": {
                        "refunds": [e.id for e in self.effects if e.idempotency_key == key],
                        "committed_at": first.at,
                        "payment_id": first.ref,
                    },
                }
            elif self._in_flight[key]:
                answer = {"result": "still_unknown", "evidence": {"in_flight": True}}
            else:
                answer = {
                    "result": "not_found",
                    "evidence": {"requests_seen_with_key": self._requests_by_key[key]},
                }
            self.log.lookup_answers[answer["result"]] += 1
            return 200, answer

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    self.close_connection = True  # the client is gone (it timed out)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.path != "/refunds":
                    self._send(404, {"error": "not found"}, {})
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._send(400, {"error": "not JSON"}, {})
                    return
                key = self.headers.get("Idempotency-Key")
                if key:
                    with provider._lock:
                        provider._in_flight[key] += 1
                try:
                    fault, effect, status = provider._refund(body, key)
                    if status == 0:
                        # No answer at all: the client cannot tell this from a provider
                        # that crashed after committing.
                        self.close_connection = True
                        with contextlib.suppress(OSError):
                            self.connection.shutdown(socket.SHUT_RDWR)
                        return
                finally:
                    if key:
                        with provider._lock:
                            provider._in_flight[key] -= 1
                if status == 503:
                    self._send(503, {"error": "unavailable", "processed": False}, {})
                    return
                if status == 409:
                    self._send(409, {"error": "a request with this key is in progress"}, {})
                    return
                headers = {}
                if fault == SLOW:
                    time.sleep(provider.slow_s)
                elif fault == TIMEOUT_AFTER_COMMIT:
                    time.sleep(provider.client_timeout_s + 0.5)
                elif fault == RUNNER_CRASH:
                    headers["X-Fault"] = RUNNER_CRASH
                assert effect is not None
                self._send(
                    200,
                    {"id": effect.id, "status": "succeeded", "payment_id": effect.ref},
                    headers,
                )

            def do_GET(self) -> None:
                prefix = "/refunds/lookup/"
                if not self.path.startswith(prefix):
                    self._send(404, {"error": "not found"}, {})
                    return
                status, body = provider._lookup(unquote(self.path[len(prefix) :]))
                self._send(status, body, {})

        return Handler
