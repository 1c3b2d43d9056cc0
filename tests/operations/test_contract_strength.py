"""Provable strength: a new contract version activates by itself only when every place
the active one protects (approval rule, concurrency key, sensitive field) is still there,
with the same type, still required; a rule, key or mark on a place the schema cannot
produce is refused at registration (docs/api.md, Tools and Versions and activation)."""

import copy
from typing import Any

import pytest

from operations.contracts import normalize_contract, weakenings
from operations.contracts.paths import Unproven, locate
from operations.errors import InvalidContract
from operations.models import Tool, ToolVersion
from tests.conftest import REFUND_SCHEMA, contract

RULE = {"path": "/amount_cents", "op": "gt", "value": 50000}


def _guarded(schema: dict[str, Any] | None = None, rules=None, **overrides: Any) -> dict:
    overrides.setdefault("concurrency_key", "/payment_id")
    return contract(
        "irreversible",
        input_schema=schema or REFUND_SCHEMA,
        approval={"mode": "rules", "rules": rules or [RULE]},
        **overrides,
    )


def _schema(change) -> dict[str, Any]:
    schema = copy.deepcopy(REFUND_SCHEMA)
    change(schema)
    return schema


def _renamed(schema):
    schema["properties"]["amount"] = schema["properties"].pop("amount_cents")
    schema["required"] = ["payment_id", "amount"]


def _retyped(schema):
    schema["properties"]["amount_cents"] = {"type": "string"}


def _optional(schema):
    schema["required"] = ["payment_id"]


def _added(schema):
    schema["properties"]["note"] = {"type": "string"}


def _reasons(old_body, new_body) -> list[str]:
    return weakenings(normalize_contract(old_body), normalize_contract(new_body))


# --- What a schema proves about one place -------------------------------------------

NESTED = {
    "type": "object",
    "required": ["order"],
    "properties": {
        "order": {
            "type": "object",
            "required": ["lines", "total"],
            "properties": {
                "total": {"type": "number"},
                "currency": {"enum": ["EUR", "USD"]},
                "lines": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["sku"],
                        "properties": {"sku": {"type": "string"}},
                    },
                },
            },
        },
        "maybe": {
            "type": ["object", "null"],
            "required": ["id"],
            "properties": {"id": {"type": "integer"}},
        },
        "anything": True,
    },
}


@pytest.mark.parametrize(
    ("pointer", "types", "required"),
    [
        (("order",), {"object"}, True),
        (("order", "total"), {"integer", "number"}, True),
        (("order", "currency"), {"string"}, False),
        (("order", "lines", "0", "sku"), {"string"}, False),
        (("order", "lines", "*", "sku"), {"string"}, False),
        (("maybe", "id"), {"integer"}, False),  # the parent may be null
        (
            ("anything",),
            {"null", "boolean", "object", "array", "string", "integer", "number"},
            False,
        ),
    ],
)
def test_locate_reports_types_and_presence(pointer, types, required):
    place = locate(NESTED, pointer, wildcard=True)
    assert (place.types, place.required) == (types, required)


@pytest.mark.parametrize(
    ("place", "types"),
    [
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, {"integer", "null"}),
        ({"oneOf": [{"const": "a"}, {"enum": [1, 2.5]}]}, {"string", "integer", "number"}),
        ({"allOf": [{"type": ["integer", "string"]}, {"type": "number"}]}, {"integer"}),
        ({"type": "string", "anyOf": [{"maxLength": 3}, {"type": "null"}]}, {"string"}),
    ],
)
def test_locate_follows_combinations_at_the_place_itself(place, types):
    schema = {"type": "object", "required": ["a"], "properties": {"a": place}}
    assert locate(schema, ("a",)).types == types


@pytest.mark.parametrize(
    ("schema", "pointer", "why"),
    [
        (NESTED, ("amount",), 'no property "amount"'),
        (NESTED, ("order", "lines", "x"), "not an array index"),
        (NESTED, ("order", "lines", "01", "sku"), "not an array index"),
        (NESTED, ("order", "lines", "*", "sku"), "not an array index"),  # no wildcard
        (NESTED, ("anything", "deeper"), "has no schema"),
        ({"type": "object", "additionalProperties": {"type": "integer"}}, ("a",), "no property"),
        ({"type": "object", "patternProperties": {"^a": {}}}, ("a",), "no property"),
        (
            {"type": "object", "properties": {"a": {}}, "anyOf": [{"required": ["a"]}]},
            ("a",),
            "the top level uses anyOf",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}}, ("a",), "/a uses $ref"),
        ({"type": "object", "properties": {"a": {"not": {"type": "null"}}}}, ("a",), "uses not"),
        (
            {"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#/$defs/x"}]}}},
            ("a",),
            "/a uses $ref",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "object"}}, "if": {}, "then": {}},
            ("a",),
            "the top level uses if, then",
        ),
        (
            {"type": "object", "properties": {"a": {}}, "patternProperties": {"^a": {}}},
            ("a",),
            "patternProperties",
        ),
        ({"type": "object", "properties": {"a": False}}, ("a",), "admits no value"),
        (
            {"type": "object", "properties": {"a": {"type": "string", "enum": [1]}}},
            ("a",),
            "admits",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string", "properties": {"b": {}}}}},
            ("a", "b"),
            "cannot be an object",
        ),
    ],
)
def test_locate_refuses_what_it_cannot_prove(schema, pointer, why):
    with pytest.raises(Unproven, match=why.replace("$", r"\$")):
        locate(schema, pointer)


# --- The weakening analysis, without a database -------------------------------------


def test_renaming_a_ruled_field_and_moving_the_rule_is_not_proven():
    moved = [{**RULE, "path": "/amount"}]
    reasons = _reasons(_guarded(), _guarded(_schema(_renamed), rules=moved))
    assert "approval rule removed or changed: /amount_cents gt 50000" in reasons
    assert (
        "/amount_cents (approval rule) is not in the new input_schema: no property "
        '"amount_cents" is declared under properties at the top level'
    ) in reasons


def test_changing_a_ruled_field_from_integer_to_string_is_not_proven():
    reasons = _reasons(_guarded(), _guarded(_schema(_retyped)))
    assert reasons == ["/amount_cents (approval rule) changes type from integer to string"]


def test_a_ruled_field_that_becomes_optional_is_not_proven():
    reasons = _reasons(_guarded(), _guarded(_schema(_optional)))
    assert reasons == ["/amount_cents (approval rule) is no longer required"]


def test_adding_a_field_to_a_closed_object_admits_more_and_is_not_proven():
    """The active schema refused any other member (additionalProperties: false): a new
    one (a second amount, say) is a value the protected object never admitted."""
    admitted = "admits values the active version refused: at /: a member 'note' is admitted"
    assert _reasons(_guarded(), _guarded(_schema(_added))) == [
        f"/amount_cents (approval rule) {admitted}, and was refused",
        f"/payment_id (concurrency key) {admitted}, and was refused",
    ]


def test_adding_a_field_to_an_open_object_is_proven_as_strong():
    def open_schema(schema):
        del schema["additionalProperties"]

    before, after = _schema(open_schema), _schema(lambda s: (open_schema(s), _added(s)))
    assert _reasons(_guarded(before), _guarded(after)) == []


def test_narrowing_a_type_is_proven_as_strong():
    number = _schema(lambda s: s["properties"]["amount_cents"].update(type="number"))
    assert _reasons(_guarded(number), _guarded()) == []
    assert _reasons(_guarded(), _guarded(number)) == [
        "/amount_cents (approval rule) changes type from integer to number"
    ]


def test_an_optional_value_that_may_now_be_a_string_is_not_proven():
    def nullable(*kinds):
        return _schema(
            lambda s: s["properties"].update(
                amount_cents={"anyOf": [{"type": kind} for kind in kinds]}
            )
        )

    reasons = _reasons(
        _guarded(nullable("integer", "null")), _guarded(nullable("integer", "string"))
    )
    assert reasons == [
        "/amount_cents (approval rule) changes type from integer or null to integer or string",
        "/amount_cents (approval rule) admits values the active version refused: at "
        "/amount_cents: anyOf changed, and cannot be compared",
    ]
    assert _reasons(_guarded(nullable("integer", "null")), _guarded()) == []


def test_the_concurrency_key_place_is_protected_too():
    retyped = _schema(lambda s: s["properties"].update(payment_id={"type": "integer"}))
    assert _reasons(_guarded(), _guarded(retyped)) == [
        "/payment_id (concurrency key) changes type from string to integer"
    ]
    optional = _schema(lambda s: s.update(required=["amount_cents"]))
    assert _reasons(_guarded(), _guarded(optional)) == [
        "/payment_id (concurrency key) is no longer required"
    ]


def test_one_place_with_two_roles_is_named_once():
    both = contract(
        "irreversible",
        approval={"mode": "rules", "rules": [{"path": "/payment_id", "op": "eq", "value": "x"}]},
        concurrency_key="/payment_id",
    )
    retyped = copy.deepcopy(both)
    retyped["input_schema"] = _schema(
        lambda s: s["properties"].update(payment_id={"type": ["string", "null"]})
    )
    assert _reasons(both, retyped) == [
        "/payment_id (approval rule, concurrency key) changes type from string to null or string"
    ]


def test_a_sensitive_field_must_stay_required_and_of_its_type():
    marked = _schema(lambda s: s["properties"]["payment_id"].update({"x-sensitive": True}))
    optional = copy.deepcopy(marked)
    optional["required"] = ["amount_cents"]
    old = contract("irreversible", input_schema=marked)
    assert _reasons(old, contract("irreversible", input_schema=optional)) == [
        "/payment_id (sensitive field) is no longer required"
    ]
    unmarked = contract("irreversible", input_schema=REFUND_SCHEMA)
    assert _reasons(old, unmarked) == ["a sensitive field is no longer marked x-sensitive"]


def test_rule_places_do_not_matter_once_every_operation_needs_approval():
    always = contract("irreversible", input_schema=_schema(_renamed), approval={"mode": "always"})
    assert _reasons(_guarded(), always) == [
        "concurrency key removed or changed",
        # The renamed member is one the active schema refused (additionalProperties).
        "/payment_id (concurrency key) admits values the active version refused: at /: a "
        "member 'amount' is admitted, and was refused",
    ]


def test_a_rule_whose_value_changes_json_type_is_a_change():
    flag = {"path": "/amount_cents", "op": "eq", "value": True}
    reasons = _reasons(_guarded(rules=[flag]), _guarded(rules=[{**flag, "value": 1}]))
    assert reasons == ["approval rule removed or changed: /amount_cents eq true"]
    same = [{**RULE, "value": 50000.0}]
    assert _reasons(_guarded(), _guarded(rules=same)) == []


def test_an_active_version_stored_before_the_check_cannot_be_compared():
    # A version registered before places were checked: its rule names a field its
    # schema lacks, so nothing proves what the rule protected.
    legacy = normalize_contract(_guarded())
    legacy["approval"]["rules"] = [{"path": "/amount", "op": "gt", "value": 50000}]
    reasons = weakenings(legacy, normalize_contract(_guarded()))
    assert (
        "/amount (approval rule) cannot be compared: the active version's input_schema "
        'does not prove it (no property "amount" is declared under properties at the top level)'
    ) in reasons


# --- Refusals at registration, without a database ------------------------------------


@pytest.mark.parametrize(
    ("body", "error_path", "names"),
    [
        (_guarded(_schema(_renamed)), "/approval/rules/0/path", "/amount_cents"),
        (_guarded(concurrency_key="/payment"), "/concurrency_key", "/payment"),
        (
            _guarded(
                _schema(lambda s: s.update(anyOf=[{"required": ["payment_id"]}])),
                concurrency_key=None,
            ),
            "/approval/rules/0/path",
            "anyOf",
        ),
        (
            _guarded(
                {"type": "object", "properties": {"payment_id": {"type": "string"}}},
                rules=[RULE],
            ),
            "/approval/rules/0/path",
            "/amount_cents",
        ),
        (
            contract(
                "irreversible",
                input_schema={
                    "type": "object",
                    "properties": {"card": {"type": "string", "x-sensitive": True}},
                    "anyOf": [{"required": ["card"]}],
                },
            ),
            "/input_schema",
            "/card",
        ),
    ],
)
def test_rules_keys_and_marks_on_unproven_places_are_refused(body, error_path, names):
    with pytest.raises(InvalidContract) as caught:
        normalize_contract(body)
    errors = caught.value.extra["errors"]
    assert [error["path"] for error in errors] == [error_path]
    assert names in errors[0]["message"]


# --- Through the API -------------------------------------------------------------------


def _put(api, body):
    return api.put("/api/v1/tools/refund", body)


def test_api_renamed_field_under_an_unchanged_rule_is_refused(api):
    assert _put(api, _guarded()).status_code == 201
    response = _put(api, _guarded(_schema(_renamed)))
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "invalid_contract"
    assert body["errors"][0]["path"] == "/approval/rules/0/path"
    assert "/amount_cents" in body["errors"][0]["message"]
    assert ToolVersion.objects.filter(tool_id="refund").count() == 1


def test_api_renamed_field_with_the_rule_moved_is_stored_inactive(api):
    _put(api, _guarded())
    response = _put(api, _guarded(_schema(_renamed), rules=[{**RULE, "path": "/amount"}]))
    assert response.status_code == 200
    body = response.json()
    assert (body["version"], body["active_version"], body["active"]) == (2, 1, False)
    assert any(reason.startswith("/amount_cents (approval rule)") for reason in body["weakens"])
    assert Tool.objects.get(pk="refund").active_version.number == 1
    stored = ToolVersion.objects.get(tool_id="refund", number=2)
    assert (stored.activated_at, stored.weakens) == (None, body["weakens"])
    big = api.register(api.run(), "refund", {"payment_id": "p", "amount_cents": 60000})
    assert (big["tool_version"], big["status"]) == (1, "awaiting_approval")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (_retyped, "/amount_cents (approval rule) changes type from integer to string"),
        (_optional, "/amount_cents (approval rule) is no longer required"),
    ],
)
def test_api_a_weaker_place_is_stored_inactive(api, change, reason):
    _put(api, _guarded())
    body = _put(api, _guarded(_schema(change))).json()
    assert (body["version"], body["active_version"], body["active"]) == (2, 1, False)
    assert body["weakens"] == [reason]
    assert Tool.objects.get(pk="refund").active_version.number == 1


def test_api_adding_a_field_to_an_open_object_activates_the_new_version(api):
    def opened(schema):
        del schema["additionalProperties"]

    _put(api, _guarded(_schema(opened)))
    body = _put(api, _guarded(_schema(lambda s: (opened(s), _added(s))))).json()
    assert (body["version"], body["active_version"], body["active"], body["weakens"]) == (
        2,
        2,
        True,
        [],
    )
    assert Tool.objects.get(pk="refund").active_version.number == 2


@pytest.mark.parametrize(
    ("body", "error_path"),
    [
        (
            _guarded(rules=[{"path": "/amount", "op": "gt", "value": 50000}]),
            "/approval/rules/0/path",
        ),
        (_guarded(concurrency_key="/payment"), "/concurrency_key"),
    ],
)
def test_api_a_rule_or_key_on_a_place_not_in_the_schema_is_422(api, body, error_path):
    response = _put(api, body)
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_contract"
    assert [error["path"] for error in response.json()["errors"]] == [error_path]
    assert not Tool.objects.filter(pk="refund").exists()


# --- Admitted values: bounds, sizes, enums, patterns, members (issue 24) ---------------


def _refunds(item: dict | None = None, array: dict | None = None, account=None, **root) -> dict:
    """A schema with an approval rule at /refunds/0/amount and the concurrency key at
    /account; each argument adds keywords to one node on those paths."""
    return {
        "type": "object",
        "required": ["refunds", "account"],
        "properties": {
            "refunds": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["amount"],
                    "properties": {"amount": {"type": "integer", **(item or {})}},
                },
                **(array or {}),
            },
            "account": account
            or {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}},
            "note": {"type": "string"},
        },
        **root,
    }


def _refund_contract(schema: dict) -> dict:
    return contract(
        "irreversible",
        input_schema=schema,
        approval={
            "mode": "rules",
            "rules": [{"path": "/refunds/0/amount", "op": "gt", "value": 100}],
        },
        concurrency_key="/account",
    )


def _widened(old: dict, new: dict) -> list[str]:
    return _reasons(_refund_contract(old), _refund_contract(new))


CLOSED_ACCOUNT = {
    "type": "object",
    "required": ["id"],
    "properties": {"id": {"type": "string"}},
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("old", "new", "words"),
    [
        # The issue's reproductions.
        (_refunds(array={"maxItems": 1}), _refunds(), "maxItems is gone, was 1"),
        (_refunds(account=CLOSED_ACCOUNT), _refunds(), "members it does not declare are admitted"),
        # Bounds and multiples at the place.
        (_refunds({"maximum": 10}), _refunds({"maximum": 11}), "upper bound is 11, was 10"),
        (_refunds({"exclusiveMaximum": 10}), _refunds({"maximum": 10}), "upper bound is 10"),
        (_refunds({"minimum": 0}), _refunds(), "lower bound is none, was 0"),
        (_refunds({"exclusiveMinimum": 0}), _refunds({"minimum": 0}), "lower bound"),
        (_refunds({"multipleOf": 2}), _refunds({"multipleOf": 3}), "multiples of 2"),
        (_refunds({"multipleOf": 2}), _refunds(), "multiples of 2"),
        # Listed values.
        (_refunds({"enum": [1, 2]}), _refunds({"enum": [1, 2, 3]}), "3 is admitted"),
        (_refunds({"const": 5}), _refunds({"minimum": 5, "maximum": 5}), "only listed values"),
        # Sizes and uniqueness on the ancestor array.
        (_refunds(array={"maxItems": 2}), _refunds(array={"maxItems": 3}), "maxItems is 3"),
        (_refunds(array={"minItems": 1}), _refunds(), "minItems is gone"),
        (_refunds(array={"uniqueItems": True}), _refunds(), "no longer be unique"),
        # Strings, patterns and formats inside the protected object.
        (
            _refunds(
                account={**CLOSED_ACCOUNT, "properties": {"id": {"type": "string", "maxLength": 8}}}
            ),
            _refunds(account=CLOSED_ACCOUNT),
            "maxLength is gone, was 8",
        ),
        (
            _refunds(
                account={
                    **CLOSED_ACCOUNT,
                    "properties": {"id": {"type": "string", "pattern": "^acct_"}},
                }
            ),
            _refunds(
                account={
                    **CLOSED_ACCOUNT,
                    "properties": {"id": {"type": "string", "pattern": "^a"}},
                }
            ),
            'the pattern "^acct_" no longer applies',
        ),
        (
            _refunds(
                account={
                    **CLOSED_ACCOUNT,
                    "properties": {"id": {"type": "string", "format": "uuid"}},
                }
            ),
            _refunds(account=CLOSED_ACCOUNT),
            'the format "uuid" no longer applies',
        ),
        # Members of the protected object and of an ancestor.
        (
            _refunds(account={**CLOSED_ACCOUNT, "maxProperties": 1}),
            _refunds(account={**CLOSED_ACCOUNT, "maxProperties": 2}),
            "maxProperties is 2, was 1",
        ),
        (
            _refunds(account={**CLOSED_ACCOUNT, "additionalProperties": {"type": "integer"}}),
            _refunds(account={**CLOSED_ACCOUNT, "additionalProperties": {"type": "string"}}),
            "string is admitted",
        ),
        (
            _refunds(account={**CLOSED_ACCOUNT, "patternProperties": {"^x_": {"type": "integer"}}}),
            _refunds(account={**CLOSED_ACCOUNT, "patternProperties": {"^x": {"type": "integer"}}}),
            "other member names may be admitted",
        ),
        (_refunds(additionalProperties=False), _refunds(), "members it does not declare"),
        (
            _refunds(additionalProperties=False),
            _refunds(additionalProperties=False, properties=None)
            | {"properties": {**_refunds()["properties"], "refunds_2": {"type": "array"}}},
            "a member 'refunds_2' is admitted, and was refused",
        ),
        (
            _refunds(account={"type": "object", "propertyNames": {"maxLength": 2}}),
            _refunds(account={"type": "object", "propertyNames": {"maxLength": 3}}),
            "more member names",
        ),
        # What cannot be compared is a reason too.
        (
            _refunds({"oneOf": [{"minimum": 1}, {"maximum": -1}]}),
            _refunds({"oneOf": [{"minimum": 1}, {"maximum": -2}]}),
            "oneOf changed",
        ),
        (
            _refunds(account={**CLOSED_ACCOUNT, "properties": {"id": {"not": {"const": ""}}}}),
            _refunds(account=CLOSED_ACCOUNT | {"properties": {"id": {}}}),
            "not changed",
        ),
    ],
)
def test_a_version_that_admits_new_values_at_a_protected_place_is_not_proven(old, new, words):
    reasons = _widened(old, new)
    assert any(words in reason for reason in reasons), reasons


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (_refunds(), _refunds({"maximum": 10})),
        (_refunds({"maximum": 10}), _refunds({"exclusiveMaximum": 10})),
        (_refunds({"exclusiveMinimum": 0}), _refunds({"minimum": 1})),
        (_refunds({"multipleOf": 2}), _refunds({"multipleOf": 4})),
        (_refunds({"multipleOf": 1}), _refunds()),
        (_refunds({"enum": [1, 2, 3]}), _refunds({"enum": [3, 1]})),
        (_refunds({"minimum": 1, "maximum": 3}), _refunds({"enum": [1, 2]})),
        (_refunds(array={"maxItems": 3}), _refunds(array={"maxItems": 1})),
        (_refunds(array={"uniqueItems": True}), _refunds(array={"maxItems": 1})),
        (
            _refunds(account=CLOSED_ACCOUNT),
            _refunds(account={**CLOSED_ACCOUNT, "maxProperties": 1}),
        ),
        (_refunds(), _refunds(additionalProperties=False)),
        (
            # A closed object with one member: only that name can occur.
            _refunds(account={**CLOSED_ACCOUNT, "propertyNames": {"maxLength": 2}}),
            _refunds(account=CLOSED_ACCOUNT),
        ),
        (
            _refunds(account={**CLOSED_ACCOUNT, "properties": {"id": {"not": {"const": ""}}}}),
            _refunds(
                account={**CLOSED_ACCOUNT, "properties": {"id": {"not": {"enum": ["", "x"]}}}}
            ),
        ),
        (
            _refunds({"anyOf": [{"maximum": 5}, {"minimum": 100}]}),
            _refunds({"maximum": 4}),
        ),
        (
            # A sibling that is not protected may change freely.
            _refunds(),
            _refunds() | {"properties": {**_refunds()["properties"], "note": {"type": "integer"}}},
        ),
    ],
)
def test_a_version_that_admits_no_new_value_is_proven(old, new):
    assert _widened(old, new) == []


def test_a_changed_title_the_fallback_summary_shows_is_a_display_change():
    titled = _schema(lambda s: s["properties"]["amount_cents"].update(title="Refund amount"))
    sandbox = _schema(
        lambda s: s["properties"]["amount_cents"].update(title="Sandbox test, no money moves")
    )
    assert _reasons(_guarded(titled), _guarded(sandbox)) == [
        "the display (the summary approvers read) changed: an argument's title"
    ]
    template = {"summary": "Refund {/amount_cents}"}
    assert _reasons(_guarded(titled, display=template), _guarded(sandbox, display=template)) == []


def test_api_a_dropped_max_items_leaves_the_second_refund_behind_a_person(api):
    """The issue's reproduction: the second element of an array whose first carries the
    approval rule ran with no approval once maxItems was dropped."""
    assert (
        api.put(
            "/api/v1/tools/split", _refund_contract(_refunds(array={"maxItems": 1}))
        ).status_code
        == 201
    )
    body = api.put("/api/v1/tools/split", _refund_contract(_refunds())).json()
    assert (body["active"], body["active_version"]) == (False, 1)
    assert any("maxItems is gone" in reason for reason in body["weakens"])
    arguments = {"refunds": [{"amount": 1}, {"amount": 90000}], "account": {"id": "a"}}
    response = api.post(
        "/api/v1/operations",
        {"run": api.run(), "tool": "split", "operation_key": "two", "arguments": arguments},
    )
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_arguments"
