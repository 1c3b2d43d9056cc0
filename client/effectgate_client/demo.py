"""A stand-in payment provider for trying Effectgate out (docs/client.md, Quick start).

``DemoProvider()`` serves on a free loopback port what the quick start's refund tool
calls, from memory, until it is closed:

- ``POST /refunds`` with ``{"payment_id": str, "amount_cents": int}`` and an
  ``Idempotency-Key`` header commits one refund per key and answers
  ``{"id": "re_0000001", "status": "succeeded", "payment_id": ...}``; a repeat with the
  same key answers the same refund and commits nothing, as a provider that honours
  idempotency keys does. A body it cannot read is 400, a missing key 428.
- ``GET /refunds/lookup/{key}`` answers in the shape Effectgate's lookups read (api.md,
  Lookup URLs): ``committed`` with the refund's id, or ``not_found``.

It is for demos and examples: no authentication, no persistence, loopback by default.
``python -m effectgate_client.demo [--port PORT]`` serves it until interrupted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

# A refund request is a few dozen bytes; anything much larger is not one.
MAX_BODY_BYTES = 16 * 1024
LOOKUP_PREFIX = "/refunds/lookup/"


class DemoProvider:
    """The provider, serving on its own thread from the moment it is made."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.refunds: dict[str, dict[str, Any]] = {}  # by idempotency key
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._httpd.daemon_threads = True
        bound, self.port = self._httpd.server_address[:2]
        # An AF_INET server's address is (str, int); bytes only name AF_UNIX sockets.
        self.host = bound if isinstance(bound, str) else bytes(bound).decode()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="effectgate-demo-provider", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def lookup_template(self) -> str:
        """The contract's ``reconcile.url`` for this provider."""
        return f"{self.url}{LOOKUP_PREFIX}{{idempotency_key}}"

    def refund(self, *, key: str, payment_id: str, amount_cents: int) -> dict[str, Any]:
        """Commit the refund of this key unless it is committed already; either way,
        answer it."""
        with self._lock:
            if key not in self.refunds:
                self.refunds[key] = {
                    "id": f"re_{next(self._ids):07d}",
                    "status": "succeeded",
                    "payment_id": payment_id,
                    "amount_cents": amount_cents,
                }
            return self.refunds[key]

    def lookup(self, key: str) -> dict[str, Any]:
        with self._lock:
            refund = self.refunds.get(key)
        if refund is None:
            return {"result": "not_found", "evidence": {"provider": "demo"}}
        return {"result": "committed", "downstream_id": refund["id"], "evidence": refund}

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> DemoProvider:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _refund_request(raw: bytes) -> tuple[str, int] | None:
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    payment_id, amount = body.get("payment_id"), body.get("amount_cents")
    if not isinstance(payment_id, str) or not payment_id:
        return None
    if not isinstance(amount, int) or isinstance(amount, bool) or amount < 1:
        return None
    return payment_id, amount


def _handler(provider: DemoProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # an example's output is the example's, not the provider's

        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                self.close_connection = True
                self._answer(413, {"error": f"bodies are at most {MAX_BODY_BYTES} bytes"})
                return
            raw = self.rfile.read(length)
            if self.path != "/refunds":
                self._answer(404, {"error": "POST /refunds is the only endpoint"})
                return
            request = _refund_request(raw)
            if request is None:
                self._answer(400, {"error": 'send {"payment_id": str, "amount_cents": int >= 1}'})
                return
            key = self.headers.get("Idempotency-Key", "").strip()
            if not key:
                self._answer(428, {"error": "send an Idempotency-Key header"})
                return
            payment_id, amount = request
            self._answer(200, provider.refund(key=key, payment_id=payment_id, amount_cents=amount))

        def do_GET(self) -> None:
            if not self.path.startswith(LOOKUP_PREFIX):
                self._answer(404, {"error": "GET /refunds/lookup/{key} is the only endpoint"})
                return
            self._answer(200, provider.lookup(unquote(self.path[len(LOOKUP_PREFIX) :])))

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m effectgate_client.demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    options = parser.parse_args(argv)
    provider = DemoProvider(options.host, options.port)
    print(f"Demo payment provider on {provider.url} (lookups: {provider.lookup_template})")
    print("Press Ctrl-C to stop it.", flush=True)
    try:
        provider._thread.join()
    except KeyboardInterrupt:
        provider.close()


if __name__ == "__main__":
    main()
