"""The chaos bench's instruments: the fault schedule, the fake provider, the accounting.

If these lie, the chaos figures lie, so each fault is checked from the client's side
and from the provider's records.
"""

import time
from collections import Counter

import httpx
import pytest

from bench.fake_provider import FakeProvider
from bench.faults import (
    FAULTS,
    NONE,
    REFUSED,
    RUNNER_CRASH,
    SLOW,
    TIMEOUT_AFTER_COMMIT,
    UNAVAILABLE,
    FaultSchedule,
)
from bench.harness import (
    RunnerCrash,
    RunReport,
    account_effectgate,
    account_naive,
    call_provider,
    run_jobs,
)
from effectgate_client import NotSent, Unknown, outcome_from_httpx_error


class Always(FaultSchedule):
    """The first request of every refund meets ``first``; later ones go through."""

    def __init__(self, first):
        super().__init__(lookup_fault_rate=0.0)
        object.__setattr__(self, "first", first)

    def fault(self, ref, request_number):
        return self.first if request_number == 1 else NONE


def test_schedule_is_deterministic_and_near_its_rate():
    schedule = FaultSchedule(seed=1, rate=0.3)
    draws = [schedule.fault(f"pay_{i:06d}", 1) for i in range(20_000)]
    assert draws == [
        FaultSchedule(seed=1, rate=0.3).fault(f"pay_{i:06d}", 1) for i in range(20_000)
    ]
    counts = Counter(draws)
    assert 0.28 < 1 - counts[NONE] / len(draws) < 0.32
    for fault in FAULTS:
        assert 0.045 < counts[fault] / len(draws) < 0.075, fault
    assert draws != [
        FaultSchedule(seed=2, rate=0.3).fault(f"pay_{i:06d}", 1) for i in range(20_000)
    ]


def _post(provider, ref="pay_000001", key="ik_1", timeout=0.5):
    with httpx.Client(timeout=timeout) as http:
        return call_provider(http, provider.url, ref, key)


def test_timeout_after_commit_commits_then_answers_too_late():
    with FakeProvider(Always(TIMEOUT_AFTER_COMMIT), client_timeout_s=0.3) as provider:
        with pytest.raises(httpx.ReadTimeout) as caught:
            _post(provider, timeout=0.3)
        assert isinstance(outcome_from_httpx_error(caught.value), Unknown)
        assert provider.effects_by_ref() == {"pay_000001": 1}


def test_unavailable_answers_503_and_commits_nothing():
    with FakeProvider(Always(UNAVAILABLE)) as provider:
        assert _post(provider).status_code == 503
        assert provider.effects == []


def test_refused_closes_the_connection_without_answer_or_commit():
    with FakeProvider(Always(REFUSED)) as provider:
        with pytest.raises(httpx.RemoteProtocolError) as caught:
            _post(provider)
        # From the client's side this is indistinguishable from a crash after commit.
        assert isinstance(outcome_from_httpx_error(caught.value), Unknown)
        assert provider.effects == []
        assert provider.log.faults[REFUSED] == 1


def test_slow_answers_within_the_timeout_after_committing():
    with FakeProvider(Always(SLOW), slow_s=0.2) as provider:
        started = time.monotonic()
        response = _post(provider, timeout=1)
        assert response.status_code == 200
        assert time.monotonic() - started >= 0.2
        assert provider.effects[0].id == response.json()["id"]


def test_runner_crash_commits_and_kills_the_sender():
    with FakeProvider(Always(RUNNER_CRASH)) as provider:
        with pytest.raises(RunnerCrash):
            _post(provider)
        assert provider.effects_by_ref() == {"pay_000001": 1}


def test_a_closed_port_is_not_sent():
    with FakeProvider() as provider:
        url = provider.url
    with httpx.Client(timeout=0.5) as http, pytest.raises(httpx.ConnectError) as caught:
        http.post(f"{url}/refunds", json={})
    assert isinstance(outcome_from_httpx_error(caught.value), NotSent)


def test_keys_are_ignored_unless_honoured():
    with FakeProvider() as provider:
        first, second = _post(provider), _post(provider)
        assert first.json()["id"] != second.json()["id"]
        assert provider.effects_by_ref() == {"pay_000001": 2}
    with FakeProvider(honour_keys=True) as provider:
        first, second = _post(provider), _post(provider)
        assert first.json()["id"] == second.json()["id"]
        assert provider.effects_by_ref() == {"pay_000001": 1}
        assert _post(provider, key="ik_other").json()["id"] != first.json()["id"]


def test_lookup_answers_in_the_shape_probes_read():
    with FakeProvider(Always(REFUSED)) as provider, httpx.Client() as http:
        lookup = provider.lookup_template.replace("{idempotency_key}", "{}")
        with pytest.raises(httpx.RemoteProtocolError):
            _post(provider, key="ik_refused")
        assert http.get(lookup.format("ik_refused")).json() == {
            "result": "not_found",
            "evidence": {"requests_seen_with_key": 1},
        }
        assert http.get(lookup.format("ik_never")).json()["result"] == "not_found"
    with FakeProvider() as provider, httpx.Client() as http:
        lookup = provider.lookup_template.replace("{idempotency_key}", "{}")
        refund = _post(provider, key="ik_ok").json()
        answer = http.get(lookup.format("ik_ok")).json()
        assert answer["result"] == "committed"
        assert answer["downstream_id"] == refund["id"]
        assert answer["evidence"]["refunds"] == [refund["id"]]


def test_lookup_faults_follow_the_schedule():
    schedule = FaultSchedule(rate=0.0, lookup_fault_rate=1.0)
    with FakeProvider(schedule) as provider, httpx.Client() as http:
        _post(provider, key="ik_x")
        url = provider.lookup_template.replace("{idempotency_key}", "ik_x")
        assert http.get(url).status_code == 503


def test_crashed_jobs_are_delivered_again_to_a_fresh_worker():
    crashed = set()
    workers = []

    def make_worker():
        workers.append(object())

        def job(ref):
            if ref not in crashed:
                crashed.add(ref)
                raise RunnerCrash(ref)
            return "done"

        return job, lambda: None

    answers, crashes = run_jobs(["a", "b", "c"], make_worker, workers=2, redelivery_delay_s=0.01)
    assert answers == {"a": "done", "b": "done", "c": "done"}
    assert crashes == 3
    assert len(workers) == 2 + 3  # every crash restarted its worker


class Records:
    def __init__(self, effects):
        self.counts = Counter(effects)
        self.log = type("Log", (), {"faults": Counter({NONE: 1})})()

    def effects_by_ref(self):
        return self.counts


def test_accounting_counts_duplicates_and_lost_operations_honestly():
    items = ["p1", "p2", "p3", "p4", "p5", "p6", "p7"]
    provider = Records(["p1", "p2", "p2", "p4", "p6"])
    ledger = {
        "p1": {"status": "succeeded", "probe": None},  # one refund: fine
        "p2": {"status": "succeeded", "probe": "committed"},  # two refunds: a duplicate
        "p3": {"status": "succeeded", "probe": None},  # success without refund: lost
        "p4": {"status": "outcome_unknown", "probe": None},  # in the queue, one refund: fine
        "p5": {"status": "awaiting_approval", "probe": "not_found"},  # no refund: fine
        "p6": {"status": "failed_permanent", "probe": None},  # failed but paid: lost
        # p7 missing from Effectgate: lost
    }
    report = RunReport("effectgate", {ref: "x" for ref in items}, crashes=0, wall_s=1.0)
    row = account_effectgate(report, provider, items, ledger)
    assert row["provider_effects"] == 5
    assert row["duplicates"] == 1
    assert row["lost"] == 3
    assert (row["succeeded"], row["in_reconciliation"], row["failed_no_effect"]) == (2, 1, 1)
    assert row["auto_reconciled"] == 2

    naive = RunReport("naive", {"p1": "succeeded", "p2": "gave_up", "p3": "gave_up"}, 0, 1.0)
    row = account_naive(naive, Records(["p1", "p1", "p2"]), ["p1", "p2", "p3"])
    assert (row["duplicates"], row["succeeded"], row["lost"], row["failed_no_effect"]) == (
        1,
        1,
        1,
        1,
    )
