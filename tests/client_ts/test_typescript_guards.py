"""The framework guards of ``@effectgate/client`` (the AI SDK, the OpenAI Agents SDK, the
MCP TypeScript SDK) against a live Effectgate: each node test file runs with node's test
runner and the framework's own mock or scripted model (no network, no model), while this
side plays the person who decides on approvals.

A node test asks for a decision by writing ``<approval id>.json`` into the folder named
by ``EFFECTGATE_DECISIONS`` (``{"approve": bool, "comment": str, "edits": {pointer:
value} | null}``); the decider thread
here makes it with ``operations.services.approval_decide`` as a person allowed to decide
on the tool, then writes ``<approval id>.done`` (or ``.error`` with the reason)."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest
from django.db import connections
from guardian.shortcuts import assign_perm

from approvals.models import ApprovalRequest
from operations import services
from tests.approvals.conftest import person
from tests.client_ts.support import installed, run
from tests.conftest import make_runner

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

NODE_TIMEOUT_S = 240


class Decider(threading.Thread):
    """Decides what the node tests ask, as one approver, until stopped."""

    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder = folder
        self.stopping = threading.Event()
        self.decided: list[tuple[str, bool]] = []

    def run(self) -> None:
        try:
            approver = person(username="ts-approver")
            while not self.stopping.wait(0.05):
                for request in sorted(self.folder.glob("*.json")):
                    self._decide(approver, request)
        finally:
            connections.close_all()

    def _decide(self, approver, request: Path) -> None:
        asked = json.loads(request.read_text())
        approval_id = asked["approval"]
        request.unlink()
        try:
            pending = ApprovalRequest.objects.select_related("operation").get(pk=approval_id)
            assign_perm("operations.decide_tool", approver, pending.operation.tool)
            services.approval_decide(
                request_id=approval_id,
                user=approver,
                approve=bool(asked["approve"]),
                comment=str(asked["comment"]),
                edits=asked.get("edits") or None,
            )
        except Exception as exc:  # reported to the node test, which fails with it
            (self.folder / f"{approval_id}.error").write_text(f"{type(exc).__name__}: {exc}")
            return
        self.decided.append((approval_id, bool(asked["approve"])))
        (self.folder / f"{approval_id}.done").write_text("ok")


def _node_test(
    live_server, tmp_path: Path, name: str
) -> tuple[subprocess.CompletedProcess[str], Decider]:
    installed()
    api = make_runner()
    decisions = tmp_path / "decisions"
    decisions.mkdir()
    decider = Decider(decisions)
    decider.start()
    env = {
        "EFFECTGATE_URL": live_server.url,
        "EFFECTGATE_TOKEN": api.token,
        "EFFECTGATE_DECISIONS": str(decisions),
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
    }
    try:
        done = run(
            ["node", "--import", "tsx", "--test", "--test-reporter=tap", f"test/{name}"],
            env=env,
            timeout=NODE_TIMEOUT_S,
        )
    finally:
        decider.stopping.set()
        decider.join(timeout=10)
    return done, decider


def _passed(done: subprocess.CompletedProcess[str], tests: int) -> str:
    """Every test of the file ran and passed (none skipped, none missing)."""
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    for line in (f"# tests {tests}", f"# pass {tests}", "# fail 0", "# skipped 0", "# todo 0"):
        assert f"\n{line}\n" in output, output[-6000:]
    return output


def test_ai_sdk_guard(live_server, tmp_path):
    done, decider = _node_test(live_server, tmp_path, "guard-ai-sdk.test.ts")
    output = _passed(done, tests=6)
    # Three approvals (one with changes) and a rejection, made here while node waited.
    decided = sorted(approve for _, approve in decider.decided)
    assert decided == [False, True, True, True], output[-3000:]


def test_openai_agents_guard(live_server, tmp_path):
    done, decider = _node_test(live_server, tmp_path, "guard-openai-agents.test.ts")
    output = _passed(done, tests=7)
    assert sorted(approve for _, approve in decider.decided) == [False, True], output[-3000:]


def test_mcp_guard(live_server, tmp_path):
    done, decider = _node_test(live_server, tmp_path, "guard-mcp.test.ts")
    output = _passed(done, tests=4)
    assert sorted(approve for _, approve in decider.decided) == [False, True], output[-3000:]
