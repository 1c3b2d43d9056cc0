"""The main flows of issues 3 and 4 in a real browser against a live server.

An approver finds a pending operation in the inbox and approves it, after which the
runner's claim succeeds; a rejection's reason reaches the runner; a support person
resolves an unknown outcome with evidence and the runner sees the result.
"""

import re
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from guardian.shortcuts import assign_perm
from playwright.sync_api import expect

from operations import services
from operations.models import Tool
from tests.conftest import contract, make_runner

from .conftest import axe, axe_summary, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"


def _person(name: str, perm: str, tool: str):
    user = get_user_model().objects.create_user(name, password=PASSWORD)
    assign_perm(perm, user, Tool.objects.get(pk=tool))
    return user


def _pending(api):
    rules = {"mode": "rules", "rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}]}
    api.tool("send_refund", contract("irreversible", approval=rules))
    return api.register(api.run(), "send_refund", {"payment_id": "pay_77", "amount_cents": 75000})


def test_approver_approves_from_the_inbox_and_the_runner_claims(page):
    api = make_runner()
    op = _pending(api)
    approver = _person("ann", "operations.decide_tool", "send_refund")
    login(page, approver, PASSWORD)

    row = page.locator(f"#inbox-rows tr[data-operation='{op['id']}']")
    expect(row).to_be_visible()
    violations = axe(page)
    assert not violations, axe_summary(violations)
    # Keyboard: j selects the first row, Enter opens it.
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/approvals/apr_"))
    expect(page.locator(".eyebrow")).to_contain_text("send_refund")
    expect(page.get_by_role("heading", level=1)).to_contain_text("Payment id: pay_77")
    # Why, in words, up front; the intent hash and the recorded sentence folded below.
    expect(page.locator(".brief")).to_contain_text("Amount over 50,000 cents")
    expect(page.get_by_text(op["intent_hash"], exact=True)).to_be_hidden()
    page.locator("details.identifiers > summary").click()
    expect(page.get_by_text(op["intent_hash"], exact=True)).to_be_visible()
    expect(page.get_by_text("Rule matched: /amount_cents gt 50000.")).to_be_visible()
    violations = axe(page)
    assert not violations, axe_summary(violations)

    page.get_by_label("Comment").fill("Matches the support ticket")
    page.get_by_role("button", name="Approve").click()
    page.wait_for_url("**/")
    expect(page.get_by_role("status").first).to_contain_text("Approved send_refund")
    expect(page.locator(f"#inbox-rows tr[data-operation='{op['id']}']")).to_have_count(0)

    attempt = api.claim(op["id"])
    assert attempt["attempt"] == 1


def test_a_rejection_reason_reaches_the_runner(page):
    api = make_runner()
    op = _pending(api)
    login(page, _person("ben", "operations.decide_tool", "send_refund"), PASSWORD)
    page.goto(f"/approvals/{op['approval']['id']}/")
    page.get_by_label("Comment").fill("Duplicate of ticket 4411")
    page.get_by_role("button", name="Reject").click()
    page.wait_for_url("**/")
    body = api.operation(op["id"])
    assert body["status"] == "rejected"
    assert body["error_code"] == "approval_rejected"
    assert body["error_detail"] == "Duplicate of ticket 4411"


def test_support_resolves_an_unknown_outcome_with_evidence(page):
    api = make_runner()
    api.tool("send_refund", contract("irreversible", approval={"mode": "never"}))
    op = api.register(api.run(), "send_refund")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    login(page, _person("sam", "operations.reconcile_tool", "send_refund"), PASSWORD)

    page.get_by_role("link", name="Reconciliation").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("Reconciliation")
    violations = axe(page)
    assert not violations, axe_summary(violations)
    # The row leads with what the operation does; its id is beneath.
    row = page.locator("#queue-rows tr", has_text=op["id"])
    expect(row.get_by_role("link")).to_have_text("Payment id: pay_1, Amount: 500 cents")
    row.get_by_role("link").click()
    expect(page.get_by_text(op["idempotency_key"]).first).to_be_visible()
    violations = axe(page)
    assert not violations, axe_summary(violations)

    page.get_by_label("It happened (committed)").check()
    page.get_by_label("Downstream reference").fill("re_981")
    page.get_by_label("Evidence note").fill("Refund re_981 found in the provider dashboard")
    page.get_by_role("button", name="Record answer").click()
    expect(page.get_by_role("status").first).to_contain_text("The operation is succeeded")

    body = api.operation(op["id"])
    assert (body["status"], body["downstream_id"]) == ("succeeded", "re_981")


@pytest.mark.parametrize("width", [1440, 390])
def test_an_approver_decides_from_the_keyboard_and_goes_on_to_the_next_request(page, width):
    """a then Enter approves; the next request waiting for this person opens; r goes to
    the comment, to reject with a reason; after the last decision, the inbox."""
    page.set_viewport_size({"width": width, "height": 900})
    api = make_runner()
    first = _pending(api)
    second = api.register(api.run(), "send_refund", {"payment_id": "pay_78", "amount_cents": 80000})
    login(page, _person("cat", "operations.decide_tool", "send_refund"), PASSWORD)
    # Inbox order: the request that expires first; both were opened with the same TTL.
    page.goto(f"/approvals/{first['approval']['id']}/")
    expect(page.locator("#decide-keys")).to_contain_text("then Enter approves")
    violations = axe(page)
    assert not violations, axe_summary(violations)

    page.keyboard.press("a")
    expect(page.get_by_role("button", name="Approve")).to_be_focused()
    expect(page.locator("#decide-hint")).to_have_text("Press Enter to approve.")
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/approvals/{second['approval']['id']}/")
    expect(page.get_by_role("status").first).to_contain_text("Approved send_refund")
    assert api.operation(first["id"])["status"] == "ready"

    page.keyboard.press("r")
    expect(page.get_by_label("Comment")).to_be_focused()
    page.keyboard.type("Not this customer's payment")
    page.get_by_role("button", name="Reject").click()
    page.wait_for_url(lambda url: urlsplit(url).path == "/")  # none left: the inbox
    expect(page.get_by_role("status").first).to_contain_text("Rejected send_refund")
    body = api.operation(second["id"])
    assert body["status"] == "rejected"
    assert body["error_detail"] == "Not this customer's payment"


@pytest.mark.parametrize("width", [1440, 390])
def test_an_approver_selects_requests_with_x_and_approves_them_together(page, width):
    page.set_viewport_size({"width": width, "height": 900})
    api = make_runner()
    first = _pending(api)
    second = api.register(api.run(), "send_refund", {"payment_id": "pay_79", "amount_cents": 90000})
    login(page, _person("dan", "operations.decide_tool", "send_refund"), PASSWORD)
    expect(page.locator(f"#inbox-rows tr[data-operation='{second['id']}']")).to_be_visible()
    violations = axe(page)
    assert not violations, axe_summary(violations)
    bulk = page.locator("form[data-bulk]")
    # The bulk bar only while something is ticked, with the count, on screen.
    expect(bulk).to_be_hidden()
    page.keyboard.press("j")
    page.keyboard.press("x")
    expect(bulk).to_be_visible()
    expect(bulk).to_contain_text("1 selected")
    page.keyboard.press("j")
    page.keyboard.press("x")
    expect(bulk).to_contain_text("2 selected")
    expect(page.get_by_role("button", name="Approve selected")).to_be_in_viewport()
    boxes = [
        page.locator(f"#inbox-rows tr[data-operation='{op['id']}'] input[data-select]")
        for op in (first, second)
    ]
    for box in boxes:
        expect(box).to_be_checked()
    # A refused action (reject without a reason) keeps every tick.
    page.get_by_role("button", name="Reject selected").click()
    expect(page.get_by_role("alert").first).to_contain_text("Write why, to reject")
    for box in boxes:
        expect(box).to_be_checked()
    expect(bulk).to_contain_text("2 selected")
    assert api.operation(first["id"])["status"] == "awaiting_approval"
    # "a" focuses "Approve selected" once rows are ticked; Enter presses it.
    page.keyboard.press("a")
    expect(page.get_by_role("button", name="Approve selected")).to_be_focused()
    page.keyboard.press("Enter")
    page.wait_for_url(lambda url: urlsplit(url).path == "/")
    expect(page.get_by_role("status").first).to_contain_text("Approved 2")
    assert api.operation(first["id"])["status"] == "ready"
    assert api.operation(second["id"])["status"] == "ready"


def test_an_open_approval_page_notices_a_colleague_deciding_first(page):
    """Within 5 s the page says who decided and its buttons are disabled; the comment
    typed so far stays."""
    api = make_runner()
    op = _pending(api)
    login(page, _person("eve", "operations.decide_tool", "send_refund"), PASSWORD)
    colleague = _person("fay", "operations.decide_tool", "send_refund")
    page.goto(f"/approvals/{op['approval']['id']}/")
    page.get_by_label("Comment").fill("Looks fine to me")
    services.approval_decide(
        request_id=op["approval"]["id"], user=colleague, approve=True, comment="Checked"
    )
    expect(page.locator("#approval-live")).to_contain_text("fay approved", timeout=8000)
    expect(page.get_by_role("button", name="Approve")).to_be_disabled()
    expect(page.get_by_role("button", name="Reject")).to_be_disabled()
    expect(page.get_by_label("Comment")).to_have_value("Looks fine to me")
    violations = axe(page)
    assert not violations, axe_summary(violations)
