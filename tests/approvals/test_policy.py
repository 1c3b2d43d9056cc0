"""The approval rules table and the defaults, as pure functions."""

import pytest

from approvals.policy import evaluate, is_missing, parse_pointer, resolve_pointer, rule_matches

ARGS = {
    "amount_cents": 60000,
    "currency": "EUR",
    "flags": {"vip": True, "a/b": 1, "m~n": 2},
    "items": [{"sku": "x"}],
    "note": "1000",
}


@pytest.mark.parametrize(
    ("path", "op", "value", "expected"),
    [
        ("/amount_cents", "eq", 60000, True),
        ("/amount_cents", "eq", 60000.0, True),
        ("/amount_cents", "eq", 1, False),
        ("/amount_cents", "ne", 1, True),
        ("/amount_cents", "ne", 60000, False),
        ("/amount_cents", "gt", 50000, True),
        ("/amount_cents", "gt", 60000, False),
        ("/amount_cents", "gte", 60000, True),
        ("/amount_cents", "lt", 60001, True),
        ("/amount_cents", "lt", 60000, False),
        ("/amount_cents", "lte", 60000, True),
        ("/currency", "in", ["USD", "EUR"], True),
        ("/currency", "in", ["USD"], False),
        ("/currency", "eq", "EUR", True),
        ("/currency", "gt", "AAA", True),  # strings compare as strings
        ("/flags/vip", "eq", True, True),
        ("/flags/vip", "eq", 1, False),  # a boolean is not a number
        ("/flags/a~1b", "eq", 1, True),
        ("/flags/m~0n", "eq", 2, True),
        ("/items/0/sku", "eq", "x", True),
        ("/items/1/sku", "eq", "x", True),  # absent: a person decides
        ("/missing", "ne", 1, True),  # absent: a person decides, whatever the operator
        ("/missing", "lt", 0, True),
        ("/note/0", "eq", "1", True),  # a string has no elements: absent
        ("/note", "gt", 500, True),  # type mismatch on an ordering: a person decides
    ],
)
def test_rules_table(path, op, value, expected):
    assert rule_matches({"path": path, "op": op, "value": value}, ARGS) is expected


def test_a_rule_on_an_absent_argument_matches_unless_it_says_skip():
    def matches(when_missing: str, path: str, op: str = "eq", value: object = "x") -> bool:
        rule = {"path": path, "op": op, "value": value, "when_missing": when_missing}
        return rule_matches(rule, ARGS)

    for absent in ("/missing", "/items/1/sku", "/flags/vip/0"):
        assert (matches("match", absent), matches("skip", absent)) == (True, False), absent
    # A present argument is compared, whatever when_missing says.
    for when_missing in ("match", "skip"):
        assert matches(when_missing, "/amount_cents", "gt", 50000) is True
        assert matches(when_missing, "/amount_cents", "gt", 60000) is False
    # null is a value, not an absence.
    assert rule_matches({"path": "/n", "op": "eq", "value": 1}, {"n": None}) is False


def test_the_reason_says_a_person_decides_because_the_argument_is_absent():
    approval = {
        "mode": "rules",
        "rules": [
            {"path": "/amount_cents", "op": "gt", "value": 50000},
            {"path": "/reference", "op": "ne", "value": "ok"},
            {"path": "/memo", "op": "eq", "value": "x", "when_missing": "skip"},
        ],
    }
    result = evaluate(approval, ARGS)
    assert result.required
    assert result.matched_rules == approval["rules"][:2]
    assert result.absent_paths == {"/reference"}
    assert result.reason == (
        "Rule matched: /amount_cents gt 50000. "
        "Rule matched: /reference ne 'ok': /reference is absent, so a person decides."
    )
    skipped = evaluate({"mode": "rules", "rules": approval["rules"][2:]}, ARGS)
    assert (skipped.required, skipped.matched_rules, skipped.reason) == (False, [], "")


def test_pointer_parsing():
    assert parse_pointer("") == ()
    assert parse_pointer("/a~1b/c~0d/0") == ("a/b", "c~d", "0")
    with pytest.raises(ValueError, match="must start"):
        parse_pointer("a")
    assert resolve_pointer([1, 2], "/01") is not resolve_pointer([1, 2], "/1")


def test_modes_and_the_runner_request():
    rules = {
        "mode": "rules",
        "rules": [
            {"path": "/amount_cents", "op": "gt", "value": 50000},
            {"path": "/currency", "op": "eq", "value": "USD"},
        ],
    }
    result = evaluate(rules, ARGS)
    assert result.required
    assert result.matched_rules == [rules["rules"][0]]
    assert "Rule matched: /amount_cents gt 50000." in result.reason
    assert not evaluate(rules, {"amount_cents": 1, "currency": "EUR"}).required
    assert evaluate({"mode": "always", "rules": []}, {}).required
    assert not evaluate({"mode": "never", "rules": []}, {}).required
    asked = evaluate(
        {"mode": "never", "rules": []}, {}, runner_requested=True, runner_reason="unsure"
    )
    assert asked.required
    assert "The runner asked for approval: unsure" in asked.reason


def test_a_superscript_digit_is_not_an_array_index():
    # "²".isdigit() is true and int("²") raises: a pointer from a runner's contract
    # (an inbound mapping) must not crash whoever resolves it.
    assert is_missing(resolve_pointer([1, 2], "/\u00b2"))
    assert is_missing(resolve_pointer({"a": [1, 2]}, "/a/1\u00b3"))
