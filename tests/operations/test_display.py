"""What an operation will do, in words: the contract's ``display`` (issue 15, item 1)."""

import pytest

from operations.display import summary
from operations.models import Tool
from tests.conftest import contract

REFUND = {
    "summary": "Refund {/amount_cents} to {/payment_id}",
    "fields": {
        "/amount_cents": {
            "label": "Amount",
            "format": "money",
            "currency": "EUR",
            "minor_units": True,
        }
    },
}


def _contract(display=None, properties=None):
    body = {"input_schema": {"type": "object", "properties": properties or {}}}
    if display is not None:
        body["display"] = display
    return body


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ({"format": "money", "currency": "EUR", "minor_units": True}, 75000, "€750.00"),
        ({"format": "money", "currency": "USD"}, 1234.5, "$1,234.50"),
        ({"format": "money", "currency": "JPY", "minor_units": True}, 1500, "¥1,500"),
        ({"format": "money", "currency": "SEK", "minor_units": True}, 995, "9.95 SEK"),
        ({"format": "datetime"}, "2026-11-30T18:05:00+01:00", "2026-11-30 17:05 UTC"),
        ({"format": "email"}, "ann@example.com", "ann@example.com"),
        ({"format": "url"}, "https://evil.example/x", "https://evil.example/x"),
        ({}, "hmac-sha256:k1:abcd", "(sensitive)"),
        ({}, True, "yes"),
    ],
)
def test_formats(field, value, shown):
    display = {"summary": "{/v}", "fields": {"/v": field}}
    assert summary(_contract(display), {"v": value}) == shown


def test_a_summary_fills_its_placeholders_and_marks_what_is_missing():
    assert summary(_contract(REFUND), {"payment_id": "pay_1", "amount_cents": 75000}) == (
        "Refund €750.00 to pay_1"
    )
    assert summary(_contract(REFUND), {"payment_id": "pay_1"}) == "Refund — to pay_1"


def test_without_display_the_schema_titles_name_the_arguments():
    properties = {"payment_id": {"title": "Payment"}, "amount_cents": {"type": "integer"}}
    arguments = {"payment_id": "pay_1", "amount_cents": 500}
    assert summary(_contract(properties=properties), arguments) == (
        "Payment: pay_1, amount_cents: 500"
    )


@pytest.mark.parametrize(
    ("display", "path"),
    [
        ({"summary": "Refund {amount}"}, "/display/summary"),
        (
            {"summary": "x", "fields": {"/amount_cents": {"format": "money"}}},
            "/display/fields/~1amount_cents",
        ),
        ({"summary": "x", "fields": {"amount": {"label": "A"}}}, "/display/fields"),
    ],
)
def test_a_display_that_cannot_be_shown_is_refused(api, display, path):
    response = api.put("/api/v1/tools/t", {**contract(), "display": display})
    assert response.status_code == 422, response.json()
    assert response.json()["code"] == "invalid_contract"
    assert any(error["path"].startswith(path) for error in response.json()["errors"])


def test_a_changed_display_waits_for_a_person_to_activate_it(api):
    """A summary can mislead as well as a weaker rule: a new display is not activated by
    the runner's registration alone."""
    first = api.tool("t", {**contract(), "display": REFUND})
    assert first["display"] == REFUND
    changed = {**REFUND, "summary": "Send a thank-you note to {/payment_id}"}
    response = api.put("/api/v1/tools/t", {**contract(), "display": changed})
    body = response.json()
    assert (body["version"], body["active_version"], body["active"]) == (2, 1, False)
    assert body["weakens"] == ["the display (the summary approvers read) changed"]
    assert Tool.objects.get(pk="t").active_version.number == 1
    # The active display again is no change: it activates by itself.
    same = api.put("/api/v1/tools/t", {**contract(), "display": REFUND}).json()
    assert (same["version"], same["active"], same["weakens"]) == (3, True, [])
