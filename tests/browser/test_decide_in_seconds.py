"""Issue 15's flows in a real browser, each as the person who does it, at 1440 and 390
px, axe-clean: editing before approving, an escalated request reaching its group,
search that finds with a saved view, and the operation page noticing a colleague."""

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils import timezone
from guardian.shortcuts import assign_perm
from playwright.sync_api import Page, expect

from operations import services
from operations.models import Operation, Tool
from tests.conftest import contract, make_runner

from .conftest import axe, axe_summary, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"
WIDTHS = [1440, 390]


def _person(name: str, perm: str | None = None, tool: str | None = None):
    user = get_user_model().objects.create_user(name, password=PASSWORD)
    if perm:
        assign_perm(perm, user, Tool.objects.get(pk=tool))
    return user


def _accessible(page: Page) -> None:
    violations = axe(page)
    assert not violations, axe_summary(violations)


def _no_sideways_scroll(page: Page) -> None:
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], f"scrolls sideways: {width}px"


@pytest.mark.parametrize("width", WIDTHS)
def test_an_approver_lowers_the_amount_and_the_edited_copy_runs(page, width):
    page.set_viewport_size({"width": width, "height": 900})
    api = make_runner()
    api.tool(
        "send_refund",
        contract(
            "irreversible",
            approval={"mode": "always", "editable": ["/amount_cents"]},
            display={
                "summary": "Refund {/amount_cents} to {/payment_id}",
                "fields": {
                    "/amount_cents": {
                        "label": "Amount",
                        "format": "money",
                        "currency": "EUR",
                        "minor_units": True,
                    }
                },
            },
        ),
    )
    op = api.register(api.run(), "send_refund", {"payment_id": "pay_9", "amount_cents": 75000})
    login(page, _person("gil", "operations.decide_tool", "send_refund"), PASSWORD)
    page.goto(f"/approvals/{op['approval']['id']}/")
    expect(page.locator("h1.lead")).to_contain_text("Refund €750.00 to pay_9")
    _accessible(page)
    _no_sideways_scroll(page)

    # The edit fields are folded under the decision; opening them shows the frozen value.
    page.locator("details.edits-toggle > summary").click()
    amount = page.get_by_label("Amount")
    expect(amount).to_have_value("75000")
    amount.fill("50000")
    page.get_by_label("Comment").fill("Capped at the policy limit")
    page.get_by_role("button", name="Approve").click()
    page.wait_for_url(lambda url: "/approvals/" not in url)
    successor = Operation.objects.get(previous_id=op["id"])
    expect(page.get_by_role("status").first).to_contain_text(f"with your changes as {successor.id}")

    body = api.operation(successor.id)
    assert (body["status"], body["arguments"]["amount_cents"]) == ("ready", 50000)
    assert api.claim(op["id"], expect=409)["successor"] == successor.id
    assert api.claim(successor.id)["attempt"] == 1

    # The original's page points at the copy; the copy's page shows what changed.
    page.goto(f"/operations/{op['id']}/")
    expect(page.locator("#operation-live")).to_contain_text(
        f"approved with changes as {successor.id}"
    )
    page.goto(f"/operations/{successor.id}/")
    expect(page.get_by_text("Edited copy of")).to_be_visible()
    _accessible(page)
    _no_sideways_scroll(page)


@pytest.mark.parametrize("width", WIDTHS)
def test_an_escalated_request_reaches_the_group_which_decides_it(page, width):
    page.set_viewport_size({"width": width, "height": 900})
    api = make_runner()
    api.tool(
        "send_refund",
        contract(
            "irreversible",
            approval={"mode": "always", "escalate_after_s": 3600, "escalate_to": "Finance leads"},
        ),
    )
    op = api.register(api.run(), "send_refund", {"payment_id": "pay_8", "amount_cents": 900})
    lead = _person("hal")
    lead.groups.add(Group.objects.create(name="Finance leads"))
    login(page, lead, PASSWORD)
    expect(page.locator(f"#inbox-rows tr[data-operation='{op['id']}']")).to_have_count(0)
    with time_machine.travel(timezone.now() + timedelta(seconds=3601), tick=False):
        assert services.sweep().approvals_escalated == 1
    page.goto("/")
    row = page.locator(f"#inbox-rows tr[data-operation='{op['id']}']")
    expect(row).to_be_visible()
    _accessible(page)
    _no_sideways_scroll(page)
    page.goto(f"/approvals/{op['approval']['id']}/")
    expect(page.locator("#approval-live")).to_contain_text("offered to Finance leads")
    page.keyboard.press("a")
    page.keyboard.press("Enter")
    expect(page.get_by_role("status").first).to_contain_text("Approved send_refund")
    assert api.operation(op["id"])["status"] == "ready"


@pytest.mark.parametrize("width", WIDTHS)
def test_support_finds_by_a_fragment_and_saves_the_view(page, width):
    page.set_viewport_size({"width": width, "height": 900})
    api = make_runner()
    api.tool("send_refund", contract("irreversible", approval={"mode": "never"}))
    run = api.run(principal="user:newcomer")
    wanted = api.register(
        run,
        "send_refund",
        {"payment_id": "pay_nc_unknown", "amount_cents": 5},
        operation_key="order-551",
    )
    other = api.register(api.run(principal="user:old"), "send_refund", operation_key="order-9")
    login(page, _person("ida", "operations.reconcile_tool", "send_refund"), PASSWORD)

    # The header search: a fragment of an argument value opens the one operation.
    page.goto("/operations/")
    page.keyboard.press("/")
    page.keyboard.type("pay_nc")
    page.keyboard.press("Enter")
    page.wait_for_url(f"**/operations/{wanted['id']}/")

    # The list: a fragment of the key and the principal, saved under a name.
    page.goto("/operations/")
    page.get_by_label("Contains").fill("order-5")
    page.get_by_label("Principal").fill("newcomer")
    page.get_by_role("button", name="Filter").click()
    table = page.locator("#operations")
    expect(table).to_contain_text(wanted["id"])
    expect(table).not_to_contain_text(other["id"])
    page.get_by_label("Save these filters as").fill("Newcomer orders")
    page.get_by_role("button", name="Save view").click()
    expect(page.get_by_role("status").first).to_contain_text("Saved the view")
    _accessible(page)
    _no_sideways_scroll(page)

    page.goto("/operations/")
    expect(page.locator("#operations")).to_contain_text(other["id"])
    page.get_by_role("link", name="Newcomer orders").click()
    expect(page.locator("#operations")).not_to_contain_text(other["id"])
    expect(page.locator("#operations")).to_contain_text(wanted["id"])


@pytest.mark.parametrize("width", WIDTHS)
def test_an_open_operation_page_notices_a_colleague_answering_first(page, width):
    page.set_viewport_size({"width": width, "height": 900})
    api = make_runner()
    api.tool("send_refund", contract("irreversible", approval={"mode": "never"}))
    op = api.register(api.run(), "send_refund")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout"})
    login(page, _person("jo", "operations.reconcile_tool", "send_refund"), PASSWORD)
    colleague = _person("kim", "operations.reconcile_tool", "send_refund")
    page.goto(f"/operations/{op['id']}/")
    record = page.get_by_role("button", name="Record answer")
    expect(record).to_be_enabled()
    services.operation_resolve(
        operation=Operation.objects.get(pk=op["id"]),
        user=colleague,
        result="committed",
        downstream_id="re_1",
        note="found it in the provider dashboard",
    )
    expect(page.locator("#operation-changed")).to_be_visible(timeout=8000)
    expect(page.locator("#operation-live")).to_contain_text("by user:kim")
    expect(record).to_be_disabled()
    _accessible(page)
    _no_sideways_scroll(page)
