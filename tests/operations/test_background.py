"""Dispatchers shared by many workers, local in-process background work, approver email."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
import time_machine
from django.core import mail
from django.db import connection
from django.utils import timezone
from guardian.shortcuts import assign_perm

from console.background import LocalScheduler
from operations import services
from operations.dispatch import webhooks
from operations.models import Event, Operation, OutboxMessage, Tool
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner
from tests.support.receiver import Receiver

WORKERS = 4


def _concurrently(function, **kwargs):
    barrier = threading.Barrier(WORKERS)

    def run(_):
        barrier.wait()
        try:
            return function(**kwargs)
        finally:
            connection.close()

    with ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(run, range(WORKERS)))


@pytest.mark.django_db(transaction=True)
def test_concurrent_sweeps_make_each_transition_once():
    api = make_runner()
    api.tool("t", contract("irreversible", approval={"mode": "never"}))
    run = api.run()
    ids = [api.register(run, "t", claim={"lease_s": 1})["id"] for _ in range(30)]
    later = timezone.now() + timedelta(seconds=5)
    with time_machine.travel(later, tick=False):
        handled = _concurrently(services.lease_expire_due)
    assert sum(handled) == 30
    for op_id in ids:
        assert Event.objects.filter(stream=op_id, kind="lease_expired").count() == 1
    assert set(Operation.objects.values_list("status", flat=True)) == {"outcome_unknown"}


@pytest.mark.django_db(transaction=True)
def test_concurrent_dispatchers_deliver_each_message_once(settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    receiver = Receiver()
    try:
        api = make_runner()
        api.post("/api/v1/webhook-endpoints", {"url": receiver.url, "events": ["operation.*"]})
        api.tool("t")
        run = api.run()
        for _ in range(25):
            api.register(run, "t")
        reports = _concurrently(webhooks.deliver_due)
    finally:
        receiver.close()
    assert sum(report.sent for report in reports) == 25
    ids = [request.headers["webhook-id"] for request in receiver.requests]
    assert len(ids) == len(set(ids)) == 25
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"delivered"}


@pytest.mark.django_db(transaction=True)
def test_local_mode_runs_the_schedule_in_process():
    api = make_runner()
    api.tool("t", contract("irreversible", approval={"mode": "never"}))
    op = api.register(api.run(), "t", claim={"lease_s": 1})
    scheduler = LocalScheduler(
        {"leases": {"task": "operations.tasks.expire_leases", "schedule": 0.2}}, tick=0.1
    )
    scheduler.start()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if Operation.objects.get(pk=op["id"]).status == "outcome_unknown":
                break
            time.sleep(0.2)
    finally:
        scheduler.stop()
        scheduler.join(timeout=5)
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"


def test_approvers_are_emailed_with_a_link(api, settings):
    settings.CONSOLE_BASE_URL = "https://effectgate.example.com"
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    approver = person(email="ann@example.com")
    assign_perm("operations.decide_tool", approver, Tool.objects.get(pk="refund"))
    principal = person(username="alice", email="alice@example.com")
    assign_perm("operations.decide_tool", principal, Tool.objects.get(pk="refund"))
    person(email="nobody@example.com")  # no permission: not told
    with pytest.MonkeyPatch.context() as patch:
        # Test transactions never commit, so run on_commit callbacks at once.
        patch.setattr("django.db.transaction.on_commit", lambda fn, **kw: fn())
        op = api.register(api.run(principal="user:alice"), "refund")
    [message] = mail.outbox
    assert message.to == ["ann@example.com"]  # the principal is barred from deciding
    assert f"https://effectgate.example.com/approvals/{op['approval']['id']}/" in message.body
    assert "refund" in message.subject


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runlocal_serves_and_does_the_background_work_in_process(tmp_path):
    """What `make run` starts: the development server with the beat schedule on a
    thread, no broker. A lease expires with nobody calling."""
    import os
    import socket
    import subprocess
    import sys
    from pathlib import Path

    import httpx
    from django.conf import settings

    from tests.support.runtime_role import database_env

    api = make_runner()
    api.tool("t", contract("irreversible", approval={"mode": "never"}))
    op = api.register(api.run(), "t", claim={"lease_s": 1})
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "runlocal.log"
    env = {
        **os.environ,
        **database_env(),
        "SECRET_KEY": settings.SECRET_KEY,
        "CELERY_BROKER_URL": "",
        "DEBUG": "1",
        "EFFECTGATE_VAR_DIR": str(tmp_path),
        "DB_CONN_MAX_AGE": "0",
    }
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runlocal", f"127.0.0.1:{port}"],
            cwd=Path(__file__).resolve().parents[2],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        # A bound, not a speed target: the server process starts Django, then its beat
        # thread sweeps every few seconds; a loaded 2-core machine can take many seconds.
        deadline = time.monotonic() + 90
        status = None
        while time.monotonic() < deadline:
            status = Operation.objects.get(pk=op["id"]).status
            if status == "outcome_unknown":
                break
            time.sleep(0.3)
        assert status == "outcome_unknown", log.read_text()[-3000:]
        answer = httpx.get(f"http://127.0.0.1:{port}/login/", timeout=10)
        assert answer.status_code == 200
    finally:
        server.terminate()
        server.wait(timeout=15)
    output = log.read_text()
    assert "Background work runs in-process" in output
    assert "Traceback" not in output, output[-3000:]
