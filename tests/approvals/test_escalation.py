"""Escalation (contract ``approval.escalate_after_s`` / ``escalate_to``): a request still
pending after that time is offered to a group of people too."""

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import Group
from django.core import mail
from django.test import Client
from django.utils import timezone

from approvals.errors import PermissionRefused
from operations import errors, services
from operations.audit.state import state_verify
from operations.contracts import normalize_contract
from operations.models import Event, OutboxMessage
from tests.approvals.conftest import person
from tests.conftest import contract

GROUP = "Finance leads"


def _pending(api):
    api.tool(
        "refund",
        contract(
            "irreversible",
            approval={"mode": "always", "escalate_after_s": 3600, "escalate_to": GROUP},
        ),
    )
    op = api.register(api.run(principal="user:alice"), "refund")
    assert op["status"] == "awaiting_approval"
    return op


def _lead(**fields):
    user = person(email=f"lead{Group.objects.count()}@example.com", **fields)
    group, _ = Group.objects.get_or_create(name=GROUP)
    user.groups.add(group)
    return user


def _decide(op, user):
    return services.approval_decide(
        request_id=op["approval"]["id"], user=user, approve=True, comment="ok"
    )


def _later(seconds):
    return time_machine.travel(timezone.now() + timedelta(seconds=seconds), tick=False)


def test_before_the_time_the_group_cannot_decide_after_it_can(
    api, settings, django_capture_on_commit_callbacks
):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    api.post("/api/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/h", "events": ["approval.*"]})
    op = _pending(api)
    lead = _lead()
    alice = _lead(username="alice")  # the principal: barred, and not mailed
    with pytest.raises(PermissionRefused, match="permission to decide"):
        _decide(op, lead)
    with _later(3599):
        assert services.sweep().approvals_escalated == 0
    mail.outbox.clear()
    with _later(3601), django_capture_on_commit_callbacks(execute=True):
        assert services.sweep().approvals_escalated == 1
        assert services.sweep().approvals_escalated == 0
    # Audited on the operation, reported to webhooks, the group told by mail.
    event = Event.objects.get(stream=op["id"], kind="approval_escalated")
    assert event.data == {"approval": op["approval"]["id"], "group": GROUP}
    assert event.actor == "system:sweep"
    message = OutboxMessage.objects.get(event_type="approval.escalated")
    assert message.payload["data"]["approval"]["id"] == op["approval"]["id"]
    [sent] = mail.outbox
    assert sent.to == [lead.email]
    assert alice.email not in sent.to
    assert GROUP in sent.subject
    assert f"/approvals/{op['approval']['id']}/" in sent.body
    # Separation of duties still applies to the group's members.
    with pytest.raises(PermissionRefused, match="principal"):
        _decide(op, alice)
    _decide(op, lead)
    assert api.operation(op["id"])["status"] == "ready"
    assert api.claim(op["id"])["attempt"] == 1
    assert list(state_verify()) == []


def test_a_runner_subscribes_to_escalations_by_their_name(api, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    response = api.post(
        "/api/v1/webhook-endpoints",
        {"url": "http://127.0.0.1:9/h", "events": ["approval.escalated"]},
    )
    assert response.status_code == 201, response.json()
    assert response.json()["events"] == ["approval.escalated"]
    op = _pending(api)
    assert not OutboxMessage.objects.exists()  # awaiting_approval is not subscribed
    with _later(3601):
        assert services.sweep().approvals_escalated == 1
    [message] = OutboxMessage.objects.all()
    assert message.event_type == "approval.escalated"
    assert message.payload["data"]["approval"]["id"] == op["approval"]["id"]


def test_a_grant_from_the_group_dies_with_the_membership(api):
    op = _pending(api)
    lead = _lead()
    with _later(3601):
        services.sweep()
    _decide(op, lead)
    lead.groups.clear()
    assert api.claim(op["id"], expect=403)["code"] == "grant_invalid"


def test_the_group_sees_it_in_the_inbox_only_once_escalated(api):
    op = _pending(api)
    lead = _lead()
    client = Client()
    client.force_login(lead)
    assert op["id"] not in client.get("/").content.decode()
    assert client.get(f"/approvals/{op['approval']['id']}/").status_code == 404
    with _later(3601):
        services.sweep()
    assert op["id"] in client.get("/").content.decode()
    page = client.get(f"/approvals/{op['approval']['id']}/").content.decode()
    assert f"offered to {GROUP}" in page


def test_a_decided_request_is_not_escalated(api):
    op = _pending(api)
    _decide(op, person(decide_on="refund"))
    with _later(3601):
        assert services.sweep().approvals_escalated == 0
    assert not Event.objects.filter(kind="approval_escalated").exists()


def test_the_contract_needs_both_and_another_group_is_a_weakening(api):
    half = contract("irreversible", approval={"mode": "always", "escalate_after_s": 60})
    with pytest.raises(errors.InvalidContract, match="not consistent"):
        normalize_contract(half)
    _pending(api)
    other = contract(
        "irreversible",
        approval={"mode": "always", "escalate_after_s": 3600, "escalate_to": "Everyone"},
    )
    answer = api.tool("refund", other)
    assert answer["active"] is False
    assert "approval requests are offered to another group, or sooner" in answer["weakens"]
    # Later, to the same group, is stronger: it activates by itself.
    later = contract(
        "irreversible",
        approval={"mode": "always", "escalate_after_s": 7200, "escalate_to": GROUP},
    )
    assert api.tool("refund", later)["active"] is True


def test_a_group_member_may_edit_and_the_copy_stays_offered_to_the_group(api):
    api.tool(
        "refund",
        contract(
            "irreversible",
            approval={
                "mode": "always",
                "approvals_required": 2,
                "escalate_after_s": 3600,
                "escalate_to": GROUP,
                "editable": ["/amount_cents"],
            },
        ),
    )
    op = api.register(api.run(principal="user:alice"), "refund")
    lead, other_lead = _lead(), _lead()
    with _later(3601):
        services.sweep()
    successor = services.approval_decide(
        request_id=op["approval"]["id"],
        user=lead,
        approve=True,
        comment="",
        edits={"/amount_cents": 400},
    )
    copy = successor.approval_requests.get()
    assert copy.escalated_at is not None
    assert copy.escalate_to == GROUP
    # The second approval of the copy comes from the group too.
    services.approval_decide(request_id=copy.id, user=other_lead, approve=True, comment="")
    assert api.operation(successor.id)["status"] == "ready"
    assert list(state_verify()) == []


def test_the_audit_finds_a_forged_escalation(api):
    from approvals.models import ApprovalRequest

    op = _pending(api)
    ApprovalRequest.objects.filter(pk=op["approval"]["id"]).update(
        escalated_at=timezone.now(), escalate_to="Everyone"
    )
    # The escalation without its event, and the group its request was not opened with.
    assert sorted(p.problem for p in state_verify() if p.pk == op["approval"]["id"]) == [
        f"it is escalated, but no approval_escalated event in {op['id']} names it and its group",
        f'its escalate_to is "Everyone", but its approval_requested event opened it with "{GROUP}"',
    ]


def test_escalation_must_come_before_the_request_expires():
    late = contract(
        "irreversible",
        approval={
            "mode": "always",
            "request_ttl_s": 600,
            "escalate_after_s": 600,
            "escalate_to": GROUP,
        },
    )
    with pytest.raises(errors.InvalidContract) as refused:
        normalize_contract(late)
    assert refused.value.extra["errors"][0]["path"] == "/approval/escalate_after_s"
