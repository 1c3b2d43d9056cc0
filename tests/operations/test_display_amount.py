"""The amount at stake in a row (``display.amount``): the contract's money field in
words, else an argument named as an amount with its name, never bare minor units."""

import pytest

from operations.contracts import display, normalize_contract
from tests.conftest import contract

MONEY = {"label": "Amount", "format": "money", "currency": "EUR", "minor_units": True}


def _amount(arguments, **overrides) -> str:
    return display.amount(normalize_contract(contract("irreversible", **overrides)), arguments)


def test_the_money_field_of_the_display_is_shown_with_its_currency():
    shown = _amount(
        {"payment_id": "pay_1", "amount_cents": 8000},
        display={"summary": "Refund {/amount_cents}", "fields": {"/amount_cents": MONEY}},
    )
    assert shown == "€80.00"


def test_without_a_money_field_the_amount_says_its_unit_or_its_name():
    # A name in cents says cents (display.inferred_field); any other amount keeps its
    # label, so a bare number never passes for money.
    assert _amount({"payment_id": "pay_1", "amount_cents": 75000}) == "75,000 cents"
    assert _amount({"payment_id": "pay_1", "refund_amount": 75}) == "Refund amount: 75"


@pytest.mark.parametrize(
    "arguments", [{"payment_id": "pay_1"}, {"amount_cents": True}, {"amount": {"v": 1}}, [1, 2]]
)
def test_no_amount_is_a_dash(arguments):
    assert _amount(arguments) == display.MISSING


def test_a_money_value_that_is_not_an_amount_is_text_and_bounded():
    shown = _amount(
        {"payment_id": "pay_1", "amount_cents": "9" * 500},
        input_schema={
            "type": "object",
            "properties": {"payment_id": {"type": "string"}, "amount_cents": {"type": "string"}},
        },
        display={"fields": {"/amount_cents": MONEY}},
    )
    assert len(shown) == display.MAX_VALUE
    assert shown.endswith("…")


def test_a_sensitive_amount_stays_hidden():
    schema = {
        "type": "object",
        "properties": {"amount_cents": {"type": "integer", "x-sensitive": True}},
    }
    assert _amount({"amount_cents": "digest"}, input_schema=schema) == "(sensitive)"
