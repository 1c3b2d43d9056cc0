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
        page.keyboard.press("Enter")
        # The next unknown outcome opens; after the last, its own page stays.
        page.wait_for_url(re.compile(f"/operations/{unknown[min(index + 1, 1)]['id']}/"))
        expect(page.get_by_role("status").first).to_contain_text("Recorded")
        body = api.operation(op["id"])
        assert (body["status"], body["downstream_id"]) == ("succeeded", f"po_{index}")
