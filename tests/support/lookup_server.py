"""A real HTTP server on loopback that answers reconciliation lookups as told."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LookupServer:
    """``answers[key]`` is (status, body bytes, delay seconds) for path ``/lookup/<key>``."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, bytes, float]] = {}
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                key = self.path.rsplit("/", 1)[-1]
                status, body, delay = server.answers.get(key, (404, b"{}", 0))
                if delay:
                    time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        # shutdown() waits until serve_forever notices, which it checks every
        # poll_interval (half a second by default): that would be each test's teardown.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def answer(self, key: str, document, status: int = 200, delay: float = 0) -> None:
        body = document if isinstance(document, bytes) else json.dumps(document).encode()
        self.answers[key] = (status, body, delay)

    @property
    def url_template(self) -> str:
        return f"http://127.0.0.1:{self.port}/lookup/{{idempotency_key}}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
