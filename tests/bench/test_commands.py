"""The documented benchmark commands, run as the README runs them: ``make bench``,
``make chaos`` and ``make bench-review`` with small sizes, each in its own process on a
database of its own, checked by their exit status, the figures they print and write and,
for the console's, what the database holds afterwards.

A command the docs name must not break unnoticed (``make bench`` did: its seed of
approval requests missed a column added later). Each takes well under a minute here.
"""

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import psycopg
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


@pytest.mark.browser
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
            "--policy-operations 2000 --policy-registrations 20 "
            "--review-requests 2 --review-unknowns 1 --seal-events 20000"
        ),
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    report = json.loads(figures.read_text())
    assert report["parts"] == [
        "contention",
        "hashing",
        "lifecycle",
        "policies",
        "review",
        "scale",
        "seal",
    ]

    life = report["lifecycle"]
    paths = life["paths"]
    single = {"essential", "replica", "unprepared", "dbos", "api"}
    batches = {"essential_x5", "dbos_x5", "api_x5", "essential_x20", "dbos_x20", "api_x20"}
    assert set(paths) == single | batches
    assert all(paths[name]["lifecycles"] == 40 for name in single)
    assert all(paths[name]["lifecycles"] > 0 for name in batches)
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
        "approval page": True,
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
    assert report["review"]["ok"]
    assert [task["done"] for task in report["review"]["tasks"].values()] == [2, 2, 1]

    # What it prints: every part's table, and no operation of the seed needing repair.
    for line in (
        "(a) lifecycle (register with inline claim -> outcome), 40 per path, 2 client threads",
        "(b) contention, 4 runners at once, 2 rounds each:",
        "violations 0",
        "(c) intent hash:",
        "(f) simulation over the last day (2,000 operations seeded",
        "(g) CPU per registration with an inline claim, 20 each:",
        "sequential scans of tables over 100,000 rows: none",
        "(h) a person's time in the console, one run:",
        "support, unknown outcomes (1 of 1 done)",
        "(i) the sealer, ",
        " ms per 10,000 events (",
        f"written to {figures}",
    ):
        assert line in output, line
    seal = report["seal"]
    assert seal["events"] >= 20000
    assert sum(p["events"] for p in seal["passes"]) == seal["events"]
    assert all(p["signed"] for p in seal["passes"])
    assert report["sealer_ms_per_10000_events"] > 0
    assert "the replica's statement count differs" not in output
    assert "event chain head on the row was" not in output


@skip_unless_postgresql("the lifecycle bench needs PostgreSQL (its raw-SQL paths are psycopg's)")
def test_make_bench_lifecycle_measures_dbos_and_batches_per_effect(tmp_path):
    """``--only lifecycle`` with tiny sizes: DBOS beside the essential anchor and the API,
    per effect single and in batches of 5 and 20, every figure there and above zero (no
    threshold: the figures are the bench's to report, not the suite's to judge)."""
    figures = tmp_path / "bench.json"
    database = _database("lifecycle")
    done = _make(
        "bench",
        env={**os.environ, "DATABASE_URL": _server_url()},
        BENCH_ARGS=(
            f"--only lifecycle --database {database} --json {figures} --lifecycles 8 "
            "--threads 2 --batch-sizes 5,20 --batch-effects 40 "
            "--parallel-threads 2 --parallel-rounds 1"
        ),
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    report = json.loads(figures.read_text())
    life = report["lifecycle"]
    paths = life["paths"]
    assert set(paths) == {
        "essential",
        "replica",
        "unprepared",
        "dbos",
        "api",
        "essential_x5",
        "dbos_x5",
        "api_x5",
        "essential_x20",
        "dbos_x20",
        "api_x20",
    }
    # Two threads, at least two batches each, half in each direction.
    assert paths["dbos"]["lifecycles"] == 8
    assert paths["dbos_x5"]["lifecycles"] == paths["essential_x5"]["lifecycles"] == 2 * 4 * 5
    assert paths["dbos_x20"]["lifecycles"] == paths["essential_x20"]["lifecycles"] == 2 * 2 * 20
    assert paths["api_x20"]["lifecycles"] == 2 * 2 * 20
    assert paths["dbos"]["in_process"]
    assert paths["dbos_x20"]["batch"] == 20
    # The essential batch: two transactions of four statements, whatever its size.
    assert paths["essential_x5"]["statements_per_batch_seen"] == {"8": 2 * 4}
    assert paths["essential_x20"]["statements_per_lifecycle"] == 0.4
    sizes = life["peer"]["sizes"]
    assert list(sizes) == ["single", "batch_5", "batch_20"]
    for label, row in sizes.items():
        for kind in ("essential", "dbos", "api"):
            effect = row[kind]
            assert effect["effects_s"] > 0, (label, kind)
            assert effect["statements_per_effect"] > 0, (label, kind)
            # /proc counts CPU in ticks of 10 ms: the anchor's few lifecycles here can
            # fall under one tick in every process (a real run's phases last seconds).
            assert effect["cpu_ms_per_effect"]["total"] >= 0, (label, kind)
            assert effect["cpu_ms_per_effect"]["postgres"] >= 0, (label, kind)
        assert row["api"]["cpu_ms_per_effect"]["total"] > 0, label
        assert row["dbos"]["cpu_ms_per_effect"]["app"] > 0, label
        assert row["dbos"]["cpu_ms_per_effect"]["client"] == 0, label  # in the app's
    assert sizes["single"]["api"]["effects_s"] > 0
    # A workflow and its step: each commits, so DBOS sends BEGIN and COMMIT pairs.
    dbos_trace = life["statements"]["dbos"]["workflow"]
    assert dbos_trace.count("BEGIN") == dbos_trace.count("COMMIT") > 0
    assert "INSERT operation_outputs RETURNING" in dbos_trace
    assert paths["dbos"]["statements_per_lifecycle"] >= len(dbos_trace) - 1
    assert life["dbos_idle_cpu_ms_per_s"] >= 0
    for key in ("api_over_dbos", "api_over_essential"):
        assert report[key]["single"] > 0
        # The API's batch endpoints: a ratio for each batch size.
        assert report[key]["batch_5"] > 0
        assert report[key]["batch_20"] > 0
    for line in (
        "(a) per effect, against the durable-execution peer (DBOS",
        "    1       dbos     ",
        "    20      essential",
        "    20      api     ",
        "throughput api / DBOS: single ",
        "throughput api / essential: single ",
        "what DBOS sends for one effect (its traced workflow):",
        "DBOS's background threads, idle: ",
        f"written to {figures}",
    ):
        assert line in output, line


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
    rows = {row["runner"]: row for row in json.loads(figures.read_text())}
    # The TypeScript phase runs by default where clients/typescript is installed, as
    # `make test` installs it.
    assert list(rows) == ["naive", "effectgate", "naive-ts", "effectgate-ts"]
    for row in rows.values():
        assert row["logical_operations"] == 100
        assert row["database"] == ("PostgreSQL" if ON_POSTGRESQL else "SQLite")
    for gated in (rows["effectgate"], rows["effectgate-ts"]):
        assert gated["duplicates"] == 0
        assert gated["lost"] == 0
        assert gated["settled"]
        assert gated["succeeded"] + gated["failed_no_effect"] + gated["in_reconciliation"] == 100
        # Throttling on, at its defaults: not one request of the workload was refused.
        assert "status:429" not in gated["api_repeats"], gated["api_repeats"]
        assert not any(answer.startswith("error:") for answer in gated["runner_answers"])
    for line in ("duplicates", "lost", "answers the client repeated", f"written to {figures}"):
        assert line in output, line


def _rows(url: str, query: str) -> list[tuple]:
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return sorted(conn.execute(query).fetchall())
    with psycopg.connect(url) as conn:
        return sorted(conn.execute(query).fetchall())


@pytest.mark.browser
def test_make_bench_review_approves_and_resolves_what_it_counts(tmp_path):
    """The reviewer's and support's flows in chromium, on the suite's database engine:
    every request ends approved by the reviewer, every unknown outcome succeeded with the
    reference support typed, and the figures add up."""
    figures = tmp_path / "review.json"
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    if ON_POSTGRESQL:
        env["DATABASE_URL"] = _server_url()
    database = _database("review")
    try:
        done = _make(
            "bench-review",
            env=env,
            REVIEW_ARGS=f"--requests 3 --unknowns 2 --database {database} --json {figures}",
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-5000:]
        review = json.loads(figures.read_text())
        url = (
            f"{_server_url().rsplit('/', 1)[0]}/{database}"
            if ON_POSTGRESQL
            else f"sqlite:///{ROOT / 'var' / 'bench' / database}.sqlite3"
        )
        decisions = _rows(
            url,
            "SELECT r.status, u.username, d.decision FROM approvals_approvalrequest r"
            " JOIN approvals_decision d ON d.request_id = r.id"
            " JOIN auth_user u ON u.id = d.user_id",
        )
        resolutions = _rows(
            url,
            "SELECT o.status, o.downstream_id, e.actor FROM operations_operation o"
            " JOIN operations_event e ON e.operation_id = o.id AND e.kind = 'reconciled'"
            " WHERE o.tool_id = 'bench_payout'",
        )
    finally:
        for leftover in (ROOT / "var" / "bench").glob(f"{database}.sqlite3*"):
            leftover.unlink()
    assert decisions == [("approved", "reviewer", "approve")] * 6
    assert resolutions == [
        ("succeeded", "po_00000001", "user:support"),
        ("succeeded", "po_00000002", "user:support"),
    ]

    assert review["ok"]
    tasks = review["tasks"]
    assert {name: (task["items"], task["done"]) for name, task in tasks.items()} == {
        "one_by_one": (3, 3),
        "bulk": (3, 3),
        "support": (2, 2),
    }
    # j Enter, then a Enter per request: the console's keys, whatever the page looks like.
    assert tasks["one_by_one"]["keystrokes"] == 2 + 2 * 3
    assert tasks["one_by_one"]["clicks"] == 0
    # j x per request, then at least Enter on Approve selected.
    assert tasks["bulk"]["keystrokes"] > 2 * 3
    # At least the references typed and Enter each.
    assert tasks["support"]["keystrokes"] > 2 * (len("po_00000001") + 1)
    for task in tasks.values():
        assert 0 < task["machine_s"] < task["person_s_estimate"]
    for line in (
        "reviewer, one by one (3 of 3 done)",
        "reviewer, in bulk (3 of 3 done)",
        "support, unknown outcomes (2 of 2 done)",
        f"written to {figures}",
    ):
        assert line in output, line
