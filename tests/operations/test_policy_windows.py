"""Limits over time (issue 25, item 2; docs/policies.md, Limits over time): a policy with a
``@window`` asks for a person only when the registrations it matched in the window,
this one included, pass its count or its sum, grouped by principal, tool, runner or an
argument value; every matched registration that was written counts."""

from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.utils import timezone

from approvals.models import ApprovalRequest
from operations import services
from operations.models import Operation, PolicyWindowEntry
from operations.policies.cedar import parse
from operations.policies.windows import counted, stored_key
from operations.services import policies
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner
from tests.operations.test_policies import in_force

SCHEMA = {
    "type": "object",
    "required": ["payment_id"],
    "properties": {
        "payment_id": {"type": "string"},
        "customer_id": {"type": "string"},
        "amount": {"type": "number"},
        "amount_cents": {"type": "integer"},
    },
    "additionalProperties": False,
}

PER_CUSTOMER = """@id("refunds-per-customer")
@message("More than 3 refunds to one customer in a day")
@approval("required")
@approvals_required("2")
@window("24h")
@max_count("3")
@group_by("/customer_id")
permit(principal, action == Action::"register", resource == Tool::"refund");"""

PER_PRINCIPAL = """@id("refunded-per-principal")
@approval("required")
@window("1d")
@max_sum("2000")
@sum_of("/amount")
@group_by("principal")
permit(principal, action == Action::"register", resource == Tool::"refund");"""


@pytest.fixture(autouse=True)
def _fresh_policies():
    policies.forget()
    yield
    policies.forget()


def _refunds(api, *names: str) -> None:
    for name in names or ("refund",):
        api.tool(name, contract(input_schema=SCHEMA))


def _pay(api, run: str, tool: str = "refund", **arguments) -> dict:
    return api.register(run, tool, {"payment_id": "p", **arguments})


def test_the_fourth_refund_to_one_customer_in_a_day_asks_with_its_figure(api):
    _refunds(api)
    in_force(PER_CUSTOMER)
    run = api.run()
    first = [_pay(api, run, customer_id="c-1")["status"] for _ in range(3)]
    assert first == ["ready"] * 3
    # Another customer is another group.
    assert _pay(api, run, customer_id="c-2")["status"] == "ready"
    fourth = _pay(api, run, customer_id="c-1")
    assert fourth["status"] == "awaiting_approval"
    request = ApprovalRequest.objects.get(operation_id=fourth["id"])
    assert request.reason == (
        "Policy refunds-per-customer asks: More than 3 refunds to one customer in a day "
        "(4 operations in 24h for /customer_id c-1, bound 3)."
    )
    assert request.approvals_required == 2
    assert request.context["policy_terms"]["approvals_required"] == 2
    assert request.context["policies"] == [
        {
            "policy": "refunds-per-customer",
            "version": 1,
            "message": "More than 3 refunds to one customer in a day",
            "missing": False,
            "figure": "4 operations in 24h for /customer_id c-1, bound 3",
        }
    ]
    # The one that asked counts too, and so does the next.
    fifth = _pay(api, run, customer_id="c-1")
    assert "(5 operations in 24h" in ApprovalRequest.objects.get(operation_id=fifth["id"]).reason
    keys = sorted(PolicyWindowEntry.objects.values_list("key", flat=True))
    assert keys == ["/customer_id:c-1"] * 5 + ["/customer_id:c-2"]
    assert PolicyWindowEntry.objects.filter(operation_id=fifth["id"]).count() == 1


def test_a_registration_a_person_rejected_still_counts(api):
    _refunds(api)
    in_force(PER_CUSTOMER.replace('@max_count("3")', '@max_count("1")'))
    run = api.run()
    assert _pay(api, run, customer_id="c-1")["status"] == "ready"
    second = _pay(api, run, customer_id="c-1")
    request = ApprovalRequest.objects.get(operation_id=second["id"])
    services.approval_decide(
        request_id=request.id,
        user=person(decide_on="refund"),
        approve=False,
        comment="no",
    )
    assert Operation.objects.get(pk=second["id"]).status == "rejected"
    assert _pay(api, run, customer_id="c-1")["status"] == "awaiting_approval"


def test_over_2000_refunded_per_principal_in_a_day_asks(api):
    _refunds(api)
    in_force(PER_PRINCIPAL)
    alice, bob = api.run("user:alice"), api.run("user:bob")
    assert _pay(api, alice, amount=1500)["status"] == "ready"
    # Exactly at the bound is not past it.
    assert _pay(api, alice, amount=500)["status"] == "ready"
    over = _pay(api, alice, amount=0.5)
    assert over["status"] == "awaiting_approval"
    assert ApprovalRequest.objects.get(operation_id=over["id"]).reason == (
        "Policy refunded-per-principal asks: a person must approve "
        "(sum of /amount 2000.5 in 24h for principal user:alice, bound 2000)."
    )
    assert _pay(api, bob, amount=1999.99)["status"] == "ready"
    assert PolicyWindowEntry.objects.get(operation_id=over["id"]).amount == Decimal("0.5")


@pytest.mark.parametrize("group_by", ["principal", "tool", "runner", ""])
def test_each_grouping_counts_its_own_group(db, group_by):
    first, second = make_runner(), make_runner()
    _refunds(first, "refund", "payout")
    response = first.put(f"/api/v1/tools/refund/invokers/{second.runner.name}", None)
    assert response.status_code in (200, 201, 204)
    grouping = f'@group_by("{group_by}")\n' if group_by else ""
    in_force(
        '@id("one-each")\n@approval("required")\n@window("1h")\n@max_count("1")\n'
        + grouping
        + 'permit(principal, action == Action::"register", resource);'
    )
    run = first.run("user:alice")
    assert _pay(first, run)["status"] == "ready"
    # The same principal, tool and runner: the same group whatever the grouping.
    assert _pay(first, run)["status"] == "awaiting_approval"
    others = {
        "principal": (first, first.run("user:bob"), "refund"),
        "tool": (first, run, "payout"),
        "runner": (second, second.run("user:alice"), "refund"),
    }
    for name, (client, other_run, tool) in others.items():
        expected = "ready" if name == group_by else "awaiting_approval"
        assert _pay(client, other_run, tool)["status"] == expected, name


def test_the_window_forgets_what_is_older_than_it(api):
    _refunds(api)
    in_force(PER_CUSTOMER)
    run = api.run()
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        for _ in range(3):
            _pay(api, run, customer_id="c-1")
    with time_machine.travel(start + timedelta(hours=23, minutes=59), tick=False):
        assert _pay(api, run, customer_id="c-1")["status"] == "awaiting_approval"
    with time_machine.travel(start + timedelta(hours=24, seconds=1), tick=False):
        # The first three left the window; the one that asked is still in it.
        assert _pay(api, run, customer_id="c-1")["status"] == "ready"
        assert _pay(api, run, customer_id="c-1")["status"] == "ready"
        assert _pay(api, run, customer_id="c-1")["status"] == "awaiting_approval"


def test_only_what_the_condition_matches_counts(api):
    _refunds(api, "refund", "payout")
    in_force(
        PER_CUSTOMER.replace(
            'resource == Tool::"refund");',
            'resource == Tool::"refund")\nwhen { context.arguments has amount_cents '
            "&& context.arguments.amount_cents > 100 };",
        )
    )
    run = api.run()
    for _ in range(5):
        assert _pay(api, run, customer_id="c-1", amount_cents=50)["status"] == "ready"
        assert _pay(api, run, "payout", customer_id="c-1", amount_cents=500)["status"] == "ready"
    assert not PolicyWindowEntry.objects.exists()
    statuses = [_pay(api, run, customer_id="c-1", amount_cents=500)["status"] for _ in range(4)]
    assert statuses == ["ready"] * 3 + ["awaiting_approval"]


def test_a_value_it_cannot_read_asks_a_person_unless_the_policy_skips(api):
    _refunds(api)
    in_force(PER_PRINCIPAL)
    run = api.run()
    for arguments in ({}, {"amount": -5}, {"amount": 0.0000001}):
        absent = _pay(api, run, **arguments)
        assert absent["status"] == "awaiting_approval", arguments
        reason = ApprovalRequest.objects.get(operation_id=absent["id"]).reason
        assert "it could not be evaluated" in reason
    in_force(PER_CUSTOMER)
    grouped = _pay(api, run, amount=1)
    assert grouped["status"] == "awaiting_approval"
    hits = ApprovalRequest.objects.get(operation_id=grouped["id"]).context["policies"]
    assert [(h["policy"], h["missing"]) for h in hits] == [("refunds-per-customer", True)]
    assert PolicyWindowEntry.objects.filter(policy_id="refunds-per-customer").count() == 0

    in_force(PER_PRINCIPAL.replace("@window", '@when_missing("skip")\n@window'))
    in_force(PER_CUSTOMER.replace("@window", '@when_missing("skip")\n@window'))
    assert _pay(api, run)["status"] == "ready"
    assert PolicyWindowEntry.objects.count() == 1  # the one with amount 1, per principal


def test_a_replay_is_not_counted_again_and_a_refusal_is_not_counted(api):
    _refunds(api)
    in_force(PER_CUSTOMER)
    run = api.run(max_tool_calls=2)
    body = {"payment_id": "p", "customer_id": "c-1"}
    first = api.register(run, "refund", body, operation_key="k-1")
    assert api.register(run, "refund", body, operation_key="k-1", expect=200)["id"] == first["id"]
    api.register(run, "refund", body)
    refused = api.register(run, "refund", body, expect=409)
    assert refused["code"] == "budget_exhausted"
    assert PolicyWindowEntry.objects.count() == 2


def test_below_its_bound_a_window_takes_the_lean_path(api):
    _refunds(api)
    in_force(PER_CUSTOMER)
    run = api.run()
    body = api.register(
        run, "refund", {"payment_id": "p", "customer_id": "c-1"}, claim={"lease_s": 30}
    )
    assert body["status"] == "executing"
    assert body["approval"] is None
    assert PolicyWindowEntry.objects.get().operation_id == body["id"]


def test_the_sweep_deletes_entries_past_the_longest_window_in_force(api):
    _refunds(api)
    in_force(PER_CUSTOMER)
    in_force(PER_PRINCIPAL.replace('@window("1d")', '@window("2d")'))
    run = api.run()
    start = timezone.now()
    for hours in (0, 30, 47):
        with time_machine.travel(start + timedelta(hours=hours), tick=False):
            _pay(api, run, customer_id="c-1", amount=1)
    with time_machine.travel(start + timedelta(hours=49), tick=False):
        report = services.sweep()
    assert report.window_entries_deleted == 2
    assert PolicyWindowEntry.objects.count() == 4
    assert services.sweep(now=start + timedelta(hours=49)).window_entries_deleted == 0


def test_a_long_group_value_is_stored_as_its_digest():
    policy = parse(PER_CUSTOMER)
    entry = counted(
        policy,
        version=1,
        principal="user:alice",
        tool="refund",
        runner="r",
        arguments={"customer_id": "c" * 500},
    )
    assert entry is not None
    assert entry.key == stored_key("/customer_id", "c" * 500)
    assert entry.key.startswith("sha256:")
    assert len(entry.key) == 71
    assert len(entry.group) < 80


def test_a_person_s_edited_copy_is_not_counted_again_nor_asked_of_by_a_window(api):
    api.tool(
        "refund",
        contract(input_schema=SCHEMA, approval={"mode": "always", "editable": ["/amount_cents"]}),
    )
    in_force(PER_CUSTOMER)
    run = api.run()
    op = _pay(api, run, customer_id="c-1", amount_cents=100)
    request = ApprovalRequest.objects.get(operation_id=op["id"])
    assert "policies" not in request.context  # below its bound the window did not ask
    services.approval_decide(
        request_id=request.id,
        user=person(decide_on="refund"),
        approve=True,
        comment="",
        edits={"/amount_cents": 90},
    )
    successor = Operation.objects.get(previous_id=op["id"])
    edited = ApprovalRequest.objects.get(operation=successor)
    assert edited.approvals_required == 1
    assert "policy_terms" not in edited.context
    assert PolicyWindowEntry.objects.count() == 1
