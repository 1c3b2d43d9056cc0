"""What an operation will do, in words: the contract's ``display`` (issue 15, item 1)."""

import pytest

from operations.contracts.display import summary
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
        "Payment: pay_1, Amount: 500 cents"
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


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        # Whatever a runner sends, formatting neither fails nor grows nor rounds.
        ({"format": "datetime"}, "0001-01-01T00:00:00+01:00", "0001-01-01T00:00:00+01:00"),
        ({"format": "money", "currency": "EUR", "minor_units": True}, "sNaN", "sNaN"),
        ({"format": "money", "currency": "EUR"}, "1e999999999", "1e999999999"),
        ({"format": "money", "currency": "EUR"}, "750.005", "€750.005"),
        ({"format": "money", "currency": "EUR"}, "1_000", "1_000"),
        ({"format": "money", "currency": "EUR"}, "12\n", "12\n"),
        ({"format": "money", "currency": "EUR"}, "\u0661\u0662\u0663", "\u0661\u0662\u0663"),
        ({"format": "money", "currency": "EUR", "minor_units": True}, -500, "-€5.00"),
        (
            {"format": "money", "currency": "EUR", "minor_units": True},
            123456789012345678901234567890123,
            "123456789012345678901234567890123",  # past 30 digits: shown as sent
        ),
        ({}, "x" * 500, "x" * 199 + "…"),
    ],
)
def test_any_value_is_shown_safely(field, value, shown):
    display = {"summary": "{/v}", "fields": {"/v": field}}
    assert summary(_contract(display), {"v": value}) == shown


def test_only_what_the_contract_marks_sensitive_is_hidden():
    """A runner cannot hide a value by making it look like a digest."""
    properties = {"payment_id": {"type": "string"}, "card": {"type": "string", "x-sensitive": True}}
    display = {"summary": "{/payment_id} {/card}"}
    arguments = {"payment_id": "hmac-sha256:k1:pay_real", "card": "hmac-sha256:k1:abcd"}
    assert summary(_contract(display, properties), arguments) == (
        "hmac-sha256:k1:pay_real (sensitive)"
    )


def test_the_fallback_puts_required_arguments_first():
    schema = {
        "type": "object",
        "required": ["payment_id", "amount_cents"],
        "properties": {"payment_id": {}, "amount_cents": {}},
    }
    arguments = {"a": 1, "b": 2, "c": 3, "d": 4, "amount_cents": 5, "payment_id": "p"}
    assert summary({"input_schema": schema}, arguments).startswith("Payment id: p, Amount: 5 cents")


def test_the_readme_contract_without_display_reads_well():
    """The README's try_refund: no display, no titles, an amount in cents with no
    currency. Names become words and the minor units say so (issue 29, item 1)."""
    properties = {"payment_id": {"type": "string"}, "amount_cents": {"type": "integer"}}
    body = {
        "input_schema": {
            "type": "object",
            "required": ["payment_id", "amount_cents"],
            "properties": properties,
        }
    }
    assert summary(body, {"payment_id": "pay_2", "amount_cents": 75000}) == (
        "Payment id: pay_2, Amount: 75,000 cents"
    )


@pytest.mark.parametrize(
    ("node", "value", "shown"),
    [
        ({"type": "integer", "x-currency": "EUR", "x-minor-units": True}, 75000, "€750.00"),
        ({"type": "number", "x-currency": "USD"}, 12.5, "$12.50"),
        ({"type": "string", "format": "date-time"}, "2026-12-01T10:00:00Z", "2026-12-01 10:00 UTC"),
        ({"type": "string", "format": "email"}, "a@example.com", "a@example.com"),
        # A currency that is not three capital letters is no currency: the name still
        # says cents.
        ({"type": "integer", "x-currency": "eur"}, 500, "500 cents"),
        # A string in a cents field is shown as it is, never reformatted.
        ({"type": "string"}, "lots", "lots"),
    ],
)
def test_formats_are_inferred_from_the_schema(node, value, shown):
    body = {"input_schema": {"type": "object", "properties": {"total_cents": node}}}
    assert summary(body, {"total_cents": value}) == f"Total: {shown}"


def test_a_summary_template_uses_the_schema_hints_for_fields_it_does_not_declare():
    body = {
        "input_schema": {
            "type": "object",
            "properties": {
                "amount": {"type": "integer", "x-currency": "GBP", "x-minor-units": True}
            },
        },
        "display": {"summary": "Pay {/amount}"},
    }
    assert summary(body, {"amount": 1999}) == "Pay £19.99"


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("payment_id", "Payment id"),
        ("amount_cents", "Amount"),
        ("customerEmail", "Customer email"),
        ("_cents", "Cents"),
        ("to", "To"),
    ],
)
def test_names_in_words(name, words):
    from operations.contracts.display import humanize

    assert humanize(name) == words


@pytest.mark.parametrize(
    ("node", "where"),
    [
        ({"type": "integer", "x-currency": "eur"}, "/input_schema/properties/amount/x-currency"),
        ({"type": "integer", "x-currency": 978}, "/input_schema/properties/amount/x-currency"),
        ({"type": "integer", "x-currency": "EUR\n"}, "/input_schema/properties/amount/x-currency"),
        (
            {"type": "integer", "x-minor-units": "yes"},
            "/input_schema/properties/amount/x-minor-units",
        ),
    ],
)
def test_display_hints_that_say_nothing_usable_are_refused(node, where):
    from operations.contracts import normalize_contract
    from operations.errors import InvalidContract

    body = {
        "effect_class": "idempotent",
        "input_schema": {"type": "object", "properties": {"amount": node}},
    }
    with pytest.raises(InvalidContract) as raised:
        normalize_contract(body)
    assert where in [error["path"] for error in raised.value.extra["errors"]]
