"""The soak's short version in CI: three gunicorn processes, two Celery workers and two
beats on PostgreSQL and Redis, one of each SIGKILLed and restarted under the chaos
workload; no duplicate, no lost operation, each lease expiry and probe answer once,
every webhook message delivered (bench/soak.py; ``make soak`` for the long one).

It runs as its own process (``python -m bench.soak``), as ``make soak`` does: the soak
reads its own database with Django's ORM, which this test process keeps for the test
database."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.support.db import skip_unless_postgresql

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.slow,
    skip_unless_postgresql(
        "the soak's processes share PostgreSQL and Redis (the local mode is one "
        "process on SQLite); CI runs it on PostgreSQL",
    ),
]


def test_killed_processes_lose_nothing_and_duplicate_nothing(tmp_path, capsys):
    db = settings.DATABASES["default"]
    base = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/postgres"
    figures = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", "--n", "150", "--threads", "8", "--no-baseline",
         "--json", str(figures)],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": os.environ.get("DATABASE_URL") or base},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )  # fmt: skip
    assert figures.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    row = json.loads(figures.read_text())["soak"]
    with capsys.disabled():
        print(
            f"\nsoak: {row['processes']} processes, kills {row['kills']}, "
            f"{row['logical_operations']} operations, {row['duplicates']} duplicates, "
            f"{row['lost']} lost, {row['webhooks_delivered']} webhooks delivered "
            f"({row['webhook_redeliveries']} redelivered), {row['throughput_ops_s']} ops/s"
        )
    assert row["kills"] == {"web": 1, "worker": 1, "beat": 1}
    assert row["duplicates"] == 0
    assert row["lost"] == 0
    assert row["lease_expiries_twice"] == 0
    assert row["probe_answers_twice"] == 0
    assert row["webhooks_missing"] == row["webhooks_unknown"] == 0
    assert row["webhooks_undelivered"] == 0
    assert row["webhooks_delivered"] == row["webhook_messages"] > 0
    # Throttling counts every request in the broker's Redis, shared by the three web
    # processes; at its defaults it refuses none of the workload.
    assert "status:429" not in row["api_repeats"], row["api_repeats"]
    assert row["settled"]
    assert row["ok"]
    assert done.returncode == 0, done.stdout[-3000:]
