"""``python -m bench.profile`` in its modes, with tiny sizes, as docs/benchmarks.md runs
it: single lifecycles and batches (``--batch``), with and without cProfile. Each prints
its statements and CPU per lifecycle or per effect, above zero (no threshold: the figures
are the bench's to report), and a batch of lean items sends a fixed number of statements
whatever its size, so per effect they fall as the batch grows."""

import os
import re
import subprocess
import sys

import pytest

from tests.bench.test_commands import ROOT, _database, _server_url
from tests.support.db import skip_unless_postgresql

pytestmark = [
    pytest.mark.slow,
    skip_unless_postgresql("bench.profile needs PostgreSQL"),
]


def _profile(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "bench.profile", "--database", _database("profile"), *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": _server_url()},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    return output


def _figure(output: str, pattern: str) -> float:
    match = re.search(pattern, output)
    assert match, output[-3000:]
    return float(match[1])


@pytest.mark.parametrize("batch", [1, 5, 20])
def test_the_profile_prints_statements_and_cpu_per_lifecycle_or_effect(batch):
    per = "lifecycle" if batch == 1 else "effect"
    output = _profile("--batch", str(batch), "--lifecycles", str(4 * batch), "--no-profile")
    statements = _figure(output, rf"statements per {per} \(ORM-visible[^)]*\): ([\d.]+)")
    cpu = _figure(output, rf"app CPU per {per} \(in process, no profiler\): ([\d.]+) ms")
    assert statements > 0
    assert cpu > 0
    if batch == 1:
        assert statements == 16  # the lean path's 14, and the throttle's 2 (database cache)
    else:
        # The same statements for the whole batch, however many items it holds.
        assert statements * batch == _STATEMENTS_PER_BATCH_PAIR


# A registration batch and an outcome batch of lean items (tests/operations/
# test_batches.py counts them per request), the throttle's count among them (one per
# request on the database cache).
_STATEMENTS_PER_BATCH_PAIR = 19


def test_under_cprofile_it_prints_the_functions_with_the_most_time(tmp_path):
    saved = tmp_path / "after.pstats"
    output = _profile("--batch", "5", "--lifecycles", "10", "--save", str(saved), "--top", "5")
    assert _figure(output, r"app CPU per effect under cProfile: ([\d.]+) ms") > 0
    assert "Ordered by: cumulative time" in output
    assert "Ordered by: internal time" in output
    assert saved.stat().st_size > 0
