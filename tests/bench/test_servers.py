"""``python -m bench.servers`` with tiny sizes, as docs/benchmarks.md runs it: both servers
answered every request, the ledger holds every operation sent, succeeded, and every
figure is there and above zero (no threshold on speed: the figures are the bench's to
report, not the suite's to judge)."""

import json
import os
import subprocess
import sys

import pytest

from tests.bench.test_commands import ROOT, _database, _server_url
from tests.support.db import skip_unless_postgresql

pytestmark = [
    pytest.mark.slow,
    skip_unless_postgresql("bench.servers needs PostgreSQL (its CPU split reads the backends)"),
]


def test_both_servers_serve_every_lifecycle_and_batch_and_the_ledger_holds_them(tmp_path):
    figures = tmp_path / "servers.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.servers",
            "--lifecycles",
            "8",
            "--threads",
            "2",
            "--rounds",
            "1",
            "--database",
            _database("servers"),
            "--json",
            str(figures),
        ],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": _server_url()},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    report = json.loads(figures.read_text())
    assert report["ok"], report["failures"]
    assert report["failures"] == []
    assert report["order"] == ["gunicorn", "granian"]
    paths = report["paths"]
    assert set(paths) == {"single", "batch"}
    for path, effects in (("single", 8), ("batch", 2 * 20)):
        assert set(paths[path]) == {"gunicorn", "granian"}, path
        for server, row in paths[path].items():
            assert row["lifecycles"] == effects, (path, server)
            assert row["lifecycles_s"] > 0, (path, server)
            cpu = row["cpu_ms_per_lifecycle"]
            assert cpu["server"] > 0, (path, server)
            assert cpu["total"] > 0, (path, server)
            assert cpu["client"] >= 0, (path, server)
            assert cpu["postgres"] >= 0, (path, server)
            assert set(row["steps"]) == {"register_claim", "outcome"}, (path, server)
        ratio = report["granian_over_gunicorn"][path]
        assert ratio["throughput"] > 0, (path, ratio)
        assert ratio["server_cpu"] > 0, (path, ratio)
    assert paths["batch"]["granian"]["batch"] == 20
    # Per server: 2 threads x (10 warm-up lifecycles + 4 measured + 2 batches of 20).
    for server, check in report["checks"].items():
        assert check == {"expected": 108, "operations": 108, "succeeded": 108}, server
    for line in (
        "servers: the runner API under gunicorn (gthread) and granian (WSGI), 2 workers x 4"
        " threads, 2 client threads, 1 round (gunicorn, granian)",
        "  single lifecycle (register with inline claim -> outcome), per lifecycle, 8 per server",
        "  batch of 20 (one POST /operations array, one POST /runs/{run}/outcomes), per effect,"
        " 40 per server",
        "    granian / gunicorn: throughput ",
        "  the ledger: gunicorn 108 succeeded of 108 (108 sent), granian 108 succeeded of 108",
        f"written to {figures}",
    ):
        assert line in output, line
