"""The outcome table and the state machine as pure functions (no database)."""

import random
from datetime import UTC, datetime, timedelta

import pytest

from operations import machine
from operations.machine import EffectClass, Status, Verdict

REPEATABLE = [EffectClass.READ_ONLY, EffectClass.IDEMPOTENT, EffectClass.DEDUPLICATED]
ALL = list(EffectClass)


@pytest.mark.parametrize("cls", ALL)
def test_success_is_success_for_every_class(cls):
    verdict = machine.classify_outcome(
        effect_class=cls, kind="succeeded", code=None, retryable_codes=[]
    )
    assert verdict == Verdict.SUCCEEDED


@pytest.mark.parametrize("cls", ALL)
def test_not_sent_and_retryable_codes_retry_for_every_class(cls):
    for code in ("not_sent", "rate_limited"):
        verdict = machine.classify_outcome(
            effect_class=cls, kind="failed", code=code, retryable_codes=["rate_limited"]
        )
        assert verdict == Verdict.RETRY


@pytest.mark.parametrize("cls", ALL)
def test_other_failures_are_permanent_for_every_class(cls):
    verdict = machine.classify_outcome(
        effect_class=cls, kind="failed", code="invalid_arguments", retryable_codes=["x"]
    )
    assert verdict == Verdict.FAILED_PERMANENT


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        *[(cls, Verdict.RETRY) for cls in REPEATABLE],
        (EffectClass.COMPENSABLE, Verdict.COMPENSATE),
        (EffectClass.IRREVERSIBLE, Verdict.RECONCILE),
    ],
)
def test_unknown_outcome_by_class(cls, expected):
    verdict = machine.classify_outcome(
        effect_class=cls, kind="unknown", code="timeout", retryable_codes=[]
    )
    assert verdict == expected


def test_unknown_is_sticky_for_writes_only():
    for cls in ALL:
        ended = machine.end_without_retry(
            effect_class=cls, unknown_sticky=True, wanted=Status.FAILED_PERMANENT
        )
        expected = (
            Status.FAILED_PERMANENT if cls == EffectClass.READ_ONLY else Status.OUTCOME_UNKNOWN
        )
        assert ended == expected
    assert (
        machine.end_without_retry(
            effect_class=EffectClass.IRREVERSIBLE,
            unknown_sticky=False,
            wanted=Status.BUDGET_EXHAUSTED,
        )
        == Status.BUDGET_EXHAUSTED
    )


def test_terminal_states_have_no_way_out_but_cancelled_late_success():
    for status in machine.TERMINAL:
        allowed = machine.TRANSITIONS[status]
        if status == Status.CANCELLED:
            assert allowed == {Status.SUCCEEDED}
        else:
            assert allowed == frozenset()


def test_backoff_is_capped_exponential_with_full_jitter():
    rng = random.Random(7)
    draws = [
        machine.backoff_delay_ms(attempt=5, base_delay_ms=100, max_delay_ms=1000, rng=rng)
        for _ in range(2000)
    ]
    assert 0 <= min(draws) < 100
    assert max(draws) <= 1000
    assert max(draws) > 900  # the cap (not 100 * 2**4 = 1600) bounds the draws
    first = [
        machine.backoff_delay_ms(attempt=1, base_delay_ms=100, max_delay_ms=1000, rng=rng)
        for _ in range(200)
    ]
    assert max(first) <= 100


def test_retry_budget_counts_attempts_and_deadline():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    deadline = now + timedelta(seconds=10)
    budget = machine.Budget(attempts_used=2, max_attempts=3, deadline_at=deadline)
    assert machine.retry_possible(budget, not_before=now)
    assert not machine.retry_possible(budget, not_before=deadline)
    spent = machine.Budget(attempts_used=3, max_attempts=3, deadline_at=None)
    assert not machine.retry_possible(spent, not_before=now)


def test_allowed_next_actions():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    later = now + timedelta(seconds=5)
    assert machine.allowed_next_actions(status="ready", now=now, not_before=None) == [
        "claim_attempt"
    ]
    assert machine.allowed_next_actions(status="ready", now=now, not_before=later) == [
        "wait_until_not_before"
    ]
    assert machine.allowed_next_actions(status="executing", now=now, not_before=None) == [
        "post_outcome",
        "heartbeat",
    ]
    assert machine.allowed_next_actions(status="outcome_unknown", now=now, not_before=None) == [
        "reconcile"
    ]
    assert machine.allowed_next_actions(status="compensating", now=now, not_before=None) == [
        "compensate"
    ]
    assert machine.allowed_next_actions(status="succeeded", now=now, not_before=None) == []
