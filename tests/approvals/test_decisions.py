"""Requests, decisions, quorum, grants, separation of duties, expiry and revocation."""

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import Group
from django.utils import timezone
from guardian.shortcuts import assign_perm, remove_perm

from approvals.errors import DecisionRefused, PermissionRefused
from approvals.models import ApprovalRequest, Decision
from operations import services
from operations.models import Event, Operation, Tool
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner


def _pending(api, *, principal="user:alice", approvals_required=1, **approval):
    api.tool(
        "refund",
        contract(
            "irreversible",
            approval={"mode": "always", "approvals_required": approvals_required, **approval},
        ),
    )
    op = api.register(api.run(principal=principal), "refund")
    assert op["status"] == "awaiting_approval"
    return op


def _decide(op, user, approve=True, comment=""):
    return services.approval_decide(
        request_id=op["approval"]["id"], user=user, approve=approve, comment=comment
    )


def test_approval_grants_and_the_claim_succeeds(api):
    op = _pending(api)
    approver = person(decide_on="refund")
    _decide(op, approver, comment="looks right")
    body = api.operation(op["id"])
    assert body["status"] == "ready"
    grant = body["approval"]["grant"]
    assert grant["intent_hash"] == op["intent_hash"]
    assert grant["decided_by"] == [approver.username]
    assert body["approval"]["decisions"][0]["comment"] == "looks right"
    assert api.claim(op["id"])["attempt"] == 1
    kinds = list(Event.objects.filter(stream=op["id"]).values_list("kind", flat=True))
    assert kinds == ["registered", "approval_requested", "decision", "granted", "claimed"]


def test_rejection_needs_a_reason_and_reaches_the_runner(api):
    op = _pending(api)
    approver = person(decide_on="refund")
    with pytest.raises(DecisionRefused, match="needs a reason"):
        _decide(op, approver, approve=False, comment="  ")
    _decide(op, approver, approve=False, comment="Customer already refunded by phone")
    body = api.operation(op["id"])
    assert body["status"] == "rejected"
    assert body["error_code"] == "approval_rejected"
    assert body["error_detail"] == "Customer already refunded by phone"
    assert body["approval"]["status"] == "rejected"
    assert api.claim(op["id"], expect=409)["code"] == "operation_closed"


def test_quorum_needs_distinct_people(api):
    op = _pending(api, approvals_required=2)
    first, second = person(decide_on="refund"), person(decide_on="refund")
    _decide(op, first)
    assert Operation.objects.get(pk=op["id"]).status == "awaiting_approval"
    with pytest.raises(PermissionRefused, match="already decided"):
        _decide(op, first)
    assert Decision.objects.count() == 1
    _decide(op, second)
    assert Operation.objects.get(pk=op["id"]).status == "ready"


def test_without_the_permission_nobody_decides(api):
    op = _pending(api)
    with pytest.raises(PermissionRefused, match="permission"):
        _decide(op, person())


def test_permission_through_a_group_works(api):
    op = _pending(api)
    group = Group.objects.create(name="refund-approvers")
    assign_perm("operations.decide_tool", group, Tool.objects.get(pk="refund"))
    member = person()
    member.groups.add(group)
    _decide(op, member)
    assert Operation.objects.get(pk=op["id"]).status == "ready"


def test_the_principal_cannot_decide_on_their_own_operation(api):
    alice = person(username="alice")
    op = _pending(api, principal="user:alice")
    assign_perm("operations.decide_tool", alice, Tool.objects.get(pk="refund"))
    for approve, comment in ((True, ""), (False, "no")):
        with pytest.raises(PermissionRefused, match="principal"):
            _decide(op, alice, approve=approve, comment=comment)


def test_the_runner_owner_cannot_decide_even_as_superuser(db):
    owner = person(is_superuser=True, is_staff=True)
    api = make_runner(owner=owner)
    op = _pending(api)
    with pytest.raises(PermissionRefused, match="owner"):
        _decide(op, owner)


def test_a_superuser_counts_as_one_person_in_a_quorum(api):
    op = _pending(api, approvals_required=2)
    root = person(is_superuser=True)
    _decide(op, root)
    with pytest.raises(PermissionRefused, match="already decided"):
        _decide(op, root)


def test_a_grant_cannot_be_used_for_a_different_intent(api):
    op = _pending(api)
    _decide(op, person(decide_on="refund"))
    # The grant binds the intent hash; an operation whose intent no longer matches it
    # (here forced in the database) is refused at claim and asked again.
    Operation.objects.filter(pk=op["id"]).update(intent_hash="0" * 64)
    refusal = api.claim(op["id"], expect=403)
    assert refusal["code"] == "grant_invalid"
    assert "intent changed" in refusal["detail"]
    body = api.operation(op["id"])
    assert body["status"] == "awaiting_approval"
    assert body["approval"]["status"] == "pending"
    assert ApprovalRequest.objects.filter(operation_id=op["id"]).count() == 2


def test_an_expired_grant_is_refused_at_claim_and_asked_again(api):
    op = _pending(api, grant_ttl_s=60)
    _decide(op, person(decide_on="refund"))
    with time_machine.travel(timezone.now() + timedelta(seconds=61), tick=False):
        refusal = api.claim(op["id"], expect=403)
    assert refusal["code"] == "grant_invalid"
    assert "expired" in refusal["detail"]
    event = Event.objects.get(stream=op["id"], kind="grant_invalid")
    assert event.data["problem"] == "the grant expired"
    assert Operation.objects.get(pk=op["id"]).status == "awaiting_approval"


def test_a_revoked_grant_is_refused_at_claim(api):
    op = _pending(api)
    approver = person(decide_on="refund")
    _decide(op, approver)
    services.approval_revoke(request_id=op["approval"]["id"], user=approver, reason="fraud")
    refusal = api.claim(op["id"], expect=403)
    assert refusal["code"] == "grant_invalid"
    assert "revoked" in refusal["detail"]


def test_a_decider_who_lost_the_permission_invalidates_the_grant(api):
    op = _pending(api)
    approver = person(decide_on="refund")
    _decide(op, approver)
    remove_perm("operations.decide_tool", approver, Tool.objects.get(pk="refund"))
    refusal = api.claim(op["id"], expect=403)
    assert refusal["code"] == "grant_invalid"
    assert approver.username in refusal["detail"]


def test_a_deactivated_decider_invalidates_the_grant(api):
    op = _pending(api)
    approver = person(decide_on="refund")
    _decide(op, approver)
    approver.is_active = False
    approver.save()
    assert api.claim(op["id"], expect=403)["code"] == "grant_invalid"


def test_a_valid_grant_serves_every_attempt_until_it_expires(api):
    op = _pending(api)
    _decide(op, person(decide_on="refund"))
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "failed", "code": "rate_limited"})
    assert api.claim(op["id"])["attempt"] == 2


def test_an_undecided_request_expires_and_ends_the_operation(api):
    op = _pending(api, request_ttl_s=60)
    with time_machine.travel(timezone.now() + timedelta(seconds=61), tick=False):
        assert services.sweep().approvals_expired == 1
        assert services.sweep().approvals_expired == 0
    body = api.operation(op["id"])
    assert body["status"] == "rejected"
    assert body["error_code"] == "approval_expired"
    assert body["approval"]["status"] == "expired"
    result = api.get(f"/api/v1/operations/{op['id']}/tool-result").json()
    assert result["code"] == "approval_expired"


def test_deciding_on_an_expired_request_is_refused(api):
    op = _pending(api, request_ttl_s=60)
    approver = person(decide_on="refund")
    later = timezone.now() + timedelta(seconds=61)
    with time_machine.travel(later, tick=False), pytest.raises(DecisionRefused):
        _decide(op, approver)
    assert Operation.objects.get(pk=op["id"]).status == "rejected"


def test_second_gate_after_not_found_needs_a_new_approval_with_the_evidence(api):
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    op = api.register(api.run(), "refund")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    response = api.post(
        f"/api/v1/operations/{op['id']}/reconciliations",
        {"result": "not_found", "evidence": {"provider": "no such refund"}},
    )
    assert response.json()["status"] == "awaiting_approval"
    request = ApprovalRequest.objects.get(operation_id=op["id"])
    assert request.context["reconciliation"]["evidence"] == {"provider": "no such refund"}
    assert "did not happen" in request.reason
    _decide(api.operation(op["id"]), person(decide_on="refund"))
    assert api.claim(op["id"])["attempt"] == 2


def test_cancelling_the_run_withdraws_the_pending_request(api):
    op = _pending(api)
    run = Operation.objects.get(pk=op["id"]).run_id
    api.post(f"/api/v1/runs/{run}/cancel")
    assert ApprovalRequest.objects.get(operation_id=op["id"]).status == "withdrawn"
    with pytest.raises(DecisionRefused):
        _decide(op, person(decide_on="refund"))
