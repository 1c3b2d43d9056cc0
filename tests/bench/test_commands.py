"""The documented benchmark commands, run as the README runs them: ``make bench`` and
``make chaos`` with small sizes, each in its own process on a database of its own,
checked by their exit status and the figures they print and write.

A command the docs name must not break unnoticed (``make bench`` did: its seed of
approval requests missed a column added later). Each takes well under a minute here.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from django.conf import settings

from tests.support.db import ON_POSTGRESQL, skip_unless_postgresql

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _server_url() -> str:
    """The PostgreSQL server the suite runs on (the commands make their own database)."""
    db = settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/postgres"


def _make(target: str, *, env: dict[str, str], **variables: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", target, *(f"{k}={v}" for k, v in variables.items())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def _database(kind: str) -> str:
    """A database name of this suite's own: beside the suite's on PostgreSQL (dropped and
    made again by each run), a SQLite file of this process's under var/bench/."""
    name = Path(settings.DATABASES["default"]["NAME"]).stem
    suffix = "" if ON_POSTGRESQL else f"_{os.getpid()}"
    return f"{name}_test_{kind}{suffix}"[:60]


@skip_unless_postgresql("make bench needs PostgreSQL (its raw-SQL paths are psycopg's)")
def test_make_bench_runs_every_part_and_prints_its_figures(tmp_path):
    figures = tmp_path / "bench.json"
    done = _make(
        "bench",
        env={**os.environ, "DATABASE_URL": _server_url()},
        SIZES="2000",
        BENCH_ARGS=(
            f"--database {_database('bench')} --json {figures} --lifecycles 40 --threads 2 "
            "--parallel-threads 4 --parallel-rounds 2 --hot-threads 4 --hot-rounds 2 "
            "--policy-operations 2000 --policy-registrations 20"
        ),
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    report = json.loads(figures.read_text())
    assert report["parts"] == ["contention", "hashing", "lifecycle", "policies", "scale"]

    life = report["lifecycle"]
    paths = life["paths"]
    assert set(paths) == {"essential", "replica", "unprepared", "api"}
    assert all(paths[name]["lifecycles"] == 40 for name in paths)
    assert paths["essential"]["statements_per_lifecycle"] == 12
    # The replica replays what the API sends, the throttle's count included.
    assert life["replica_matches_api"], life["usual_statements"]
    assert report["lifecycle_api_vs_essential"] > 0
    assert report["contention"]["violations"] == 0
    assert report["contention"]["answers"]["claimed"] == 2 * 2 + 2  # 2 hot ops + 1 key, x2
    (scale,) = report["scale"]
    assert scale["operations"] == 2000
    assert {row["name"]: row["queries"] > 0 for row in scale["measures"]} == {
        "inbox /": True,
        "reconciliation /reconciliation/": True,
        "dashboard /dashboard/": True,
        "sweep, 50 leases due": True,
        "sweep, nothing due": True,
        "probe_due, 50 lookups due": True,
        "probe_due, nothing due": True,
    }
    assert all(row["seq_scans"] == [] for row in scale["measures"])
    simulated = report["policies"]["simulation"]
    # Every operation of the last day: the seed and those of the parts before.
    assert simulated["policy"]["operations"] >= 2000
    assert simulated["policy"]["changes"]["newly_asking"] > 0
    assert simulated["contract"]["operations"] == 1000
    assert simulated["contract"]["changes"]["no_longer_asking"] > 0
    assert report["policies"]["cpu_ms_per_registration"]["100_policies"] > 0

    # What it prints: every part's table, and no operation of the seed needing repair.
    for line in (
        "(a) lifecycle (register with inline claim -> outcome), 40 per path, 2 client threads",
        "(b) contention, 4 runners at once, 2 rounds each:",
        "violations 0",
        "(c) intent hash:",
        "(f) simulation over the last day (2,000 operations seeded",
        "(g) CPU per registration with an inline claim, 20 each:",
        "sequential scans of tables over 100,000 rows: none",
        f"written to {figures}",
    ):
        assert line in output, line
    assert "the replica's statement count differs" not in output
    assert "event chain head on the row was" not in output


def test_make_chaos_loses_and_duplicates_nothing_and_is_never_throttled(tmp_path):
    """On PostgreSQL when the suite is (a database of its own), else SQLite: 100 refunds
    under the seeded faults, with request throttling at its defaults."""
    figures = tmp_path / "chaos.json"
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("THROTTLE_") and key != "DATABASE_URL"
    }
    if ON_POSTGRESQL:
        env["DATABASE_URL"] = _server_url()
    database = _database("chaos")
    try:
        done = _make(
            "chaos", env=env, N="100", CHAOS_ARGS=f"--database {database} --json {figures}"
        )
    finally:
        for leftover in (ROOT / "var" / "bench").glob(f"{database}.sqlite3*"):
            leftover.unlink()
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    naive, gated = json.loads(figures.read_text())
    assert naive["logical_operations"] == gated["logical_operations"] == 100
    assert gated["database"] == ("PostgreSQL" if ON_POSTGRESQL else "SQLite")
    assert gated["duplicates"] == 0
    assert gated["lost"] == 0
    assert gated["settled"]
    assert gated["succeeded"] + gated["failed_no_effect"] + gated["in_reconciliation"] == 100
    # Throttling on, at its defaults: not one request of the workload was refused.
    assert "status:429" not in gated["api_repeats"], gated["api_repeats"]
    assert not any(answer.startswith("error:") for answer in gated["runner_answers"])
    for line in ("duplicates", "lost", "answers the client repeated", f"written to {figures}"):
        assert line in output, line
