"""The rest of the console in a real browser: every page as the right person, in both
colour schemes, with axe-core; the header search; cancel and activate; and a person
without permission for a tool seeing nothing of it anywhere."""

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from guardian.shortcuts import assign_perm
from playwright.sync_api import Page, expect

from operations.models import Operation, Run, Tool
from tests.conftest import contract, make_runner

from .conftest import axe, axe_summary, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"


@pytest.fixture
def demo(db, settings):
    """The data `make run` seeds, and its demo people (console/management/commands).

    Seeding takes seconds, so each test that needs it walks several pages.
    """
    call_command("seed_demo", stdout=io.StringIO())


def accessible(page: Page, heading: str) -> None:
    expect(page.get_by_role("heading", level=1)).to_contain_text(heading)
    violations = axe(page)
    assert not violations, f"{page.url}\n{axe_summary(violations)}"


def nav(page: Page, name: str) -> None:
    page.get_by_role("navigation", name="Console").get_by_role("link", name=name).click()
    page.wait_for_load_state()


def operator_walk(page: Page) -> None:
    login(page, "operator", "operator-demo")

    nav(page, "Operations")
    accessible(page, "Operations")
    page.get_by_label("State").select_option("outcome_unknown")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("#operations tbody tr")
    expect(rows).to_have_count(2)
    # The keys work once console.js (deferred) has run: wait for the page's load.
    page.wait_for_load_state()
    page.keyboard.press("j")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/operations/op_"))
    accessible(page, "send_refund")

    nav(page, "Runs")
    accessible(page, "Runs")
    page.locator("#runs tbody tr").first.get_by_role("link").first.click()
    page.wait_for_url(re.compile(r"/runs/run_"))
    accessible(page, "Run")
    expect(page.get_by_role("heading", name="Budgets used")).to_be_visible()
    expect(page.get_by_role("button", name="Cancel run")).to_be_visible()

    nav(page, "Tools")
    accessible(page, "Tools")
    page.get_by_role("link", name="send_refund").click()
    accessible(page, "send_refund")
    expect(page.get_by_text("longer grant_ttl_s").first).to_be_visible()

    nav(page, "Audit log")
    accessible(page, "Audit log")
    page.get_by_label("Action").fill("decision")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#audit tbody tr").first).to_contain_text("decision")

    nav(page, "Dashboard")
    accessible(page, "Dashboard")
    expect(page.get_by_role("heading", name="Money at stake")).to_be_visible()

    nav(page, "Reconciliation")
    accessible(page, "Reconciliation")

    page.goto("/search/?q=nothing-like-this")
    accessible(page, "Search")


def approver_walk(page: Page) -> None:
    login(page, "approver", "approver-demo")
    accessible(page, "Inbox")
    expect(page.locator("#inbox-rows tr")).to_have_count(3)
    page.locator("#inbox-rows tr").first.get_by_role("link").first.click()
    page.wait_for_url(re.compile(r"/approvals/apr_"))
    violations = axe(page)
    assert not violations, axe_summary(violations)


def test_every_page_as_the_right_person_in_both_schemes(page, demo):
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        operator_walk(page)
        page.context.clear_cookies()
        approver_walk(page)
        page.context.clear_cookies()


def test_search_cancel_activate_and_live_dashboard(page, demo):
    header_search(page)
    page.context.clear_cookies()
    cancel_and_activate(page)
    dashboard_refreshes_itself(page)


def header_search(page: Page) -> None:
    op = Operation.objects.filter(status="outcome_unknown").order_by("id").first()
    login(page, "support", "support-demo")
    page.locator("h1").click()
    page.keyboard.press("/")
    search = page.get_by_role("search").get_by_label("Search")
    expect(search).to_be_focused()
    search.fill(op.idempotency_key)
    search.press("Enter")
    page.wait_for_url(f"**/operations/{op.id}/")
    expect(page.get_by_text(op.idempotency_key).first).to_be_visible()


def cancel_and_activate(page: Page) -> None:
    run = Run.objects.filter(status="active", operations__status="ready").first()
    login(page, "operator", "operator-demo")
    page.goto(f"/runs/{run.id}/")
    page.get_by_role("button", name="Cancel run").click()
    expect(page.get_by_role("status").first).to_contain_text(f"Run {run.id} cancelled")
    run.refresh_from_db()
    assert run.status == "cancelled"

    page.goto("/tools/send_refund/")
    page.get_by_role("button", name="Activate v2").click()
    expect(page.get_by_role("status").first).to_contain_text("send_refund v2 is now the active")
    assert Tool.objects.get(pk="send_refund").active_version.number == 2


def dashboard_refreshes_itself(page: Page) -> None:
    page.goto("/dashboard/")
    with page.expect_response(re.compile(r"/dashboard/\?partial=1")) as response:
        page.evaluate("htmx.trigger('#dashboard-panels', 'refresh')")
    assert response.value.status == 200
    expect(page.locator("#dashboard-panels")).to_be_visible()
    violations = axe(page)
    assert not violations, axe_summary(violations)


def test_a_person_sees_nothing_of_a_tool_they_hold_no_permission_for(page):
    api = make_runner()
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    api.tool("wipe_disk", contract("irreversible", approval={"mode": "always"}))
    shared_run = api.run("user:alice")
    visible = api.register(shared_run, "refund")
    hidden_run = api.run("user:bob")
    hidden = api.register(hidden_run, "wipe_disk")
    hidden_in_shared = api.register(shared_run, "wipe_disk")
    user = get_user_model().objects.create_user("vera", password=PASSWORD)
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk="refund"))
    login(page, user, PASSWORD)

    # It awaits approval, on a tool this person may not see.
    expect(page.locator(f"#inbox-rows tr[data-operation='{hidden['id']}']")).to_have_count(0)
    expect(page.locator("#inbox-rows")).not_to_contain_text("wipe_disk")

    page.goto("/operations/")
    table = page.locator("#operations")
    expect(table).to_contain_text(visible["id"])
    expect(table).not_to_contain_text(hidden["id"])
    expect(table).not_to_contain_text(hidden_in_shared["id"])
    expect(page.get_by_label("Tool").locator("option")).to_have_text(["any", "refund"])

    search = page.get_by_role("search").get_by_label("Search")
    search.fill(hidden["idempotency_key"])
    search.press("Enter")
    expect(page.get_by_text("No operation you may see matches.")).to_be_visible()
    assert page.goto(f"/operations/{hidden['id']}/").status == 404

    page.goto("/runs/")
    expect(page.locator("#runs")).to_contain_text(shared_run)
    expect(page.locator("#runs")).not_to_contain_text(hidden_run)
    page.goto(f"/runs/{shared_run}/")
    expect(page.locator("#run-operations")).not_to_contain_text(hidden_in_shared["id"])

    page.goto("/tools/")
    expect(page.locator("#tools")).not_to_contain_text("wipe_disk")
    assert page.goto("/tools/wipe_disk/").status == 404

    page.goto("/audit/")
    expect(page.locator("#audit")).to_contain_text(visible["id"])
    expect(page.locator("#audit")).not_to_contain_text("wipe_disk")
    expect(page.locator("#audit")).not_to_contain_text(hidden["id"])

    page.goto("/dashboard/")
    counts = page.locator("#states-h + p")
    expect(counts).to_contain_text("1 open now")  # the refund; both wipe_disk hidden
    expect(page.locator("#ages-h + p")).to_contain_text("0 waiting for a decision")


def test_at_390_px_no_page_scrolls_sideways_and_approve_stays_in_reach(page):
    """Phones: rows become cards (each value under its column's name), nothing is wider
    than the screen, and the approval page keeps Approve and Reject on screen."""
    api = make_runner()
    rules = {"mode": "rules", "rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}]}
    api.tool("send_refund", contract("irreversible", approval=rules))
    op = api.register(api.run(), "send_refund", {"payment_id": "pay_77", "amount_cents": 75000})
    unknown = api.register(api.run(), "send_refund", {"payment_id": "pay_78", "amount_cents": 5})
    api.claim(unknown["id"])
    api.outcome(unknown["id"], 1, {"kind": "unknown", "code": "timeout"})
    root = get_user_model().objects.create_superuser("root", "root@example.com", PASSWORD)
    page.set_viewport_size({"width": 390, "height": 800})
    login(page, root, PASSWORD)
    pages = [
        "/",
        f"/approvals/{op['approval']['id']}/",
        "/reconciliation/",
        "/operations/",
        f"/operations/{op['id']}/",
        f"/operations/{unknown['id']}/",
        "/runs/",
        "/tools/",
        "/tools/send_refund/",
        "/audit/",
        "/dashboard/",
        f"/search/?q={op['id']}",
    ]
    for path in pages:
        page.goto(path)
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{path} is {width} px wide"
        wide = page.evaluate(
            "Array.from(document.querySelectorAll('.table-wrap'))"
            ".filter(w => w.scrollWidth > w.clientWidth + 1).length"
        )
        assert wide == 0, f"{path}: a table scrolls sideways"
    page.goto("/")
    expect(page.locator("#inbox-rows td[data-label='For']").first).to_contain_text("user:alice")
    page.goto(f"/approvals/{op['approval']['id']}/")
    approve = page.get_by_role("button", name="Approve")
    expect(approve).to_be_in_viewport()
    expect(page.get_by_role("button", name="Reject")).to_be_in_viewport()
    violations = axe(page)
    assert not violations, axe_summary(violations)
