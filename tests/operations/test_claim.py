"""Claims: the refusal order of api.md, leases, heartbeats and the concurrency key."""

from datetime import timedelta

import pytest
import time_machine
from django.db import transaction
from django.utils import timezone

from operations import services
from operations.models import Attempt, Event, Operation
from tests.conftest import contract


def test_second_claim_while_executing_is_refused_with_retry_after(api):
    api.tool("t")
    op = api.register(api.run(), "t")
    api.claim(op["id"], lease_s=60)
    response = api.post(f"/api/v1/operations/{op['id']}/attempts", {})
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "attempt_in_progress"
    assert 59_000 < body["retry_after_ms"] <= 60_001
    assert response["Retry-After"] == "61" or response["Retry-After"] == "60"
    assert response["Content-Type"] == "application/problem+json"
    assert Attempt.objects.filter(operation_id=op["id"]).count() == 1


def test_claim_of_a_closed_operation(api):
    api.tool("t")
    op = api.register(api.run(), "t")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "succeeded"})
    assert api.claim(op["id"], expect=409)["code"] == "operation_closed"


def test_claim_while_awaiting_approval(api):
    api.tool("t", contract("irreversible", approval={"mode": "always"}))
    op = api.register(api.run(), "t")
    assert op["status"] == "awaiting_approval"
    assert op["allowed_next_actions"] == ["wait_for_approval"]
    assert op["approval"]["status"] == "pending"
    assert api.claim(op["id"], expect=409)["code"] == "approval_required"


def test_approval_required_says_when_to_ask_again_and_which_request_waits(api):
    api.tool("t", contract("irreversible", approval={"mode": "always", "request_ttl_s": 3}))
    with time_machine.travel(timezone.now(), tick=False):
        op = api.register(api.run(), "t")
        answer = api.post(f"/api/v1/operations/{op['id']}/attempts", {"lease_s": 30})
    body = answer.json()
    assert (answer.status_code, body["code"]) == (409, "approval_required")
    # Polling pace, but never past the request's expiry (3 s here).
    assert body["retry_after_ms"] == 3001
    assert answer.headers["Retry-After"] == "4"
    assert body["approval"] == op["approval"]["id"]
    assert body["expires_at"] == op["approval"]["expires_at"]
    assert op["approval"]["id"] in body["detail"]


def test_approval_required_past_expiry_but_not_yet_swept_still_polls_at_a_pace(api):
    api.tool("t", contract("irreversible", approval={"mode": "always", "request_ttl_s": 3}))
    op = api.register(api.run(), "t")
    with time_machine.travel(timezone.now() + timedelta(seconds=10), tick=False):
        answer = api.post(f"/api/v1/operations/{op['id']}/attempts", {"lease_s": 30})
    assert answer.json()["code"] == "approval_required"
    assert answer.json()["retry_after_ms"] == 5000, "not a tight loop while the sweep catches up"


def test_approval_required_polls_at_most_every_five_seconds(api):
    api.tool("t", contract("irreversible", approval={"mode": "always"}))
    op = api.register(api.run(), "t")
    answer = api.post(f"/api/v1/operations/{op['id']}/attempts", {"lease_s": 30})
    assert answer.json()["retry_after_ms"] == 5000
    assert answer.headers["Retry-After"] == "5"


def test_runner_may_ask_for_approval_the_policy_would_not(api):
    api.tool("t", contract("idempotent", approval={"mode": "never"}))
    op = api.register(api.run(), "t", approval={"require": True, "reason": "the agent is unsure"})
    assert op["status"] == "awaiting_approval"
    assert "the agent is unsure" in op["approval"]["reason"]


def test_rules_policy_leaves_large_amounts_awaiting_approval(api):
    rules = {"mode": "rules", "rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}]}
    api.tool("refund", contract("irreversible", approval=rules))
    run = api.run()
    small = api.register(run, "refund", {"payment_id": "p", "amount_cents": 500})
    large = api.register(run, "refund", {"payment_id": "p", "amount_cents": 60000})
    assert small["status"] == "ready"
    assert large["status"] == "awaiting_approval"
    assert "/amount_cents gt 50000" in large["approval"]["reason"]


def test_expired_lease_is_handled_at_claim_then_the_claim_goes_on(api):
    api.tool("t")
    op = api.register(api.run(), "t")
    api.claim(op["id"], lease_s=5)
    with time_machine.travel(timezone.now() + timedelta(seconds=6), tick=False):
        second = api.claim(op["id"])
    assert second["attempt"] == 2
    attempts = list(Attempt.objects.filter(operation_id=op["id"]).order_by("number"))
    assert [a.status for a in attempts] == ["lease_expired", "executing"]
    kinds = list(Event.objects.filter(stream=op["id"]).values_list("kind", flat=True))
    assert kinds == ["registered", "claimed", "lease_expired", "claimed"]


def test_expired_lease_of_irreversible_at_claim_commits_then_refuses(api):
    api.tool("t", contract("irreversible", approval={"mode": "never"}))
    op = api.register(api.run(), "t")
    api.claim(op["id"], lease_s=5)
    with time_machine.travel(timezone.now() + timedelta(seconds=6), tick=False):
        refusal = api.claim(op["id"], expect=409)
    assert refusal["code"] == "reconciliation_required"
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"


def test_heartbeat_extends_the_lease_until_it_has_passed(api):
    api.tool("t")
    op = api.register(api.run(), "t")
    api.claim(op["id"], lease_s=10)
    url = f"/api/v1/operations/{op['id']}/attempts/1/heartbeat"
    with time_machine.travel(timezone.now() + timedelta(seconds=8), tick=False):
        response = api.post(url, {"lease_s": 30})
        assert response.status_code == 200
        assert Operation.objects.get(pk=op["id"]).lease_until > timezone.now() + timedelta(
            seconds=29
        )
    with time_machine.travel(timezone.now() + timedelta(seconds=45), tick=False):
        response = api.post(url, {"lease_s": 30})
    assert response.status_code == 409
    assert response.json()["code"] == "stale_attempt"


def test_claim_with_registration_saves_a_round_trip(api):
    api.tool("t")
    op = api.register(api.run(), "t", claim={"lease_s": 20})
    assert op["status"] == "executing"
    assert op["attempt"]["attempt"] == 1
    assert op["attempt"]["idempotency_key"] == op["idempotency_key"]


def test_claim_with_registration_is_ignored_on_a_replay(api):
    api.tool("t")
    run = api.run()
    first = api.register(run, "t", operation_key="k", claim={"lease_s": 20})
    again = api.register(run, "t", operation_key="k", claim={"lease_s": 20}, expect=200)
    assert again["id"] == first["id"]
    assert "attempt" not in again
    assert Attempt.objects.filter(operation_id=first["id"]).count() == 1


def test_concurrency_key_blocks_a_second_operation_on_the_same_resource(api):
    api.tool(
        "refund",
        contract("irreversible", approval={"mode": "never"}, concurrency_key="/payment_id"),
    )
    run = api.run()
    a = api.register(run, "refund", {"payment_id": "pay_1", "amount_cents": 1})
    b = api.register(run, "refund", {"payment_id": "pay_1", "amount_cents": 2})
    c = api.register(run, "refund", {"payment_id": "pay_2", "amount_cents": 3})
    api.claim(a["id"])
    refusal = api.claim(b["id"], expect=409)
    assert refusal["code"] == "concurrency_conflict"
    assert a["id"] not in refusal["detail"]
    api.claim(c["id"])
    # An unknown outcome keeps blocking the resource until it is answered.
    api.outcome(a["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    assert api.claim(b["id"], expect=409)["code"] == "concurrency_conflict"
    response = api.post(f"/api/v1/operations/{a['id']}/reconciliations", {"result": "committed"})
    assert response.status_code == 200
    api.claim(b["id"])


def test_restricted_runner_without_invoke_permission_is_forbidden(api):
    api.tool("t")
    run = api.run()
    op = api.register(run, "t")
    api.runner.restrict_tools = True
    api.runner.save()
    refusal = api.claim(op["id"], expect=403)
    assert refusal["code"] == "tool_forbidden"
    assert Operation.objects.get(pk=op["id"]).status == "ready"
    assert api.register(run, "t", expect=403)["code"] == "tool_forbidden"


def _leases(op_id: str) -> tuple:
    """The operation's lease, and every attempt's by number."""
    op = Operation.objects.get(pk=op_id)
    attempts = dict(Attempt.objects.filter(operation_id=op_id).values_list("number", "lease_until"))
    return op.status, op.lease_until, attempts


def test_the_operation_holds_a_copy_of_its_executing_attempts_lease_and_only_then(api):
    """The lease is the attempt's, kept after it closes; the operation's is the same
    value while it executes (claimed inline or not, extended by heartbeats) and none
    otherwise."""
    api.tool("t", contract("idempotent"))
    op = api.register(api.run(), "t", claim={"lease_s": 30})
    status, lease, attempts = _leases(op["id"])
    assert (status, lease) == ("executing", attempts[1])
    assert op["lease_until"] == op["attempt"]["lease_until"]

    url = f"/api/v1/operations/{op['id']}/attempts/1/heartbeat"
    assert api.post(url, {"lease_s": 60}).status_code == 200
    status, lease, extended = _leases(op["id"])
    assert (status, lease) == ("executing", extended[1])
    assert extended[1] > attempts[1]

    api.outcome(op["id"], 1, {"kind": "failed", "code": "rate_limited"})
    status, lease, closed = _leases(op["id"])
    assert (status, lease, closed) == ("ready", None, extended)

    second = api.claim(op["id"], lease_s=10)
    status, lease, attempts = _leases(op["id"])
    assert (status, lease) == ("executing", attempts[2])
    assert api.operation(op["id"])["lease_until"] == second["lease_until"]

    with time_machine.travel(timezone.now() + timedelta(seconds=11), tick=False):
        assert services.sweep().leases_expired == 1
    status, lease, expired = _leases(op["id"])
    assert (status, lease, expired) == ("ready", None, attempts)
    assert api.operation(op["id"])["lease_until"] is None


def test_an_operation_enters_executing_only_with_the_attempt_whose_lease_it_holds(api):
    """Without the attempt an executing operation would have no lease, and the sweep,
    which finds due leases on the operation, would never expire it."""
    api.tool("t")
    op = api.register(api.run(), "t")
    actor = services.Actor.system("test")
    with transaction.atomic():
        locked = services.core.lock(op["id"])
        with pytest.raises(ValueError, match="held exactly while executing"):
            services.core.transition(
                locked, to="executing", kind="claimed", actor=actor, now=timezone.now()
            )
    stored = Operation.objects.get(pk=op["id"])
    assert (stored.status, stored.attempts, stored.lease_until) == ("ready", 0, None)
    assert list(Event.objects.filter(stream=op["id"]).values_list("kind", flat=True)) == [
        "registered"
    ]
    # A lease is never given to an operation that leaves executing either.
    attempt = Attempt(operation_id=op["id"], number=1, claimed_at=timezone.now())
    attempt.lease_until = timezone.now() + timedelta(seconds=30)
    with transaction.atomic():
        locked = services.core.lock(op["id"])
        with pytest.raises(ValueError, match="held exactly while executing"):
            services.core.transition(
                locked,
                to="cancelled",
                kind="cancelled",
                actor=actor,
                now=timezone.now(),
                lease=attempt,
            )
    assert Operation.objects.get(pk=op["id"]).status == "ready"
