"""The Cedar examples of docs/policies.md parse and pass Cedar's validator against the
tools they are written for, so that an example cannot rot while the vocabulary
changes (``operations.policies.cedar``)."""

import pytest

from operations.policies import cedar
from tests.docs.blocks import DOCS, fenced_blocks

# The tools the examples speak of, as their contracts' input schemas would be.
CONTRACTS = {
    "refund": {
        "effect_class": "irreversible",
        "input_schema": {
            "type": "object",
            "required": ["payment_id", "amount_cents", "currency"],
            "properties": {
                "payment_id": {"type": "string"},
                "amount_cents": {"type": "integer", "minimum": 1},
                "currency": {"type": "string"},
                "card_number": {"type": "string", "x-sensitive": True},
            },
        },
    },
    "payout": {
        "effect_class": "irreversible",
        "input_schema": {
            "type": "object",
            "required": ["recipient", "amount"],
            "properties": {"recipient": {"type": "string"}, "amount": {"type": "number"}},
        },
    },
    "delete_records": {
        "effect_class": "irreversible",
        "input_schema": {
            "type": "object",
            "required": ["environment", "table"],
            "properties": {"environment": {"type": "string"}, "table": {"type": "string"}},
        },
    },
}
PATH = DOCS / "policies.md"
BLOCKS = [block for block in fenced_blocks(PATH.read_text(), PATH) if block.lang == "cedar"]


def test_the_policies_page_has_cedar_examples():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_each_cedar_example_parses_and_validates(block):
    parsed = cedar.parse(block.text)
    assert cedar.validate(block.text, CONTRACTS) == parsed


def test_the_contracts_here_catch_an_example_that_rotted():
    # An argument no tool has, read without ``has``, is refused: the test above means it.
    rotted = BLOCKS[0].text.replace("amount_cents", "amount_cent")
    cedar.parse(rotted)
    with pytest.raises(cedar.PolicyInvalid, match="refund"):
        cedar.validate(rotted, CONTRACTS)
