"""@effectgate/client (clients/typescript) against this checkout's server.

Its node tests (clients/typescript/test/*.test.ts, node's test runner with tsx) run
against a live Effectgate with a runner token of their own and the fake payment
provider; what needs a person (approvals) or the server's own code (webhook signatures)
is done from here, in Python, while node waits. The generated types, the package's
version and its registry of problem codes are held to what the server serves.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from django.db import connections
from django.test import Client
from guardian.shortcuts import assign_perm

from approvals.errors import Refusal
from bench.fake_provider import FakeProvider
from operations import payloads, services, signing
from operations.models import Operation, Tool
from tests.approvals.conftest import person
from tests.client_ts.support import PACKAGE, installed, package_json, run
from tests.conftest import contract, make_runner

# The codes the API's exception handler answers besides the refusals' own
# (operations/http/problems.py: DRF's exceptions, Http404, a body too large, a crash).
HANDLER_CODES = {
    "not_authenticated",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "unsupported_media_type",
    "not_acceptable",
    "malformed_json",
    "invalid_request",
    "payload_too_large",
    "rate_limited",
    "internal_error",
}


def server_problem_codes() -> set[str]:
    """Every problem code the API can answer: the server's own list once it has one
    (``problem_codes``), else every refusal class's code and the handler's."""
    from operations.http import problems

    listed = getattr(problems, "problem_codes", None)
    if listed is not None:
        return set(listed())
    codes = set(HANDLER_CODES)
    pending = [Refusal]
    while pending:
        cls = pending.pop()
        codes.add(cls.code)
        pending.extend(cls.__subclasses__())
    return codes


def served_schema() -> dict:
    response = Client().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


def test_the_generated_types_are_those_of_the_served_document(tmp_path):
    """src/schema.d.ts is openapi-typescript's output for /api/schema/: regenerate it with
    `make ts-schema` when the API changes."""
    installed()
    document = tmp_path / "openapi.json"
    document.write_text(json.dumps(served_schema()))
    generated = tmp_path / "schema.d.ts"
    done = run(["npm", "run", "--silent", "schema", "--", str(document), "-o", str(generated)])
    assert done.returncode == 0
    committed = (PACKAGE / "src" / "schema.d.ts").read_text("utf-8").splitlines()
    fresh = generated.read_text("utf-8").splitlines()
    drift = list(difflib.unified_diff(committed, fresh, "committed", "served", lineterm=""))
    assert not drift, (
        "clients/typescript/src/schema.d.ts has drifted from /api/schema/ (run make ts-schema):\n"
        + "\n".join(drift[:60])
    )


def test_the_package_version_follows_the_api_version():
    package = package_json()
    assert package["name"] == "@effectgate/client"
    assert package["version"].split(".")[0] == served_schema()["info"]["version"] == "1"
    # The User-Agent it sends names the same version.
    client_ts = (PACKAGE / "src" / "client.ts").read_text("utf-8")
    assert f'"effectgate-client-typescript/{package["version"]}"' in client_ts


def test_the_client_has_a_typed_error_for_every_code_the_server_answers():
    installed()
    done = run(
        [
            "node",
            "--import",
            "tsx",
            "--input-type=module",
            "-e",
            'import { ProblemError } from "./src/index.js";'
            "console.log(JSON.stringify(Object.fromEntries("
            "Object.entries(ProblemError.registry).map(([c, k]) => [c, [k.name, k.code]]))));",
        ]
    )
    assert done.returncode == 0
    registry = json.loads(done.stdout)
    assert set(registry) == server_problem_codes()
    for code, (name, class_code) in registry.items():
        assert class_code == code
        assert name == "".join(part.title() for part in code.split("_")).replace("Json", "JSON")


def test_the_package_compiles_strict():
    installed()
    assert run(["npm", "run", "--silent", "typecheck"]).returncode == 0


@pytest.fixture
def provider():
    with FakeProvider(honour_keys=True) as fake:
        yield fake


def _node_tests(name: str, env: dict[str, str]) -> subprocess.Popen[str]:
    installed()
    return subprocess.Popen(
        ["node", "--import", "tsx", "--test", "--test-reporter=spec", f"test/{name}.test.ts"],
        cwd=PACKAGE,
        env={**_base_env(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _base_env() -> dict[str, str]:
    return {
        **{key: value for key, value in os.environ.items() if key != "OPENAI_API_KEY"},
        "NO_COLOR": "1",
    }


def _finish(process: subprocess.Popen[str], timeout: float = 240) -> None:
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    print(output[-12000:])
    # node's test runner exits non-zero when any test failed (or none ran).
    assert process.returncode == 0, output[-6000:]
    assert "tests 0" not in output, output[-3000:]


def _env(live_server, api, provider) -> dict[str, str]:
    return {
        "EFFECTGATE_URL": live_server.url,
        "EFFECTGATE_TOKEN": api.token,
        "PROVIDER_URL": provider.url,
    }


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_client(live_server, provider):
    api = make_runner()
    other = make_runner()
    answer = other.client.put("/api/v1/tools/ts_someone_elses", contract(), format="json")
    assert answer.status_code == 201, answer.content
    env = {**_env(live_server, api, provider), "EFFECTGATE_OTHER_TOOL": "ts_someone_elses"}
    _finish(_node_tests("client", env))


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runner(live_server, provider):
    api = make_runner()
    _finish(_node_tests("runner", _env(live_server, api, provider)))
    # The provider's own records: one refund per idempotency key, none twice.
    keys = Counter(effect.idempotency_key for effect in provider.effects)
    assert keys
    assert max(keys.values()) == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_demo_provider(live_server):
    """@effectgate/client/demo, the quick start's stand-in provider: its protocol, and a
    Runner's refund through it that a replay answers without calling again."""
    api = make_runner()
    env = {"EFFECTGATE_URL": live_server.url, "EFFECTGATE_TOKEN": api.token}
    _finish(_node_tests("demo", env))
    [op] = Operation.objects.filter(runner=api.runner, tool__name__startswith="ts_demo_refund")
    assert (op.status, op.downstream_id) == ("succeeded", "re_0000001")
    assert [attempt.status for attempt in op.attempt_set.all()] == ["succeeded"]


@pytest.mark.slow
@pytest.mark.django_db
def test_webhooks():
    secret = signing.new_secret()
    body = json.dumps(
        {
            "type": "approval.decided",
            "timestamp": payloads.iso(datetime.now(UTC)),
            "data": {"operation": {"id": "op_vector", "status": "ready"}},
        },
        separators=(",", ":"),
        sort_keys=True,
    )
    now = int(time.time())

    def signed(stamp: int) -> dict[str, str]:
        return {
            "content-type": "application/json",
            "webhook-id": "msg_vector",
            "webhook-timestamp": str(stamp),
            "webhook-signature": signing.sign(secret, "msg_vector", stamp, body.encode()),
        }

    # Besides a fresh delivery, the same one properly signed an hour ago and an hour
    # ahead: refused for its timestamp alone.
    vector = json.dumps(
        {
            "secret": secret,
            "headers": signed(now),
            "old": signed(now - 3600),
            "future": signed(now + 3600),
            "body": body,
        }
    )
    _finish(_node_tests("webhooks", {"EFFECTGATE_WEBHOOK_VECTOR": vector}))


class Approver:
    """Decides, from Python, each operation of the runner that waits for a person, by its
    tool's name (test/approval.test.ts says which name means what)."""

    def __init__(self, runner, secret: str, handoff: Path) -> None:
        self.runner = runner
        self.secret = secret
        self.handoff = handoff
        self.user = person()
        self.decided: set[str] = set()
        self.deliveries: list[int] = []
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._loop, name="approver", daemon=True)

    def __enter__(self) -> Approver:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.errors, self.errors

    def _loop(self) -> None:
        try:
            while not self.stop.wait(0.05):
                waiting = Operation.objects.filter(
                    runner=self.runner, status="awaiting_approval"
                ).exclude(id__in=self.decided)
                for op in waiting:
                    if op.tool_id.startswith("ts_pending"):
                        continue
                    if op.tool_id.startswith("ts_hook") and not self.handoff.exists():
                        # Not before the runner's waiter read it waiting: the webhook
                        # must be what wakes it (test/approval.test.ts).
                        continue
                    self._decide(op)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            connections.close_all()

    def _decide(self, op: Operation) -> None:
        assign_perm("operations.decide_tool", self.user, Tool.objects.get(pk=op.tool_id))
        request = op.approval_requests.get(status="pending")
        kind = op.tool_id.split("_")[1]
        edits = {"/amount_cents": op.arguments["amount_cents"] // 2} if kind == "edit" else None
        comment = "duplicate refund" if kind == "reject" else "ok"
        services.approval_decide(
            request_id=request.id,
            user=self.user,
            approve=kind != "reject",
            comment=comment,
            edits=edits,
        )
        self.decided.add(op.id)
        if kind == "hook":
            self._deliver(op)

    def _deliver(self, op: Operation) -> None:
        """The approval.decided delivery, signed by the server's code: a tampered copy
        first (refused, it must wake nobody), then the real one."""
        url = json.loads(self.handoff.read_text())["url"]
        op.refresh_from_db()
        body = json.dumps(
            {
                "type": "approval.decided",
                "timestamp": payloads.iso(datetime.now(UTC)),
                "data": {"operation": payloads.operation(op)},
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        stamp = int(time.time())
        headers = {
            "content-type": "application/json",
            "webhook-id": f"msg_{op.id}",
            "webhook-timestamp": str(stamp),
            "webhook-signature": signing.sign(self.secret, f"msg_{op.id}", stamp, body),
        }
        tampered = body.replace(b'"ready"', b'"rejected"')
        self.deliveries.append(httpx.post(url, content=tampered, headers=headers).status_code)
        self.deliveries.append(httpx.post(url, content=body, headers=headers).status_code)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_approval(live_server, provider, tmp_path):
    api = make_runner()
    secret = signing.new_secret()
    handoff = tmp_path / "receiver.json"
    env = {
        **_env(live_server, api, provider),
        "EFFECTGATE_WEBHOOK_SECRET": secret,
        "EFFECTGATE_HANDOFF": str(handoff),
    }
    with Approver(api.runner, secret, handoff) as approver:
        _finish(_node_tests("approval", env))
    assert approver.deliveries == [400, 204]
    tools = {Operation.objects.get(id=op_id).tool_id.split("_")[1] for op_id in approver.decided}
    assert tools == {"approve", "reject", "edit", "hook"}
