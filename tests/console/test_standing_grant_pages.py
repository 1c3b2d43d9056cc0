"""The console's standing grants: the form on the approval page, the list with what
each has left, a grant's page with its signatures and uses, signing and revoking,
refusals as messages. Rendered by Django's test client."""

from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals.models import ApprovalRequest, StandingGrant
from operations import services
from operations.models import Tool
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner

from .conftest import client_for

ARGS = {"payment_id": "pay_7", "amount_cents": 700}


def _messages(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


@pytest.fixture
def pending(api):
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    return api.register(api.run("user:alice"), "refund", ARGS)


@pytest.fixture
def ann(pending):
    return person(username="ann", decide_on="refund")


def _issue_form(**fields) -> dict[str, str]:
    form = {
        "pin-0-path": "/payment_id",
        "pin-0-op": "eq",
        "pin-0-value": '"pay_7"',
        "pin-1-path": "/amount_cents",
        "pin-1-op": "lte",
        "pin-1-value": "1000",
        "principal": "user:alice",
        "max_uses": "2",
        "valid_for": "2",
        "valid_unit": "hours",
    }
    form.update(fields)
    return form


def test_the_approval_page_offers_the_next_like_it_prefilled(pending, ann):
    html = client_for(ann).get(f"/approvals/{pending['approval']['id']}/").content.decode()
    assert "Approve this and the next ones like it" in html
    assert 'name="pin-0-path" id="pin-0-path" value="/payment_id"' in html
    assert 'value="&quot;pay_7&quot;"' in html
    assert 'name="pin-1-path" id="pin-1-path" value="/amount_cents"' in html
    assert 'name="principal" id="sg-principal" value="user:alice"' in html


def test_a_person_barred_from_deciding_is_not_offered_the_form(db):
    owner = person()
    api = make_runner(owner=owner)
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    assign_perm("operations.decide_tool", owner, Tool.objects.get(pk="refund"))
    op = api.register(api.run(), "refund", ARGS)
    html = client_for(owner).get(f"/approvals/{op['approval']['id']}/").content.decode()
    assert "Approve this and the next ones like it" not in html


def test_approve_and_issue_from_the_approval_page(api, pending, ann):
    client = client_for(ann)
    response = client.post(
        f"/approvals/{pending['approval']['id']}/approve-and-issue",
        _issue_form(comment="ticket 12"),
    )
    grant = StandingGrant.objects.get()
    assert response.status_code == 302
    assert response.url == f"/standing-grants/{grant.id}/"
    assert _messages(response) == [
        f"Approved refund {pending['id']} (it is ready); standing grant {grant.id} for the "
        "next 2 like it is active."
    ]
    assert ApprovalRequest.objects.get(pk=pending["approval"]["id"]).status == "approved"
    assert grant.pins == [
        {"path": "/payment_id", "op": "eq", "value": "pay_7"},
        {"path": "/amount_cents", "op": "lte", "value": 1000},
    ]
    assert (grant.principal, grant.max_uses, grant.status) == ("user:alice", 2, "active")
    assert timedelta(hours=1, minutes=59) < grant.expires_at - timezone.now() <= timedelta(hours=2)
    run = api.run("user:alice")
    assert api.register(run, "refund", {**ARGS, "amount_cents": 900})["status"] == "ready"
    assert api.register(run, "refund", {**ARGS, "amount_cents": 1001})["status"] == (
        "awaiting_approval"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"pin-0-value": "pay_7"}, "Pin /payment_id: the value is JSON"),
        ({"max_uses": "many"}, "Uses: 'many' is not a whole number."),
        ({"max_uses": "0"}, "the number of uses is a whole number from 1 to 100000."),
        ({"valid_for": ""}, "Say how long it is valid"),
        ({"pin-1-op": "lte", "pin-1-value": '"a lot"'}, "at most compares with a number"),
    ],
)
def test_a_refused_form_decides_nothing_and_says_why(pending, ann, fields, message):
    response = client_for(ann).post(
        f"/approvals/{pending['approval']['id']}/approve-and-issue", _issue_form(**fields)
    )
    assert response.url == f"/approvals/{pending['approval']['id']}/"
    [said] = _messages(response)
    assert said.startswith("Nothing was decided.")
    assert message in said
    assert ApprovalRequest.objects.get(pk=pending["approval"]["id"]).status == "pending"
    assert not StandingGrant.objects.exists()


def test_the_list_shows_uses_and_what_remains_and_a_grant_its_uses(api, pending, ann):
    client = client_for(ann)
    client.post("/standing-grants/issue", _issue_form(tool="refund", max_uses="3"))
    grant = StandingGrant.objects.get()
    used = api.register(api.run("user:alice"), "refund", ARGS)

    html = client.get("/standing-grants/").content.decode()
    assert f'href="/standing-grants/{grant.id}/"' in html
    assert '<td class="num">1 of 3</td>' in html
    assert '<td class="num">2</td>' in html  # left
    assert "/amount_cents at most 1000" in html
    assert 'href="/standing-grants/"' in html  # the navigation link
    page = client.get(f"/standing-grants/{grant.id}/").content.decode()
    assert f'href="/operations/{used["id"]}/"' in page
    assert f'href="/approvals/{used["approval"]["id"]}/"' in page
    assert "standing_grant_used" in page
    assert "Revoke standing grant" in page
    outsider = client_for(person())
    assert grant.id not in outsider.get("/standing-grants/").content.decode()
    assert outsider.get(f"/standing-grants/{grant.id}/").status_code == 404


def test_a_second_person_signs_on_the_grants_page(api):
    quorum = {"mode": "always", "approvals_required": 2}
    api.tool("refund", contract("irreversible", approval=quorum))
    ann, bob = person(decide_on="refund"), person(decide_on="refund")
    response = client_for(ann).post("/standing-grants/issue", _issue_form(tool="refund"))
    grant = StandingGrant.objects.get()
    assert grant.status == "proposed"
    assert "it covers nothing until 1 more person signs it" in _messages(response)[0]
    own = client_for(ann).get(f"/standing-grants/{grant.id}/").content.decode()
    assert "You have already signed this standing grant" in own
    assert "Sign standing grant</button>" not in own
    page = client_for(bob).get(f"/standing-grants/{grant.id}/").content.decode()
    assert "Sign standing grant</button>" in page
    response = client_for(bob).post(f"/standing-grants/{grant.id}/sign")
    grant.refresh_from_db()
    assert grant.status == "active"
    assert _messages(response)[0].startswith(f"Standing grant {grant.id} is active")


def test_revoking_from_the_grants_page(api, pending, ann):
    services.standing_grant_issue(
        services.StandingTerms(
            tool="refund", max_uses=2, expires_at=timezone.now() + timedelta(hours=1)
        ),
        user=ann,
    )
    grant = StandingGrant.objects.get()
    client = client_for(ann)
    response = client.post(f"/standing-grants/{grant.id}/revoke", {"reason": ""})
    assert _messages(response) == ["Say why the standing grant is revoked."]
    client.get(f"/standing-grants/{grant.id}/")  # shows, and so clears, the refusal
    response = client.post(f"/standing-grants/{grant.id}/revoke", {"reason": "paused"})
    assert _messages(response)[0].startswith(f"Standing grant {grant.id} revoked")
    grant.refresh_from_db()
    assert grant.status == "revoked"
    page = client.get(f"/standing-grants/{grant.id}/").content.decode()
    assert "Revoke standing grant</button>" not in page
    response = client_for(person()).post(f"/standing-grants/{grant.id}/revoke", {"reason": "again"})
    assert response.status_code == 404


def test_a_refused_issue_is_a_message(pending, ann):
    response = client_for(ann).post(
        "/standing-grants/issue", _issue_form(tool="refund", principal="user:ann")
    )
    assert response.url == "/standing-grants/"
    assert _messages(response) == [
        "No standing grant was issued. You cannot sign a standing grant for this tool: you own "
        "a runner that may invoke it, or you are the principal it covers."
    ]
    assert not StandingGrant.objects.exists()


def test_an_approval_given_by_a_standing_grant_links_to_it(api, pending, ann):
    grant = services.standing_grant_issue(
        services.StandingTerms(
            tool="refund", max_uses=2, expires_at=timezone.now() + timedelta(hours=1)
        ),
        user=ann,
    )
    op = api.register(api.run("user:alice"), "refund", ARGS)
    html = client_for(ann).get(f"/approvals/{op['approval']['id']}/").content.decode()
    assert f'href="/standing-grants/{grant.id}/"' in html
    assert f"Approved by standing grant {grant.id}" in html
