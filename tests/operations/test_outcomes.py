"""Posting outcomes twice, late outcomes after the lease moved on, and sticky unknowns."""

from datetime import timedelta

import time_machine
from django.utils import timezone

from operations.canonical import sha256_hex
from operations.models import Attempt, Event, Operation
from operations.services import sweep
from tests.conftest import contract


def _executing(api, cls="idempotent", **kwargs):
    api.tool(f"t_{cls}", contract(cls, approval={"mode": "never"}))
    op = api.register(api.run(), f"t_{cls}", **kwargs)
    api.claim(op["id"], lease_s=10)
    return op


def test_same_outcome_twice_answers_the_same_body(api):
    op = _executing(api)
    body = {"kind": "succeeded", "result": {"n": 1}, "downstream_id": "re_1"}
    first = api.outcome(op["id"], 1, body)
    second = api.outcome(op["id"], 1, body)
    assert first == second
    assert Event.objects.filter(stream=op["id"], kind="outcome").count() == 1


def test_the_outcome_event_holds_the_digest_of_the_stored_answer(api):
    """What the runner said the provider answered is on the attempt; its event holds the
    RFC 8785 digest of it, which an evidence bundle's verifier recomputes."""
    op = _executing(api)
    body = {"kind": "succeeded", "result": {"n": 1}, "downstream_id": "re_1", "cost": 0.25}
    api.outcome(op["id"], 1, body)
    attempt = Attempt.objects.get(operation_id=op["id"], number=1)
    event = Event.objects.get(stream=op["id"], kind="outcome")
    assert attempt.outcome == body
    assert event.data["outcome_hash"] == sha256_hex(attempt.outcome)


def test_different_outcome_for_an_attempt_that_has_one_conflicts(api):
    op = _executing(api)
    api.outcome(op["id"], 1, {"kind": "succeeded"})
    conflict = api.outcome(op["id"], 1, {"kind": "failed", "code": "boom"}, expect=409)
    assert conflict["code"] == "outcome_conflict"
    assert Operation.objects.get(pk=op["id"]).status == "succeeded"


def _expire_and_sweep():
    with time_machine.travel(timezone.now() + timedelta(seconds=11), tick=False):
        sweep()


def test_outcome_after_the_sweep_closed_the_lease_is_stale_and_changes_nothing(api):
    op = _executing(api, "irreversible")
    _expire_and_sweep()
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"
    refusal = api.outcome(op["id"], 1, {"kind": "failed", "code": "boom"}, expect=409)
    assert refusal["code"] == "stale_attempt"
    stored = Operation.objects.get(pk=op["id"])
    assert stored.status == "outcome_unknown"
    assert Attempt.objects.get(operation=stored).status == "lease_expired"
    late = Event.objects.get(stream=op["id"], kind="late_outcome")
    assert late.data["outcome"]["kind"] == "failed"


def test_late_success_closes_an_outcome_unknown_operation(api):
    op = _executing(api, "irreversible")
    _expire_and_sweep()
    refusal = api.outcome(op["id"], 1, {"kind": "succeeded", "downstream_id": "re_9"}, expect=409)
    assert refusal["code"] == "stale_attempt"
    stored = Operation.objects.get(pk=op["id"])
    assert stored.status == "succeeded"
    assert stored.downstream_id == "re_9"
    kinds = list(Event.objects.filter(stream=op["id"]).values_list("kind", flat=True))
    assert kinds[-2:] == ["late_outcome", "late_success"]


def test_late_success_makes_a_newer_attempt_stale(api):
    op = _executing(api, "idempotent")
    with time_machine.travel(timezone.now() + timedelta(seconds=11), tick=False):
        api.claim(op["id"], lease_s=60)  # attempt 2; attempt 1 closed as lease_expired
    api.outcome(op["id"], 1, {"kind": "succeeded"}, expect=409)
    assert Operation.objects.get(pk=op["id"]).status == "succeeded"
    refusal = api.outcome(op["id"], 2, {"kind": "succeeded"}, expect=409)
    assert refusal["code"] == "stale_attempt"
    assert list(
        Attempt.objects.filter(operation_id=op["id"])
        .order_by("number")
        .values_list("status", flat=True)
    ) == ["lease_expired", "superseded"]


def test_late_success_closes_a_cancelled_operation(api):
    op = _executing(api, "idempotent")
    _expire_and_sweep()  # back to ready with the same key
    run = Operation.objects.get(pk=op["id"]).run_id
    assert api.post(f"/api/v1/runs/{run}/cancel").status_code == 200
    assert Operation.objects.get(pk=op["id"]).status == "cancelled"
    api.outcome(op["id"], 1, {"kind": "succeeded"}, expect=409)
    assert Operation.objects.get(pk=op["id"]).status == "succeeded"


def test_outcome_before_anything_acted_on_the_expired_lease_is_accepted(api):
    op = _executing(api, "irreversible")
    with time_machine.travel(timezone.now() + timedelta(seconds=11), tick=False):
        body = api.outcome(op["id"], 1, {"kind": "succeeded"})
    assert body["status"] == "succeeded"


def test_outcome_for_an_attempt_that_does_not_exist(api):
    op = _executing(api)
    assert api.outcome(op["id"], 7, {"kind": "succeeded"}, expect=404)["code"] == "not_found"


def test_failed_outcome_needs_a_code(api):
    op = _executing(api)
    problem = api.outcome(op["id"], 1, {"kind": "failed"}, expect=400)
    assert problem["code"] == "invalid_request"
    assert problem["errors"] == [{"path": "/code", "message": "A failed outcome needs a code."}]
    assert Operation.objects.get(pk=op["id"]).status == "executing"


def test_a_late_unknown_after_not_found_reopens_the_question(api):
    """The probe said "not found", then the attempt's runner reports it sent the call and
    never heard back: the request may have landed after the lookup, so no retry may be
    approved on the strength of that "not found"."""
    op = _executing(api, "irreversible")
    _expire_and_sweep()
    response = api.post(f"/api/v1/operations/{op['id']}/reconciliations", {"result": "not_found"})
    assert response.json()["status"] == "awaiting_approval"
    refusal = api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"}, expect=409)
    assert refusal["code"] == "stale_attempt"
    body = api.operation(op["id"])
    assert body["status"] == "outcome_unknown"
    assert body["approval"]["status"] == "withdrawn"
    assert Event.objects.filter(stream=op["id"], kind="reopened").count() == 1
    assert not Attempt.objects.get(operation_id=op["id"]).not_applied


def test_a_late_failure_after_not_found_changes_nothing(api):
    op = _executing(api, "irreversible")
    _expire_and_sweep()
    api.post(f"/api/v1/operations/{op['id']}/reconciliations", {"result": "not_found"})
    api.outcome(op["id"], 1, {"kind": "failed", "code": "card_declined"}, expect=409)
    assert Operation.objects.get(pk=op["id"]).status == "awaiting_approval"
