"""Issue 29, item 6: support answers unknown outcomes from the keyboard. ``h`` chooses
"It happened" and focuses the reference; Enter records it and the next unknown outcome
of the queue opens."""

import re

import pytest
from django.contrib.auth import get_user_model
from guardian.shortcuts import assign_perm
from playwright.sync_api import expect

from operations.models import Tool
from tests.conftest import contract, make_runner

from .conftest import axe, axe_summary, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"


def test_support_answers_two_unknown_outcomes_with_keys(page):
    api = make_runner()
    api.tool(
        "payout",
        contract("irreversible", approval={"mode": "never"}, reconcile={"mode": "manual"}),
    )
    unknown = []
    for index in range(2):
        op = api.register(api.run(), "payout", {"payment_id": f"pay_{index}", "amount_cents": 5})
        api.claim(op["id"])
        api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout"})
        unknown.append(op)
    user = get_user_model().objects.create_user("sue", password=PASSWORD)
    assign_perm("operations.reconcile_tool", user, Tool.objects.get(pk="payout"))
    login(page, user, PASSWORD)
    page.goto("/reconciliation/")
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(f"/operations/{unknown[0]['id']}/"))
    violations = axe(page)
    assert not violations, axe_summary(violations)
    for index, op in enumerate(unknown):
        page.keyboard.press("h")
        expect(page.get_by_role("radio", name="It happened")).to_be_checked()
        expect(page.get_by_label("Downstream reference")).to_be_focused()
        page.keyboard.type(f"po_{index}")
        with page.expect_navigation():
            page.keyboard.press("Enter")
        body = api.operation(op["id"])
        assert (body["status"], body["downstream_id"]) == ("succeeded", f"po_{index}")
        status = page.get_by_role("status").first
        if index == 0:
            # The next unknown outcome opens, and the page says so.
            expect(page).to_have_url(re.compile(f"/operations/{unknown[1]['id']}/"))
            expect(status).to_contain_text("The next unknown outcome in the queue is open")
        else:
            # None is left: the answered operation's own page stays.
            expect(page).to_have_url(re.compile(f"/operations/{op['id']}/"))
            expect(status).to_contain_text("Recorded. The operation is succeeded.")
            expect(status).not_to_contain_text("next unknown outcome")
