"""RFC 8785 canonical JSON against the published vectors, and the intent hash."""

import hashlib
import json
import os
from pathlib import Path

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from operations import canonical
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


# JSON values of every kind the fast path takes or leaves to the rfc8785 package:
# non-ASCII and control characters, keys that sort differently by UTF-16 code unit than
# by code point (U+E000.. against U+10000..), integers at and past JCS's bounds, floats.
_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="ascii"),
        st.sampled_from(["\x00", "\x1f", "\x7f", "\u2028", "\ue000", "\U0001f600", "é"]),
    ),
    max_size=6,
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53) + 1, 2**53 - 1),
    st.sampled_from([2**53 - 1, -(2**53) + 1]),
    st.floats(allow_nan=False, allow_infinity=False),
    _TEXT,
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_JSON)
def test_the_fast_path_writes_what_the_rfc8785_package_writes(value):
    assert canonical_json(value) == rfc8785.dumps(value)


def test_the_fast_path_leaves_what_it_cannot_write_alike_to_the_package():
    assert canonical._plain({"a": [1, "b", None, True]})
    for value in ({"é": 1}, {"a": 1.5}, ["\U0001f600"], 2**53, {1: 2}):
        assert not canonical._plain(value)
    with pytest.raises(rfc8785.IntegerDomainError):
        canonical_json({"a": 2**53})
