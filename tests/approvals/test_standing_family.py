"""Which intents a standing grant covers: pure functions, no database."""

from decimal import Decimal

import pytest

from approvals.standing import Family, amount_at, pin_holds, pins_problem

ARGS = {"payment_id": "pay_1", "amount_cents": 500, "currency": "EUR", "meta": {"n": 2}}


@pytest.mark.parametrize(
    ("pin", "holds"),
    [
        ({"path": "/payment_id", "op": "eq", "value": "pay_1"}, True),
        ({"path": "/payment_id", "op": "eq", "value": "pay_2"}, False),
        ({"path": "/amount_cents", "op": "eq", "value": 500.0}, True),
        ({"path": "/amount_cents", "op": "lte", "value": 500}, True),
        ({"path": "/amount_cents", "op": "lte", "value": 499}, False),
        ({"path": "/amount_cents", "op": "gte", "value": 500}, True),
        ({"path": "/amount_cents", "op": "gte", "value": 501}, False),
        ({"path": "/currency", "op": "in", "value": ["USD", "EUR"]}, True),
        ({"path": "/currency", "op": "in", "value": ["USD"]}, False),
        ({"path": "/meta/n", "op": "eq", "value": 2}, True),
        # An absent argument, or a string where a number is compared, holds no pin.
        ({"path": "/missing", "op": "eq", "value": None}, False),
        ({"path": "/currency", "op": "lte", "value": 10}, False),
        ({"path": "/meta", "op": "eq", "value": {"n": 2}}, True),
    ],
)
def test_a_pin_holds_only_when_the_argument_meets_it(pin, holds):
    assert pin_holds(pin, ARGS) is holds


def test_a_boolean_is_not_a_number_to_a_pin():
    assert not pin_holds({"path": "/flag", "op": "eq", "value": 1}, {"flag": True})
    assert not pin_holds({"path": "/flag", "op": "lte", "value": 1}, {"flag": True})


@pytest.mark.parametrize(
    ("family", "intent", "included"),
    [
        (Family(tool="refund"), {}, True),
        (Family(tool="payout"), {}, False),
        (Family(tool="refund", principal="user:alice"), {}, True),
        (Family(tool="refund", principal="user:bob"), {}, False),
        (Family(tool="refund", run_id="run_1"), {}, True),
        (Family(tool="refund", run_id="run_2"), {}, False),
        (
            Family(
                tool="refund",
                pins=[
                    {"path": "/payment_id", "op": "eq", "value": "pay_1"},
                    {"path": "/amount_cents", "op": "lte", "value": 1000},
                ],
            ),
            {},
            True,
        ),
        (
            Family(tool="refund", pins=[{"path": "/amount_cents", "op": "lte", "value": 100}]),
            {},
            False,
        ),
        (Family(tool="refund"), {"arguments": {"amount_cents": 5}}, True),
    ],
)
def test_a_family_is_a_tool_a_principal_a_run_and_pins(family, intent, included):
    found = family.includes(
        tool="refund",
        principal="user:alice",
        run_id="run_1",
        arguments=intent.get("arguments", ARGS),
    )
    assert found is included


@pytest.mark.parametrize(
    ("arguments", "amount"),
    [
        ({"amount_cents": 500}, Decimal(500)),
        ({"amount_cents": 12.5}, Decimal("12.5")),
        ({"amount_cents": 0}, Decimal(0)),
        ({"amount_cents": -1}, None),
        ({"amount_cents": "500"}, None),
        ({"amount_cents": True}, None),
        ({}, None),
    ],
)
def test_the_summed_amount_is_a_non_negative_number_or_nothing(arguments, amount):
    assert amount_at(arguments, "/amount_cents") == amount


@pytest.mark.parametrize(
    ("pins", "problem"),
    [
        ([], None),
        ([{"path": "/a", "op": "eq", "value": None}], None),
        ([{"path": "/a", "op": "in", "value": [1, 2]}], None),
        ({"path": "/a"}, "Pins are a list."),
        ([{"path": "/a", "op": "eq"}], 'Each pin is {"path", "op", "value"}.'),
        ([{"path": "a", "op": "eq", "value": 1}], "the path is a JSON pointer"),
        ([{"path": "", "op": "eq", "value": 1}], "the path is a JSON pointer"),
        ([{"path": "/a", "op": "gt", "value": 1}], "the operator is one of eq, lte, gte, in"),
        ([{"path": "/a", "op": "lte", "value": "9"}], "at most compares with a number"),
        ([{"path": "/a", "op": "in", "value": []}], "one of takes a non-empty list"),
        ([{"path": "/a", "op": "eq", "value": 1}] * 51, "At most 50 pins."),
    ],
)
def test_pins_are_checked_before_a_grant_is_issued(pins, problem):
    found = pins_problem(pins)
    if problem is None:
        assert found is None
    else:
        assert problem in (found or "")
