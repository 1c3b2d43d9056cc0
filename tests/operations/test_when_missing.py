"""Approval rules on an argument the operation may omit (issue 25, item 8): absent counts
as matching, so a person decides, unless the rule says ``"when_missing": "skip"``; a
change from match to skip is a weakening (docs/api.md, Approval rules)."""

import copy

import pytest

from approvals.models import ApprovalRequest
from operations.canonical import sha256_hex
from operations.contracts import normalize_contract, weakenings
from operations.errors import InvalidContract
from operations.models import Operation, Tool
from tests.conftest import contract

# amount_cents is optional: a refund of the whole payment omits it.
OPTIONAL_AMOUNT = {
    "type": "object",
    "required": ["payment_id"],
    "properties": {
        "payment_id": {"type": "string"},
        "amount_cents": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": False,
}
RULE = {"path": "/amount_cents", "op": "gt", "value": 50000}
SKIP = {**RULE, "when_missing": "skip"}


def _body(*rules: dict) -> dict:
    return contract(
        "irreversible",
        input_schema=OPTIONAL_AMOUNT,
        approval={"mode": "rules", "rules": list(rules)},
    )


def _reasons(old: dict, new: dict) -> list[str]:
    return weakenings(normalize_contract(old), normalize_contract(new))


# --- Normalization ---------------------------------------------------------------------


def test_the_default_match_is_left_out_so_the_hash_is_that_of_a_rule_without_the_key():
    implicit = normalize_contract(_body(RULE))
    explicit = normalize_contract(_body({**RULE, "when_missing": "match"}))
    assert explicit == implicit
    assert explicit["approval"]["rules"] == [RULE]
    assert sha256_hex(explicit) == sha256_hex(implicit)
    skipping = normalize_contract(_body(SKIP))
    assert skipping["approval"]["rules"] == [SKIP]
    assert sha256_hex(skipping) != sha256_hex(implicit)


@pytest.mark.parametrize("value", ["never", "Skip", True, None, 0, ["skip"]])
def test_a_when_missing_that_is_neither_match_nor_skip_is_refused_at_its_path(value):
    with pytest.raises(InvalidContract) as caught:
        normalize_contract(_body(RULE, {**RULE, "value": 1, "when_missing": value}))
    errors = caught.value.extra["errors"]
    assert [error["path"] for error in errors] == ["/approval/rules/1/when_missing"]


def test_api_a_bad_when_missing_is_422_and_nothing_is_stored(api):
    response = api.put("/api/v1/tools/refund", _body({**RULE, "when_missing": "ignore"}))
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "invalid_contract"
    assert [error["path"] for error in body["errors"]] == ["/approval/rules/0/when_missing"]
    assert not Tool.objects.filter(pk="refund").exists()


# --- Strength --------------------------------------------------------------------------

WEAKER = (
    "approval rule /amount_cents gt 50000 no longer asks a person when /amount_cents is "
    'absent (when_missing changed from "match" to "skip")'
)


def test_a_rule_changed_from_match_to_skip_is_a_weakening():
    assert _reasons(_body(RULE), _body(SKIP)) == [WEAKER]
    assert _reasons(_body({**RULE, "when_missing": "match"}), _body(SKIP)) == [WEAKER]


def test_a_skip_rule_added_in_place_of_a_match_one_is_a_weakening():
    other = {"path": "/payment_id", "op": "eq", "value": "pay_vip"}
    assert _reasons(_body(RULE, other), _body(other, SKIP)) == [WEAKER]


def test_a_stored_rule_without_the_key_is_compared_as_match():
    # A version stored before rules had when_missing: its rule dict has no such key.
    active = normalize_contract(_body(RULE))
    stored = copy.deepcopy(active)
    stored["approval"]["rules"] = [dict(RULE)]
    assert weakenings(stored, normalize_contract(_body(SKIP))) == [WEAKER]
    assert weakenings(stored, active) == []


def test_skip_to_match_is_a_strengthening_and_a_kept_match_rule_keeps_the_proof():
    assert _reasons(_body(SKIP), _body(RULE)) == []
    assert _reasons(_body(SKIP), _body({**RULE, "when_missing": "match"})) == []
    # The same condition still asks a person when absent through another rule.
    assert _reasons(_body(RULE), _body(SKIP, RULE)) == []


# --- Through the API -------------------------------------------------------------------


def test_api_an_operation_omitting_the_ruled_argument_waits_for_a_person(api):
    api.tool("refund", _body(RULE))
    op = api.register(api.run(), "refund", {"payment_id": "pay_1"})
    assert op["status"] == "awaiting_approval"
    assert op["approval"]["reason"] == (
        "Rule matched: /amount_cents gt 50000: /amount_cents is absent, so a person decides."
    )
    assert Operation.objects.get(pk=op["id"]).status == "awaiting_approval"
    assert ApprovalRequest.objects.filter(operation_id=op["id"]).count() == 1
    small = api.register(api.run(), "refund", {"payment_id": "pay_2", "amount_cents": 500})
    assert small["status"] == "ready"


def test_api_with_skip_an_operation_omitting_the_argument_does_not_wait(api):
    api.tool("refund", _body(SKIP))
    op = api.register(api.run(), "refund", {"payment_id": "pay_1"})
    assert (op["status"], op["approval"]) == ("ready", None)
    assert not ApprovalRequest.objects.filter(operation_id=op["id"]).exists()
    big = api.register(api.run(), "refund", {"payment_id": "pay_2", "amount_cents": 60000})
    assert big["status"] == "awaiting_approval"


def test_api_a_version_that_switches_a_rule_to_skip_waits_for_a_person(api):
    api.tool("refund", _body(RULE))
    body = api.put("/api/v1/tools/refund", _body(SKIP)).json()
    assert (body["version"], body["active_version"], body["active"]) == (2, 1, False)
    assert body["weakens"] == [WEAKER]
    assert body["approval"]["rules"] == [SKIP]
    op = api.register(api.run(), "refund", {"payment_id": "pay_1"})
    assert (op["tool_version"], op["status"]) == (1, "awaiting_approval")
    # Back to match: proven, so it activates by itself.
    again = api.put("/api/v1/tools/refund", _body({**RULE, "when_missing": "match"})).json()
    assert (again["version"], again["active"], again["weakens"]) == (3, True, [])
    assert Tool.objects.get(pk="refund").active_version.number == 3
