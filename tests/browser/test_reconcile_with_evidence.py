"""Issue 29, reconciliation with evidence, in a real browser at a laptop's and a phone's
size: a support person finds an unknown refund by who and how much, reads why in words,
sees what was sent and the provider's console link, records "did not happen" (a refusal
keeps the choice and the typed evidence); a second person follows "1 to confirm" to the
filtered queue and confirms with the one form shown. Axe-clean at every step."""

import re
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import get_user_model
from guardian.shortcuts import assign_perm
from playwright.sync_api import Page, expect

from operations.models import Operation, Tool
from tests.conftest import contract, make_runner

from .conftest import axe, axe_summary, login, signed_in_page

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"
SIZES = {"laptop": (1366, 768), "phone": (390, 844)}


def _open_menu(page) -> None:
    """On a phone the navigation is folded behind "Menu": open it."""
    menu = page.get_by_role("button", name="Menu")
    if menu.is_visible():
        menu.click()


def _support(name: str):
    user = get_user_model().objects.create_user(name, password=PASSWORD)
    assign_perm("operations.reconcile_tool", user, Tool.objects.get(pk="send_refund"))
    return user


def _unknown_refund() -> tuple[dict, object]:
    api = make_runner()
    api.tool(
        "send_refund",
        contract(
            "irreversible",
            approval={"mode": "never"},
            reconcile={
                "mode": "manual",
                "console_url": "https://pay.example.com/refunds?idempotency_key={idempotency_key}",
            },
            display={
                "summary": "Refund {/amount_cents} to payment {/payment_id}",
                "fields": {
                    "/amount_cents": {"format": "money", "currency": "EUR", "minor_units": True}
                },
            },
        ),
    )
    op = api.register(
        api.run(principal="user:cus_2024"),
        "send_refund",
        {"payment_id": "pay_9002", "amount_cents": 8000},
    )
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "connection_reset"})
    return op, api


def _axe_clean(page: Page) -> None:
    """No serious accessibility violation, and nothing wider than the screen."""
    violations = axe(page)
    assert not violations, axe_summary(violations)
    width = page.viewport_size["width"] if page.viewport_size else 0
    assert page.evaluate("document.documentElement.scrollWidth") <= width


@pytest.mark.parametrize("size", SIZES)
def test_support_resolves_with_evidence_and_a_second_person_confirms(
    page, browser, live_server, size
):
    width, height = SIZES[size]
    page.set_viewport_size({"width": width, "height": height})
    op, api = _unknown_refund()
    sam, tia = _support("sam"), _support("tia")
    login(page, sam, PASSWORD)  # support lands on the queue

    row = page.locator("#queue-rows tr", has_text=op["id"])
    expect(row).to_contain_text("Refund €80.00 to payment pay_9002")
    expect(row).to_contain_text("user:cus_2024")
    expect(row).to_contain_text("€80.00")
    expect(row).to_contain_text("The connection was reset before an answer came")
    _open_menu(page)
    expect(page.get_by_role("link", name=re.compile(r"^Reconciliation"))).to_contain_text("1")
    expect(page.get_by_role("link", name=re.compile("^Unknown and compensating"))).to_contain_text(
        "1"
    )
    _axe_clean(page)

    row.get_by_role("link", name="Refund €80.00 to payment pay_9002").click()
    sent = page.locator("section[aria-labelledby=sent]")
    expect(sent).to_contain_text(op["idempotency_key"])
    expect(sent).to_contain_text("pay_9002")
    expect(sent).to_contain_text("The connection was reset before an answer came")
    link = page.locator("section[aria-labelledby=resolve]").get_by_role(
        "link", name="Open in pay.example.com (opens in a new tab)"
    )
    expect(link).to_be_visible()
    expect(link).to_have_attribute("target", "_blank")
    expect(link).to_have_attribute("rel", "noopener noreferrer")
    href = urlsplit(link.get_attribute("href") or "")
    assert (href.scheme, href.netloc, href.path) == ("https", "pay.example.com", "/refunds")
    assert parse_qs(href.query) == {"idempotency_key": [op["idempotency_key"]]}
    _axe_clean(page)

    # "Did not happen" needs a note: refused, with the choice and the reference kept.
    page.get_by_label("It did not happen").check()
    page.get_by_label("Downstream reference").fill("none found")
    page.get_by_role("button", name="Record answer").click()
    expect(page.get_by_role("alert").filter(has_text="Say how you know")).to_be_visible()
    expect(page.get_by_label("It did not happen")).to_be_checked()
    expect(page.get_by_label("Downstream reference")).to_have_value("none found")
    _axe_clean(page)
    page.get_by_label("Evidence note").fill("No refund with this key at pay.example.com")
    page.get_by_role("button", name="Record answer").click()
    expect(page.get_by_role("status").first).to_contain_text("A second person must confirm")
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"

    # The second person: "1 to confirm" opens the queue of what waits for them.
    other = signed_in_page(browser, live_server, tia, PASSWORD)
    other.set_viewport_size({"width": width, "height": height})
    _open_menu(other)
    other.get_by_role("link", name=re.compile("^1 to confirm")).click()
    other.wait_for_url(re.compile(r"/reconciliation/\?queue=to_confirm$"))
    expect(
        other.get_by_role("link", name=re.compile("^Waiting for your confirmation"))
    ).to_have_attribute("aria-current", "page")
    expect(other.locator("#queue-rows tr[data-key]")).to_have_count(1)
    _axe_clean(other)
    other.locator("#queue-rows").get_by_role("link", name=re.compile("^Refund")).click()
    # One answer form at a time: the confirmation, the other answers folded away.
    expect(other.get_by_role("button", name="Confirm: it did not happen")).to_be_visible()
    expect(other.get_by_role("button", name="Record answer")).to_be_hidden()
    expect(other.get_by_text("Found other evidence? Record a different answer")).to_be_visible()
    _axe_clean(other)
    other.get_by_label("Your note (required to dispute)").fill("Checked the provider too")
    other.get_by_role("button", name="Confirm: it did not happen").click()
    expect(other.get_by_role("status").first).to_contain_text("awaiting_approval")
    assert api.operation(op["id"])["status"] == "awaiting_approval"

    # The answer is a card, and the attempt row says how it was settled.
    answers = other.locator("section[aria-labelledby=probes]")
    expect(answers).to_contain_text("It did not happen")
    expect(answers).to_contain_text("No refund with this key at pay.example.com")
    expect(answers).to_contain_text("Checked the provider too")
    attempt = other.locator("section[aria-labelledby=attempts] tbody tr").first
    expect(attempt).to_contain_text("unknown → it did not happen by tia")
    _axe_clean(other)
    other.context.close()
