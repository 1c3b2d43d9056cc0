"""Standing grants in a real browser against a live server: two people issue one from
an approval page (a quorum of two), a runner uses it up through the API until the next
operation waits for a person, and a person revokes it, which the next claim obeys."""

import re

import pytest
from django.contrib.auth import get_user_model
from guardian.shortcuts import assign_perm
from playwright.sync_api import expect

from approvals.models import StandingGrant
from operations.models import Tool
from tests.conftest import contract, make_runner

from .conftest import axe, axe_summary, login, signed_in_page

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"


def _decider(name: str):
    user = get_user_model().objects.create_user(name, password=PASSWORD)
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk="send_refund"))
    return user


def test_issue_use_up_and_revoke_a_standing_grant(page, browser, live_server):
    api = make_runner()
    quorum = {"mode": "always", "approvals_required": 2}
    api.tool("send_refund", contract("irreversible", approval=quorum))
    run = api.run("user:alice")
    first = api.register(run, "send_refund", {"payment_id": "pay_77", "amount_cents": 750})
    ann, bob = _decider("ann"), _decider("bob")

    # Ann approves the operation and issues a grant for the next two like it, at most
    # 1000 cents each.
    login(page, ann, PASSWORD)
    page.goto(f"/approvals/{first['approval']['id']}/")
    page.get_by_text("Approve this and the next ones like it").click()
    expect(page.get_by_label("Pin 1: argument")).to_have_value("/payment_id")
    expect(page.get_by_label("Pin 1: value")).to_have_value('"pay_77"')
    expect(page.get_by_label("Pin 2: argument")).to_have_value("/amount_cents")
    expect(page.get_by_label("Principal")).to_have_value("user:alice")
    expect(page.get_by_label("People who must sign")).to_have_value("2")
    violations = axe(page)
    assert not violations, axe_summary(violations)
    page.get_by_label("Pin 2: must be").select_option("lte")
    page.get_by_label("Pin 2: value").fill("1000")
    page.get_by_label("Operations it approves").fill("2")
    page.get_by_role("button", name="Approve and issue standing grant").click()
    page.wait_for_url(re.compile(r"/standing-grants/sgr_"))
    grant = StandingGrant.objects.get()
    expect(page.get_by_role("status").first).to_contain_text(
        f"standing grant {grant.id} for the next 2 like it is proposed"
    )
    expect(page.get_by_role("heading", level=1)).to_contain_text("proposed")
    expect(page.get_by_text("You have already signed this standing grant")).to_be_visible()
    # Proposed, it covers nothing: this one waits for people.
    assert api.register(run, "send_refund", {"payment_id": "pay_77", "amount_cents": 10})[
        "status"
    ] == ("awaiting_approval")

    # Bob finds it in the navigation and signs: it takes effect.
    other = signed_in_page(browser, live_server, bob, PASSWORD)
    other.get_by_role("link", name="Standing grants").click()
    other.get_by_role("link", name=grant.id).click()
    violations = axe(other)
    assert not violations, axe_summary(violations)
    other.get_by_role("button", name="Sign standing grant").click()
    signed = other.get_by_role("status").first
    expect(signed).to_contain_text(f"Standing grant {grant.id} is active")
    expect(other.get_by_role("heading", level=1)).to_contain_text("active")

    # The runner uses it up: two operations ready at once, the third waits for a person.
    used = [
        api.register(run, "send_refund", {"payment_id": "pay_77", "amount_cents": amount})
        for amount in (500, 900)
    ]
    assert [op["status"] for op in used] == ["ready", "ready"]
    assert {op["approval"]["standing_grant"] for op in used} == {grant.id}
    assert api.claim(used[0]["id"])["attempt"] == 1
    waiting = api.register(run, "send_refund", {"payment_id": "pay_77", "amount_cents": 800})
    assert waiting["status"] == "awaiting_approval"

    other.get_by_role("link", name="Standing grants").click()
    row = other.locator("#standing-grants tr", has_text=grant.id)
    expect(row).to_contain_text("exhausted")
    expect(row).to_contain_text("2 of 2")
    violations = axe(other)
    assert not violations, axe_summary(violations)
    row.get_by_role("link", name=grant.id).click()
    uses = other.locator("#standing-uses")
    for op in used:
        expect(uses.get_by_role("link", name=op["id"])).to_be_visible()

    # Bob revokes it: the use not yet claimed is refused at its claim and asks again.
    other.get_by_label("Revoke the standing grant: why?").fill("Wrong payment batch")
    other.get_by_role("button", name="Revoke standing grant").click()
    expect(other.get_by_role("status").first).to_contain_text(f"Standing grant {grant.id} revoked")
    expect(other.get_by_role("heading", level=1)).to_contain_text("revoked")
    refused = api.claim(used[1]["id"], expect=403)
    assert refused["code"] == "grant_invalid"
    assert api.operation(used[1]["id"])["status"] == "awaiting_approval"
    other.context.close()
