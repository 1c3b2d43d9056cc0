"""Background work on real Celery workers and beat against Redis.

The worker and beat processes connect to the test database, so these tests commit
their data (transaction=True). Each test uses its own queue name so that concurrent
runs on one Redis do not take each other's tasks.
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings
from standardwebhooks.webhooks import Webhook

from operations.models import DeliveryAttempt, Operation, OutboxMessage
from tests.conftest import contract, make_runner
from tests.support.db import skip_unless_postgresql
from tests.support.receiver import Receiver
from tests.support.runtime_role import database_env

REPO = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


class Celery:
    """Starts worker and beat processes for one test and stops them all afterwards."""

    def __init__(self, tmp_path: Path, **extra_env: str) -> None:
        self.tmp_path = tmp_path
        self.queue = f"eg-test-{uuid.uuid4().hex[:12]}"
        self.env = {
            **os.environ,
            **database_env(),
            "SECRET_KEY": settings.SECRET_KEY,
            "CELERY_BROKER_URL": REDIS_URL,
            "CELERY_TASK_DEFAULT_QUEUE": self.queue,
            "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
            "DB_CONN_MAX_AGE": "0",
            **extra_env,
        }
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.tmp_path / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "console", *args, "--loglevel=INFO"],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes[name] = process
        return process

    def worker(self, name: str) -> subprocess.Popen:
        return self.start(
            name,
            "worker",
            "-Q",
            self.queue,
            "-n",
            f"{name}-{self.queue}@%h",
            "--concurrency=2",
            "--without-gossip",
            "--without-mingle",
        )

    def beat(self, name: str) -> subprocess.Popen:
        return self.start(name, "beat", "-s", str(self.tmp_path / f"{name}-schedule"))

    def kill(self, name: str) -> None:
        process = self.processes.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text()[-3000:]}" for path in self.tmp_path.glob("*.log")
        )

    def stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def celery(tmp_path) -> Iterator[Callable[..., Celery]]:
    started: list[Celery] = []

    def make(**env: str) -> Celery:
        instance = Celery(tmp_path, **env)
        started.append(instance)
        return instance

    yield make
    for instance in started:
        instance.stop()


@pytest.fixture
def receiver(settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    server = Receiver()
    yield server
    server.close()


def wait_for(check: Callable[[], bool], timeout: float, explain: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s\n{explain()}")


def test_two_workers_and_two_beats_do_the_work_nobody_asks_for(celery, receiver):
    api = make_runner()
    endpoint = api.post(
        "/api/v1/webhook-endpoints", {"url": receiver.url, "events": ["operation.*"]}
    ).json()
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    api.tool("gated", contract("irreversible", approval={"mode": "always", "request_ttl_s": 1}))
    leased = api.register(api.run(), "refund", claim={"lease_s": 1})
    gated = api.register(api.run(), "gated")

    workers = celery()
    for name in ("worker-a", "worker-b"):
        workers.worker(name)
    for name in ("beat-a", "beat-b"):
        workers.beat(name)

    def settled() -> bool:
        statuses = dict(Operation.objects.values_list("pk", "status"))
        return (
            statuses[leased["id"]] == "outcome_unknown"
            and statuses[gated["id"]] == "rejected"
            and OutboxMessage.objects.filter(status="pending").count() == 0
        )

    wait_for(settled, 60, workers.logs)
    gated_op = Operation.objects.get(pk=gated["id"])
    assert gated_op.error_code == "approval_expired"
    # Two beats (one leading, one waiting) and two workers: still one transition each.
    assert leased_events(leased["id"]) == 1
    messages = OutboxMessage.objects.order_by("created_at")
    assert [m.status for m in messages] == ["delivered"] * messages.count()
    ids = [request.headers["webhook-id"] for request in receiver.requests]
    assert sorted(ids) == sorted(m.id for m in messages)  # each delivered exactly once
    verifier = Webhook(endpoint["secret"])
    types = {verifier.verify(r.body, r.headers)["type"] for r in receiver.requests}
    assert {"operation.executing", "operation.outcome_unknown", "operation.rejected"} <= types


@skip_unless_postgresql(
    "the beat lock is a PostgreSQL advisory lock (the local mode has no beat)",
)
def test_only_one_beat_sends_and_the_other_takes_over_when_it_dies(celery, tmp_path):
    workers = celery()
    workers.beat("beat-a")

    def log(name: str) -> str:
        path = tmp_path / f"{name}.log"
        return path.read_text() if path.exists() else ""

    wait_for(lambda: "Sending due task" in log("beat-a"), 30, workers.logs)
    assert "holds the beat lock" in log("beat-a")
    workers.beat("beat-b")
    wait_for(lambda: "waiting to take over" in log("beat-b"), 30, workers.logs)
    time.sleep(3)
    assert "Sending due task" not in log("beat-b")  # a standby sends nothing
    workers.kill("beat-a")
    wait_for(lambda: "Sending due task" in log("beat-b"), 30, workers.logs)
    assert "holds the beat lock" in log("beat-b")


def leased_events(op_id: str) -> int:
    from operations.models import Event

    return Event.objects.filter(stream=op_id, kind="lease_expired").count()


def test_a_worker_killed_mid_delivery_delivers_again_and_the_receiver_applies_once(
    celery, receiver
):
    api = make_runner()
    secret = api.post(
        "/api/v1/webhook-endpoints", {"url": receiver.url, "events": ["operation.ready"]}
    ).json()["secret"]
    api.tool("t")
    op = api.register(api.run(), "t")
    receiver.delay = 30  # the first delivery hangs until its worker is killed

    workers = celery(WEBHOOK_DELIVERY_LEASE_S="3", WEBHOOK_TIMEOUT_S="60")
    workers.worker("doomed")
    workers.beat("beat")
    wait_for(lambda: len(receiver.requests) == 1, 30, workers.logs)
    workers.kill("doomed")
    receiver.delay = 0
    workers.worker("survivor")

    message = OutboxMessage.objects.get(operation_id=op["id"])
    wait_for(
        lambda: OutboxMessage.objects.get(pk=message.pk).status == "delivered",
        60,
        workers.logs,
    )
    assert len(receiver.requests) == 2
    applied: dict[str, dict] = {}
    for request in receiver.requests:
        payload = Webhook(secret).verify(request.body, request.headers)
        applied.setdefault(request.headers["webhook-id"], payload)  # dedupe by webhook-id
    assert list(applied) == [message.id]
    attempts = list(DeliveryAttempt.objects.filter(message=message).order_by("number"))
    assert len(attempts) == 2
    assert attempts[0].finished_at is None  # the killed attempt is still on record
    assert attempts[1].status_code == 204
