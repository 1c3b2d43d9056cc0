"""A webhook receiver on loopback that records every request and answers as told."""

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    status: int = 204
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay: float = 0.0
    # Answer nobody until this many requests have arrived (at most HOLD_S seconds): for
    # tests that need requests in flight together, whatever the machine's load.
    hold_until: int = 0
    requests: list[Received] = field(default_factory=list)

    HOLD_S = 60.0

    def __post_init__(self) -> None:
        receiver = self
        arrived = threading.Condition()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with arrived:
                    receiver.requests.append(
                        Received({k.lower(): v for k, v in self.headers.items()}, body)
                    )
                    arrived.notify_all()
                    arrived.wait_for(
                        lambda: len(receiver.requests) >= receiver.hold_until, receiver.HOLD_S
                    )
                if receiver.delay:
                    time.sleep(receiver.delay)
                self.send_response(receiver.status)
                for name, value in receiver.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(receiver.body)))
                self.end_headers()
                self.wfile.write(receiver.body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        # shutdown() waits until serve_forever notices, which it checks every
        # poll_interval (half a second by default): that would be each test's teardown.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/hooks"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
