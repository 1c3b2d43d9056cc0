"""Issue 29, items 1 and 2: the decision from one screen, on a laptop and on a phone.

At 1366x768 and at 390x844 (a phone: touch, no hover) the approval page shows what will
happen, the amount with its currency, for whom, the agent's reason, why a person is
asked in words, the risk signals, and Approve / Reject, all inside the first viewport,
with the identifiers folded below; axe finds nothing serious. On the phone the inbox
shows at least four requests per screen, the navigation folds behind "Menu" and no
keyboard hints show.
"""

from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from guardian.shortcuts import assign_perm
from playwright.sync_api import Browser, Page, expect

from operations.models import Tool
from tests.conftest import EUR_CENTS, contract, make_runner

from .conftest import axe, axe_summary, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"
SCREENS = {
    "laptop": {"viewport": {"width": 1366, "height": 768}},
    "phone": {"viewport": {"width": 390, "height": 844}, "has_touch": True, "is_mobile": True},
}
RULES = {"mode": "rules", "rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}]}
DISPLAY = {
    "summary": "Refund {/amount_cents} to payment {/payment_id}",
    "fields": {"/amount_cents": EUR_CENTS},
}


@pytest.fixture(params=list(SCREENS))
def screen(request, browser: Browser, live_server) -> Iterator[tuple[str, Page]]:
    context = browser.new_context(base_url=live_server.url, **SCREENS[request.param])
    context.set_default_timeout(10_000)
    yield request.param, context.new_page()
    context.close()


def _approver():
    user = get_user_model().objects.create_user("rae", password=PASSWORD)
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk="send_refund"))
    return user


def _world():
    """A run whose earlier refund's outcome is unknown, then a large refund that needs a
    person, with the agent's reason among its arguments."""
    api = make_runner()
    api.tool(
        "send_refund",
        {
            **contract(
                "irreversible",
                approval=RULES,
                input_schema={
                    "type": "object",
                    "required": ["payment_id", "amount_cents"],
                    "properties": {
                        "payment_id": {"type": "string"},
                        "amount_cents": {"type": "integer", "minimum": 1},
                        "reason": {"type": "string", "maxLength": 500},
                    },
                    "additionalProperties": False,
                },
            ),
            "display": DISPLAY,
        },
    )
    run = api.run(principal="user:cus_2024")
    earlier = api.register(run, "send_refund", {"payment_id": "pay_1", "amount_cents": 8000})
    api.claim(earlier["id"])
    api.outcome(earlier["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    big = api.register(
        run,
        "send_refund",
        {"payment_id": "pay_2", "amount_cents": 75000, "reason": "order never arrived"},
    )
    return api, earlier, big


def _in_first_viewport(page: Page, locator) -> None:
    """Visible without scrolling: inside the viewport with the page at its top."""
    assert page.evaluate("window.scrollY") == 0
    expect(locator).to_be_visible()
    box = locator.bounding_box()
    height = page.viewport_size["height"]
    assert box is not None, f"{locator} has no box"
    assert box["y"] >= 0, f"{locator} is at {box}, above the viewport"
    assert box["y"] + box["height"] <= height, f"{locator} is at {box}: below {height} px"


def test_the_decision_and_its_facts_are_in_the_first_viewport(screen):
    name, page = screen
    api, earlier, big = _world()
    login(page, _approver(), PASSWORD)
    page.goto(f"/approvals/{big['approval']['id']}/")
    brief = page.locator(".brief")
    facts = {
        "what will happen": page.get_by_role("heading", level=1),
        "amount": brief.locator("dd.amount"),
        "for whom": brief.get_by_text("user:cus_2024"),
        "the agent's reason": brief.get_by_text("order never arrived"),
        "why, in words": brief.get_by_text("Amount over €500.00"),
        "the run's unknown refund": page.locator(".signal-bad"),
        "approve": page.get_by_role("button", name="Approve", exact=True),
        "reject": page.get_by_role("button", name="Reject", exact=True),
    }
    expect(facts["what will happen"]).to_have_text("Refund €750.00 to payment pay_2")
    expect(facts["amount"]).to_have_text("€750.00")
    expect(facts["the run's unknown refund"]).to_contain_text("still outcome unknown")
    expect(facts["the run's unknown refund"]).to_contain_text("Refund €80.00 to payment pay_1")
    for locator in facts.values():
        _in_first_viewport(page, locator)
    # Identifiers and hashes are folded below the decision.
    expect(page.get_by_text(big["intent_hash"], exact=True)).to_be_hidden()
    expect(page.get_by_text(big["idempotency_key"], exact=True)).to_be_hidden()
    violations = axe(page)
    assert not violations, f"{name}: {axe_summary(violations)}"
    if name == "phone":
        expect(page.locator("#decide-keys")).to_be_hidden()
    else:
        expect(page.locator("#decide-keys")).to_be_visible()
    facts["approve"].click()
    page.wait_for_url(lambda url: "/approvals/" not in url)
    assert api.operation(big["id"])["status"] == "ready"
    assert api.operation(earlier["id"])["status"] == "outcome_unknown"


def test_a_phone_shows_four_requests_a_screen_and_folds_the_navigation(screen):
    name, page = screen
    api, _, _ = _world()
    run = api.run(principal="user:cus_3000")
    for index in range(5):
        api.register(
            run,
            "send_refund",
            {
                "payment_id": f"pay_{10 + index}",
                "amount_cents": 60000 + index,
                "reason": "the parcel came back damaged and the customer wants the money back",
            },
        )
    login(page, _approver(), PASSWORD)
    rows = page.locator("#inbox-rows tr")
    expect(rows).to_have_count(6)
    menu = page.get_by_role("button", name="Menu")
    nav = page.get_by_role("navigation", name="Console")
    if name == "phone":
        expect(menu).to_be_visible()
        expect(nav).to_be_hidden()
        expect(page.locator("#inbox-keys")).to_be_hidden()
        # At least four requests on the first screen, below the header and the filters.
        fourth = rows.nth(3).bounding_box()
        assert fourth["y"] + fourth["height"] <= page.viewport_size["height"], fourth
        # The header takes one short row.
        header = page.locator("header.topbar").bounding_box()
        assert header["height"] <= 60, header
        menu.click()
        expect(menu).to_have_attribute("aria-expanded", "true")
        expect(nav).to_be_visible()
        nav.get_by_role("link", name="Reconciliation").click()
        page.wait_for_url("**/reconciliation/")
    else:
        expect(menu).to_be_hidden()
        expect(nav).to_be_visible()
        expect(page.locator("#inbox-keys")).to_be_visible()
    violations = axe(page)
    assert not violations, f"{name}: {axe_summary(violations)}"
