"""Fixtures for the MCP gateway tests (``mcp_*``): a ledger of committed refunds, a
runner account on the live Effectgate, gateway configuration files, free ports and a
supervised streamable-HTTP upstream that is restarted when it dies."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import make_runner
from tests.support.net import free_port, wait_for_port

UPSTREAM = Path(__file__).with_name("mcp_upstream.py")
ROOT = Path(__file__).resolve().parents[2]
# The console script installed beside the interpreter running the tests.
GATEWAY = Path(sys.executable).with_name("effectgate-mcp")
# The gateway's upstream timeout in these tests, and how long the upstream sleeps after
# committing for ``timeout_after_commit``: longer than that and than the direct
# client's patience (1 s).
GATEWAY_UPSTREAM_TIMEOUT_S = 2
UPSTREAM_SLEEP_S = 6


class Ledger:
    """The refunds the upstream really committed, one JSON line each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def lines(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def per_payment(self) -> Counter:
        return Counter(line["payment_id"] for line in self.lines())

    @property
    def effects(self) -> int:
        return len(self.lines())

    @property
    def duplicates(self) -> int:
        """Effects beyond the first per intended refund (one payment id per intent)."""
        return sum(count - 1 for count in self.per_payment().values())

    def upstream_env(self) -> dict[str, str]:
        return {
            "MCP_UPSTREAM_LEDGER": str(self.path),
            "MCP_UPSTREAM_SLEEP_S": str(UPSTREAM_SLEEP_S),
        }


@pytest.fixture
def mcp_ledger(tmp_path):
    return Ledger(tmp_path / "ledger.jsonl")


@dataclass
class EffectgateAccount:
    url: str
    token: str
    runner: object


@pytest.fixture
def mcp_effectgate(live_server):
    """A runner account on the live Effectgate, for the gateway's token."""
    api = make_runner()
    return EffectgateAccount(url=live_server.url, token=api.token, runner=api.runner)


def _toml(value) -> str:
    """A TOML value from a Python one (enough for these configurations)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


REFUND_BLOCK = {
    "effect_class": "irreversible",
    "approval": {"mode": "rules", "rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}]},
    "reconcile": {"mode": "manual"},
}


def write_config(
    path: Path,
    *,
    url: str,
    upstreams: list[dict],
    **effectgate,
) -> Path:
    """Write a gateway configuration; each upstream dict may hold ``tools``."""
    effectgate = {"url": url, "principal": "user:alice", **effectgate}
    effectgate = {key: value for key, value in effectgate.items() if value is not None}
    lines = ["[effectgate]"]
    lines += [f"{key} = {_toml(value)}" for key, value in effectgate.items()]
    for upstream in upstreams:
        upstream = dict(upstream)
        tools = upstream.pop("tools", {})
        lines += ["", "[[upstream]]"]
        lines += [f"{key} = {_toml(value)}" for key, value in upstream.items()]
        for name, block in tools.items():
            lines += ["", f"[upstream.tools.{name}]"]
            lines += [f"{key} = {_toml(value)}" for key, value in block.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def mcp_config(tmp_path, mcp_effectgate, mcp_ledger):
    """Write a configuration for the live Effectgate and a stdio payments upstream:
    ``mcp_config(approval_wait_s=20, ...)``; ``upstreams=`` replaces the upstream list."""
    counter = iter(range(1, 1000))

    def make(*, upstreams: list[dict] | None = None, tools: dict | None = None, **effectgate):
        effectgate.setdefault("approval_wait_s", 0)
        effectgate.setdefault("upstream_timeout_s", GATEWAY_UPSTREAM_TIMEOUT_S)
        if upstreams is None:
            upstreams = [
                {
                    "name": "payments",
                    "command": [sys.executable, str(UPSTREAM)],
                    "env": mcp_ledger.upstream_env(),
                    "tools": tools if tools is not None else {"send_refund": REFUND_BLOCK},
                }
            ]
        return write_config(
            tmp_path / f"gateway-{next(counter)}.toml",
            url=mcp_effectgate.url,
            upstreams=upstreams,
            **effectgate,
        )

    return make


@pytest.fixture
def mcp_free_port():
    return free_port


class SupervisedUpstream:
    """The payments upstream over streamable HTTP, restarted whenever it dies (as a
    process supervisor would): ``url`` stays the same across crashes."""

    def __init__(self, ledger: Ledger, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.ledger = ledger
        self.log = log
        self.starts = 0
        self._process: subprocess.Popen | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._supervise, daemon=True)

    def _supervise(self) -> None:
        import os

        env = {**os.environ, **self.ledger.upstream_env()}
        with self.log.open("ab") as log:
            while not self._stopping.is_set():
                self._process = subprocess.Popen(
                    [sys.executable, str(UPSTREAM), "--http", str(self.port)],
                    env=env,
                    stdout=log,
                    stderr=log,
                )
                self.starts += 1
                self._process.wait()

    def start(self) -> SupervisedUpstream:
        self._thread.start()
        wait_for_port(self.port)
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
        self._thread.join(timeout=10)


@pytest.fixture
def mcp_http_upstream(mcp_ledger, tmp_path):
    upstream = SupervisedUpstream(mcp_ledger, tmp_path / "http-upstream.log").start()
    yield upstream
    upstream.stop()
