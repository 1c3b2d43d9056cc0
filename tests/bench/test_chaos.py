"""A small chaos run in CI: the same seeded faults for a naive runner and for the
Effectgate client; Effectgate must show no duplicate and no lost operation.

Effectgate is the live test server; the time-driven work (lease expiry, reconciliation
probes) runs on two threads beside it, as ``manage.py sweep --loop`` and ``manage.py
reconcile --loop`` do in ``make chaos``.
"""

import threading

import pytest
from django.db import connections

from bench.fake_provider import FakeProvider
from bench.faults import FAULTS, FaultSchedule
from bench.harness import (
    account_effectgate,
    account_naive,
    effectgate_ledger,
    refs,
    run_effectgate,
    run_naive,
    settle,
)
from operations.dispatch.probes import probe_due
from operations.services import sweep
from tests.conftest import make_runner

N = 200


class Loop(threading.Thread):
    """Calls ``function`` every ``every_s`` seconds on its own database connection."""

    def __init__(self, function, every_s=0.3):
        super().__init__(daemon=True)
        self.function = function
        self.every_s = every_s
        self.stopping = threading.Event()
        self.errors = []

    def run(self):
        try:
            while not self.stopping.wait(self.every_s):
                try:
                    self.function()
                except Exception as exc:  # a failed pass is retried, but reported
                    self.errors.append(repr(exc))
        finally:
            connections.close_all()

    def stop(self):
        self.stopping.set()
        self.join(timeout=30)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_small_chaos_run_has_no_duplicate_or_lost_effectgate_operation(live_server, settings):
    settings.RECONCILE_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.RECONCILE_PROBE_TIMEOUT_S = 2
    settings.RECONCILE_FIRST_PROBE_DELAY_S = 1
    schedule = FaultSchedule(seed=7, rate=0.3)
    items = refs(N)
    options = {"client_timeout_s": 0.5, "slow_s": 0.2}

    with FakeProvider(schedule, **options) as provider:
        naive = account_naive(run_naive(provider, items, workers=8, timeout_s=0.5), provider, items)

    api = make_runner()
    loops = [Loop(sweep), Loop(probe_due)]
    for loop in loops:
        loop.start()
    try:
        with FakeProvider(schedule, **options) as provider:
            report = run_effectgate(
                live_server.url, api.token, provider, items, workers=8, timeout_s=0.5, lease_s=2
            )
            assert settle(live_server.url, api.token, timeout_s=30)
            ledger = effectgate_ledger(report.run_ids)
            effects = provider.effects_by_ref()
            row = account_effectgate(report, provider, items, ledger)
    finally:
        for loop in loops:
            loop.stop()
    assert [loop.errors for loop in loops] == [[], []]

    # Every kind of fault happened, to both runners.
    assert set(row["faults"]) == set(naive["faults"]) == {"none", *FAULTS}
    # The naive runner paid some refunds twice; that is what the bench is about.
    assert naive["duplicates"] > 0
    # Effectgate: no duplicate, nothing lost, every refund accounted for exactly once.
    assert row["duplicates"] == 0
    assert row["lost"] == 0
    assert row["succeeded"] + row["failed_no_effect"] + row["in_reconciliation"] == N
    # The same rule, checked refund by refund against the provider's own records.
    assert len(ledger) == N
    for ref in items:
        status, paid = ledger[ref]["status"], effects[ref]
        if status == "succeeded":
            assert paid == 1, ref
        elif status in ("outcome_unknown", "compensating"):
            assert paid <= 1, ref
        else:
            assert status in ("awaiting_approval", "failed_permanent", "budget_exhausted"), ref
            assert paid == 0, ref
    # Timeouts and crashes were settled by probes, not by retries; refused connections
    # (nothing committed) were found not to have happened.
    assert row["auto_reconciled_by_result"].get("committed", 0) > 0
    assert row["auto_reconciled_by_result"].get("not_found", 0) > 0
    assert row["crashes"] > 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_typescript_runner_has_no_duplicate_or_lost_operation_where_a_naive_loop_has(
    live_server, settings, tmp_path
):
    """The TypeScript phase of ``make chaos`` (bench/chaos_ts.py): node processes run a
    naive loop and ``@effectgate/client``'s Runner under the same faults; a crash ends
    the node process for real."""
    from bench.chaos_ts import (
        TS_KEY_PREFIX,
        TS_TOOL,
        run_effectgate_ts,
        run_naive_ts,
        unavailable,
    )

    if reason := unavailable():
        pytest.fail(f"the TypeScript phase cannot run: {reason}")
    settings.RECONCILE_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.RECONCILE_PROBE_TIMEOUT_S = 2
    settings.RECONCILE_FIRST_PROBE_DELAY_S = 1
    schedule = FaultSchedule(seed=11, rate=0.3)
    items = refs(120)
    options = {"client_timeout_s": 0.5, "slow_s": 0.2}

    with FakeProvider(schedule, **options) as provider:
        report = run_naive_ts(
            provider, items, workers=6, timeout_s=0.5, log_path=tmp_path / "naive.log"
        )
        naive = account_naive(report, provider, items)

    api = make_runner()
    loops = [Loop(sweep), Loop(probe_due)]
    for loop in loops:
        loop.start()
    try:
        with FakeProvider(schedule, **options) as provider:
            report = run_effectgate_ts(
                live_server.url,
                api.token,
                provider,
                items,
                workers=6,
                timeout_s=0.5,
                lease_s=2,
                runs=8,
                log_path=tmp_path / "effectgate.log",
            )
            assert settle(live_server.url, api.token, tool=TS_TOOL, timeout_s=30)
            ledger = effectgate_ledger(report.run_ids, key_prefix=TS_KEY_PREFIX)
            effects = provider.effects_by_ref()
            row = account_effectgate(report, provider, items, ledger)
    finally:
        for loop in loops:
            loop.stop()
    assert [loop.errors for loop in loops] == [[], []]
    logs = (tmp_path / "effectgate.log").read_text()

    assert set(row["faults"]) == set(naive["faults"]) == {"none", *FAULTS}
    assert naive["runner"] == "naive-ts"
    assert naive["duplicates"] > 0
    assert naive["crashes"] > 0
    assert row["runner"] == "effectgate-ts"
    assert (row["duplicates"], row["lost"]) == (0, 0), logs
    assert row["succeeded"] + row["failed_no_effect"] + row["in_reconciliation"] == len(items)
    # Every answer is one the Runner gives; no node process failed otherwise.
    assert not [a for a in report.answers.values() if a.startswith("error:")], report.answers
    assert len(ledger) == len(items)
    for ref in items:
        status, paid = ledger[ref]["status"], effects[ref]
        if status == "succeeded":
            assert paid == 1, ref
        elif status in ("outcome_unknown", "compensating"):
            assert paid <= 1, ref
        else:
            assert status in ("awaiting_approval", "failed_permanent", "budget_exhausted"), ref
            assert paid == 0, ref
    # The crashed processes' refunds were settled by probes, never sent again.
    assert row["crashes"] > 0
    assert row["auto_reconciled_by_result"].get("committed", 0) > 0
