"""Every row of the outcome table (docs/api.md, The state machine: what a posted outcome
does), for every effect class, through the API."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from operations.models import Attempt, Event, Operation
from operations.services import sweep
from tests.conftest import contract

CLASSES = ["read_only", "idempotent", "deduplicated", "compensable", "irreversible"]
REPEATABLE = ["read_only", "idempotent", "deduplicated"]
WRITES = ["idempotent", "deduplicated", "compensable", "irreversible"]


def _ready(api, cls, **retry):
    body = contract(cls, approval={"mode": "never"})
    body["retry"].update(retry)
    api.tool(f"t_{cls}", body)
    op = api.register(api.run(), f"t_{cls}")
    api.claim(op["id"])
    return op


@pytest.mark.parametrize("cls", CLASSES)
def test_succeeded(api, cls):
    op = _ready(api, cls)
    body = api.outcome(op["id"], 1, {"kind": "succeeded", "result": {"ok": True}})
    assert body["status"] == "succeeded"
    assert body["result"] == {"ok": True}
    stored = Operation.objects.get(pk=op["id"])
    assert stored.status == "succeeded"
    assert Attempt.objects.get(operation=stored).status == "succeeded"


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("code", ["not_sent", "rate_limited"])
def test_not_sent_or_retryable_code_retries_with_backoff(api, cls, code):
    op = _ready(api, cls, base_delay_ms=60_000, max_delay_ms=60_000)
    body = api.outcome(op["id"], 1, {"kind": "failed", "code": code, "retry_after_ms": 30_000})
    assert body["status"] == "ready"
    assert body["error_code"] == code
    stored = Operation.objects.get(pk=op["id"])
    # The wait is the larger of the jittered backoff and the runner's retry_after_ms.
    assert stored.not_before >= timezone.now() + timedelta(seconds=29)
    assert body["allowed_next_actions"] == ["wait_until_not_before"]
    refusal = api.claim(op["id"], expect=409)
    assert refusal["code"] == "retry_later"
    assert refusal["retry_after_ms"] > 29_000
    assert Attempt.objects.filter(operation=stored).count() == 1


@pytest.mark.parametrize("cls", CLASSES)
def test_permanent_failure(api, cls):
    op = _ready(api, cls)
    body = api.outcome(op["id"], 1, {"kind": "failed", "code": "invalid_arguments", "detail": "no"})
    assert body["status"] == "failed_permanent"
    assert body["error_code"] == "invalid_arguments"
    assert body["error_detail"] == "no"
    assert Operation.objects.get(pk=op["id"]).status == "failed_permanent"


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        ("read_only", "ready"),
        ("idempotent", "ready"),
        ("deduplicated", "ready"),
        ("compensable", "compensating"),
        ("irreversible", "outcome_unknown"),
    ],
)
def test_unknown_outcome(api, cls, expected):
    op = _ready(api, cls)
    body = api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    assert body["status"] == expected
    stored = Operation.objects.get(pk=op["id"])
    assert stored.status == expected
    assert stored.unknown_sticky == (cls in WRITES)
    if expected == "ready":
        # A repeatable operation retries with the same idempotency key.
        again = api.claim(op["id"])
        assert again["attempt"] == 2
        assert again["idempotency_key"] == op["idempotency_key"]
    else:
        code = {
            "compensating": "compensation_required",
            "outcome_unknown": "reconciliation_required",
        }
        assert api.claim(op["id"], expect=409)["code"] == code[expected]


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        ("read_only", "ready"),
        ("idempotent", "ready"),
        ("deduplicated", "ready"),
        ("compensable", "compensating"),
        ("irreversible", "outcome_unknown"),
    ],
)
def test_lease_expired_with_no_outcome_is_unknown(api, cls, expected):
    op = _ready(api, cls)
    with time_machine.travel(timezone.now() + timedelta(seconds=31), tick=False):
        report = sweep()
    assert report.leases_expired == 1
    stored = Operation.objects.get(pk=op["id"])
    assert stored.status == expected
    assert Attempt.objects.get(operation=stored).status == "lease_expired"
    assert Event.objects.filter(stream=stored.id, kind="lease_expired").count() == 1


@pytest.mark.parametrize("cls", CLASSES)
def test_retry_with_no_attempt_left_ends_in_budget_exhausted(api, cls):
    op = _ready(api, cls, max_attempts=1)
    body = api.outcome(op["id"], 1, {"kind": "failed", "code": "rate_limited"})
    assert body["status"] == "budget_exhausted"
    assert Operation.objects.get(pk=op["id"]).status == "budget_exhausted"


@pytest.mark.parametrize("cls", ["idempotent", "deduplicated"])
def test_unknown_is_sticky_a_later_permanent_failure_waits_for_reconciliation(api, cls):
    op = _ready(api, cls)
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    api.claim(op["id"])
    body = api.outcome(op["id"], 2, {"kind": "failed", "code": "forbidden"})
    assert body["status"] == "outcome_unknown"
    assert body["allowed_next_actions"] == ["reconcile"]


@pytest.mark.parametrize("cls", ["idempotent", "deduplicated"])
def test_unknown_is_sticky_an_empty_budget_waits_for_reconciliation(api, cls):
    op = _ready(api, cls, max_attempts=2)
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    api.claim(op["id"])
    body = api.outcome(op["id"], 2, {"kind": "unknown", "code": "timeout_unknown"})
    assert body["status"] == "outcome_unknown"
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"


def test_read_only_unknown_is_not_sticky(api):
    op = _ready(api, "read_only", max_attempts=2)
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    api.claim(op["id"])
    body = api.outcome(op["id"], 2, {"kind": "failed", "code": "forbidden"})
    assert body["status"] == "failed_permanent"


def test_operation_deadline_passed_at_claim(api):
    op = _ready(api, "idempotent", deadline_s=60)
    api.outcome(op["id"], 1, {"kind": "failed", "code": "not_sent"})
    with time_machine.travel(timezone.now() + timedelta(seconds=61), tick=False):
        refusal = api.claim(op["id"], expect=409)
    assert refusal["code"] == "budget_exhausted"
    assert Operation.objects.get(pk=op["id"]).status == "budget_exhausted"


def test_sweep_ends_waiting_operations_past_their_deadline(api):
    body = contract("idempotent")
    body["retry"]["deadline_s"] = 60
    api.tool("slow", body)
    op = api.register(api.run(), "slow")
    with time_machine.travel(timezone.now() + timedelta(seconds=61), tick=False):
        assert sweep().operations_past_deadline == 1
    assert Operation.objects.get(pk=op["id"]).status == "budget_exhausted"
