"""The strength proof is sound: hypothesis draws an active and a new contract version and
a document; whenever the document is valid under the new version but not the active
one, the proof must have refused to activate the new version by itself.

The drawn schemas protect two places: an approval rule at ``/refunds/0/amount`` (an
integer inside the elements of an array, absent when there is no refund) and the
concurrency key at ``/account`` (an object, compared whole). Each version draws the
rule's ``when_missing`` (left out, ``match`` or ``skip``), and a proven version must also
ask a person for every document the active one would (an absent amount included). Each
node on those paths draws its keywords independently for the two versions (bounds,
multiples, enums, sizes, uniqueness, patterns, formats, members, additionalProperties,
patternProperties, propertyNames), so pairs narrow, widen or both. The sibling ``note``
and the ``required`` lists stay the same in both: a change there is a change to another
place (``operations.contracts.subsumption``, step 4), and a document that differs only
there does not reach a protected place.

Documents are built from values that straddle the drawn bounds (wrong types included);
``validator_for`` decides validity as registration does. Derandomized, so CI is stable;
FUZZ_RANDOM=1 explores new examples, STRENGTH_EXAMPLES sets how many.
"""

import copy
import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from approvals.policy import evaluate
from operations.contracts import normalize_contract, weakenings
from operations.contracts.safety import bounded, validator_for
from operations.errors import InvalidContract

EXAMPLES = int(os.environ.get("STRENGTH_EXAMPLES", "1500"))
NUMBERS = [-1, 0, 0.5, 1, 2, 3, 4, 5, 7.5, 10, 11]
STRINGS = ["", "a", "aa", "aaaa", "b", "ab", "acct_1", "abcdefg"]


def _maybe(keyword: str, values: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.just({}), values.map(lambda v: {keyword: v}))


def _merge(*parts: st.SearchStrategy) -> st.SearchStrategy:
    return st.tuples(*parts).map(lambda dicts: {k: v for d in dicts for k, v in d.items()})


amounts = _merge(
    st.sampled_from([{"type": "integer"}, {"type": "number"}, {"type": ["integer", "null"]}]),
    _maybe("minimum", st.sampled_from([0, 1, 2])),
    _maybe("exclusiveMinimum", st.sampled_from([0, 1])),
    _maybe("maximum", st.sampled_from([5, 10, 11])),
    _maybe("exclusiveMaximum", st.sampled_from([5, 10])),
    _maybe("multipleOf", st.sampled_from([1, 2, 0.5])),
    _maybe(
        "enum", st.lists(st.sampled_from([0, 1, 2, 5, 10]), min_size=1, max_size=4, unique=True)
    ),
)
identifiers = _merge(
    st.just({"type": "string"}),
    _maybe("minLength", st.sampled_from([0, 1, 2])),
    _maybe("maxLength", st.sampled_from([2, 4, 6])),
    _maybe("pattern", st.sampled_from(["^a", "^acct_", "b"])),
    _maybe("format", st.sampled_from(["uuid", "email"])),
    _maybe("enum", st.lists(st.sampled_from(STRINGS), min_size=1, max_size=3, unique=True)),
)
# On the path to a place only properties are followed (paths.locate), so the
# ancestors draw no patternProperties; the protected object itself may.
ancestor_openness = st.sampled_from(
    [{}, {"additionalProperties": False}, {"additionalProperties": {"type": "integer"}}]
)
openness = st.one_of(
    ancestor_openness,
    st.sampled_from(
        [
            {"patternProperties": {"^x": {"type": "integer"}}},
            {"patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
        ]
    ),
)
extra_members = st.one_of(st.just({}), st.just({"extra": {"type": "integer"}}))


@st.composite
def schemas(draw) -> dict:
    item = {
        "type": "object",
        "required": ["amount"],
        "properties": {"amount": draw(amounts), **draw(extra_members)},
        **draw(ancestor_openness),
    }
    array = {
        "type": "array",
        "items": item,
        **draw(
            _merge(
                _maybe("maxItems", st.sampled_from([1, 2])),
                _maybe("minItems", st.sampled_from([1])),
                _maybe("uniqueItems", st.just(True)),
            )
        ),
    }
    account = {
        "type": "object",
        "required": ["id"],
        "properties": {"id": draw(identifiers), **draw(extra_members)},
        **draw(openness),
        **draw(
            _merge(
                _maybe("maxProperties", st.sampled_from([1, 2])),
                _maybe(
                    "propertyNames", st.sampled_from([{"maxLength": 2}, {"pattern": "^[a-z]+$"}])
                ),
            )
        ),
    }
    return {
        "type": "object",
        "required": ["refunds", "account"],
        "properties": {
            "refunds": array,
            "account": account,
            "note": {"type": "string"},
            **draw(extra_members),
        },
        **draw(ancestor_openness),
    }


KEPT = {"type", "required", "properties", "items"}


@st.composite
def variants(draw, old: dict, *, drop: bool) -> dict:
    """``old`` with some keywords of the nodes on the protected paths dropped (``drop``)
    or drawn anew where ``old`` lacks them: pairs close enough that the proof often
    holds, so that holding is what is tested."""
    new = copy.deepcopy(old)
    fresh = draw(schemas())
    for path in (
        (),
        ("properties", "refunds"),
        ("properties", "refunds", "items"),
        ("properties", "refunds", "items", "properties", "amount"),
        ("properties", "account"),
        ("properties", "account", "properties", "id"),
    ):
        mine, theirs = _at(new, path), _at(fresh, path)
        for keyword in sorted(set(mine) - KEPT):
            if drop and draw(st.integers(0, 3)) == 0:
                del mine[keyword]
        for keyword in sorted(set(theirs) - KEPT - set(mine)):
            if draw(st.integers(0, 2)) == 0:
                mine[keyword] = theirs[keyword]
    return new


def _at(schema: dict, path: tuple[str, ...]) -> dict:
    for token in path:
        schema = schema[token]
    return schema


members = st.dictionaries(
    st.sampled_from(["extra", "x1", "xy", "zz", "longname"]),
    st.sampled_from([1, "s", None]),
    max_size=2,
)


def _hints(*schemas: dict) -> tuple[list, list]:
    """Numbers and strings near the drawn keywords (enum entries, bounds and the values
    next to them), so documents test the edges the two versions draw."""
    numbers, strings = set(NUMBERS), set(STRINGS)
    stack: list = list(schemas)
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for keyword, value in node.items():
                if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
                    numbers.update({value - 1, value - 0.5, value, value + 0.5, value + 1})
                elif keyword == "enum":
                    for item in value:
                        (strings if isinstance(item, str) else numbers).add(item)
                else:
                    stack.append(value)
    return sorted(numbers), sorted(strings)


@st.composite
def documents(draw, hints: tuple[list, list]) -> dict:
    numbers, strings = hints
    values = st.one_of(st.sampled_from(numbers), st.sampled_from([None, "1", True]))
    refunds = []
    for _ in range(draw(st.integers(0, 3))):
        element = {"amount": draw(values)}
        element.update(draw(members))
        refunds.append(element)
    if refunds and draw(st.booleans()):
        refunds.append(dict(refunds[0]))  # a duplicate element, for uniqueItems
    account = {"id": draw(st.one_of(st.sampled_from(strings), st.sampled_from([1, None])))}
    account.update(draw(members))
    document = {"refunds": refunds, "account": account, "note": "n"}
    document.update(draw(members))
    return document


# A rule without the key, or with either value of it.
when_missing = st.sampled_from([None, "match", "skip"])


def _contract(schema: dict, missing: str | None = None) -> dict:
    rule = {"path": "/refunds/0/amount", "op": "gt", "value": 4}
    if missing is not None:
        rule["when_missing"] = missing
    return normalize_contract(
        {
            "effect_class": "irreversible",
            "input_schema": schema,
            "approval": {"mode": "rules", "rules": [rule]},
            "concurrency_key": "/account",
        }
    )


def _asks(version: dict, document: dict) -> bool:
    return evaluate(version["approval"], document).required


def _valid(schema: dict, document: dict) -> bool:
    return bounded(lambda: validator_for(schema).is_valid(document))


@pytest.mark.slow
@settings(
    max_examples=EXAMPLES,
    derandomize=not os.environ.get("FUZZ_RANDOM"),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,
)
@given(data=st.data())
def test_a_document_only_the_new_version_admits_means_the_proof_refused(data):
    old = data.draw(schemas(), label="old")
    new = data.draw(
        st.one_of(schemas(), variants(old, drop=True), variants(old, drop=False)), label="new"
    )
    missing = (data.draw(when_missing, label="old when_missing"), data.draw(when_missing))
    try:
        active, candidate = _contract(old, missing[0]), _contract(new, missing[1])
    except InvalidContract:
        assume(False)
    proven = not weakenings(active, candidate)
    drawn = st.lists(documents(_hints(old, new)), min_size=8, max_size=8)
    for document in data.draw(drawn, label="documents"):
        if proven and _valid(new, document):
            assert _valid(old, document), f"proved stronger, yet admits {document}"
            if _asks(active, document):
                assert _asks(candidate, document), f"proved stronger, yet lets {document} by"


@pytest.mark.slow
@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(schema=schemas(), missing=when_missing)
def test_an_unchanged_schema_is_always_proven(schema, missing):
    try:
        active = _contract(schema, missing)
    except InvalidContract:
        assume(False)
    assert weakenings(active, _contract(schema, missing)) == []
