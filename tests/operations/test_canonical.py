"""RFC 8785 canonical JSON against the published vectors, and the intent hash."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from operations.canonical import canonical_json, intent_hash

REPO = Path(__file__).resolve().parents[2]
VECTORS = Path(os.environ.get("EFFECTGATE_VECTORS", REPO.parent / "shared" / "vectors")) / "rfc8785"
VENDORED = REPO / "tests" / "vectors" / "rfc8785"


def _vector_dir() -> Path:
    # The published vectors live beside the repository (../shared/vectors); a copy is
    # kept in tests/vectors for checkouts without that folder, and checked identical.
    return VECTORS if VECTORS.is_dir() else VENDORED


NAMES = sorted(path.name for path in (_vector_dir() / "input").glob("*.json"))


def test_vectors_are_present():
    assert len(NAMES) >= 6


@pytest.mark.parametrize("name", NAMES)
def test_rfc8785_vector_canonicalizes_byte_for_byte(name):
    # Read with Python's own parser: the vectors hold 1E30, which the API's strict parser
    # refuses (PostgreSQL would give it back as an integer RFC 8785 cannot write), and
    # it is the canonical form, not the parser, that the vectors test.
    directory = _vector_dir()
    value = json.loads((directory / "input" / name).read_bytes())
    assert canonical_json(value) == (directory / "output" / name).read_bytes()


@pytest.mark.skipif(not VECTORS.is_dir(), reason="only meaningful beside ../shared/vectors")
def test_vendored_copy_matches_the_published_vectors():
    for kind in ("input", "output"):
        for path in (VECTORS / kind).glob("*.json"):
            assert (VENDORED / kind / path.name).read_bytes() == path.read_bytes()


def test_intent_hash_is_sha256_of_the_canonical_document():
    arguments = {"payment_id": "pay_1", "amount_cents": 500}
    expected = hashlib.sha256(
        b'{"arguments":{"amount_cents":500,"payment_id":"pay_1"},'
        b'"principal":"user:alice","tool":"send_refund"}'
    ).hexdigest()
    assert intent_hash(tool="send_refund", arguments=arguments, principal="user:alice") == expected


def test_intent_hash_ignores_key_order_and_number_spelling():
    a = intent_hash(tool="t", arguments={"a": 1.0, "b": [1, 2]}, principal="p")
    b = intent_hash(tool="t", arguments={"b": [1, 2], "a": 1}, principal="p")
    assert a == b
    assert a != intent_hash(tool="t", arguments={"a": 2, "b": [1, 2]}, principal="p")
