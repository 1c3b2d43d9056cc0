"""The concurrency value (contracts.arguments): pure, no database."""

import hashlib

from operations.canonical import canonical_json
from operations.contracts import concurrency_value


def test_the_value_is_the_digest_of_what_the_key_points_at_in_canonical_json():
    contract = {"concurrency_key": "/target"}
    value = concurrency_value(contract, {"target": {"b": 1, "a": "x"}, "amount": 5})
    assert value == hashlib.sha256(canonical_json({"a": "x", "b": 1})).hexdigest()
    # Key order and the other arguments do not matter; the value does.
    assert concurrency_value(contract, {"amount": 6, "target": {"a": "x", "b": 1}}) == value
    assert concurrency_value(contract, {"target": {"a": "x", "b": 2}}) != value


def test_no_key_or_nothing_at_its_place_holds_no_resource():
    assert concurrency_value({}, {"target": "pay_1"}) is None
    assert concurrency_value({"concurrency_key": None}, {"target": "pay_1"}) is None
    assert concurrency_value({"concurrency_key": "/target"}, {"other": "pay_1"}) is None
    # A JSON null is a value: operations on it share a resource.
    assert concurrency_value({"concurrency_key": "/target"}, {"target": None}) is not None
