"""Simulation before activating (issue 25, item 6; docs/policies.md#simulation): the
operations registered in the last N days replayed against a candidate policy version or
contract version, counting what would change, with examples."""

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from operations import services
from operations.policies import cedar
from operations.policies.simulation import Past, simulate
from operations.services import policies
from operations.services.simulation import contract_simulate, policy_simulate
from tests.conftest import REFUND_SCHEMA, contract
from tests.operations.test_policies import BIG_REFUNDS, NO_HUGE, in_force, steward

BIG_REFUNDS_V2 = BIG_REFUNDS.replace("10000 }", "50000 }")
THIRD_CALL = """@id("third-call")
@approval("required")
permit(principal, action == Action::"register", resource)
when { context.run.tool_calls >= 2 };"""


@pytest.fixture(autouse=True)
def _fresh_policies():
    policies.forget()
    yield
    policies.forget()


def past(number: int, amount: int, *, contract_asks: bool = False, **facts) -> Past:
    at = datetime(2026, 11, 1, 12, tzinfo=UTC) + timedelta(minutes=number)
    return Past(
        operation_id=f"op_{number}",
        registered_at=at,
        facts=cedar.Facts(
            runner="r",
            runner_owner="",
            tool=facts.pop("tool", "refund"),
            tool_owner="r",
            effect_class="irreversible",
            input_schema=REFUND_SCHEMA,
            arguments={"payment_id": "p", "amount_cents": amount},
            now=at,
            **facts,
        ),
        contract_asks=contract_asks,
    )


def test_simulate_counts_what_a_new_policy_would_change_with_five_examples_each():
    history = [past(i, 20000) for i in range(8)] + [
        past(8, 900000),  # forbidden by the candidate
        past(9, 20000, contract_asks=True),  # the contract asked already: no change
        past(10, 5),  # below both bounds
    ]
    result = simulate(
        history,
        current=cedar.PolicySet([]),
        candidate=cedar.PolicySet([cedar.parse(BIG_REFUNDS)]),
    )
    assert result.operations == 11
    assert result.changes["newly_asking"].count == 9  # 8 + the 900000 one
    assert [e["operation"] for e in result.changes["newly_asking"].examples] == [
        f"op_{i}" for i in range(5)
    ]
    assert result.changes["newly_asking"].examples[0]["policies"] == ["big-refunds"]

    forbid = simulate(
        history,
        current=cedar.PolicySet([cedar.parse(BIG_REFUNDS)]),
        candidate=cedar.PolicySet([cedar.parse(NO_HUGE)]),
    ).as_dict()
    assert forbid["newly_forbidden"]["count"] == 1
    assert forbid["newly_forbidden"]["examples"][0]["operation"] == "op_8"
    assert forbid["newly_forbidden"]["examples"][0]["before"] == "require"
    assert forbid["newly_asking"]["count"] == 0


def test_simulate_a_new_version_replaces_the_active_one():
    history = [past(1, 20000), past(2, 90000), past(3, 5)]
    result = simulate(
        history,
        current=cedar.PolicySet([cedar.parse(BIG_REFUNDS), cedar.parse(NO_HUGE)]),
        candidate=cedar.PolicySet([cedar.parse(BIG_REFUNDS_V2)]),
        replaces=frozenset({"big-refunds"}),
    )
    counts = {name: change.count for name, change in result.changes.items()}
    assert counts == {
        "newly_asking": 0,
        "newly_forbidden": 0,
        "no_longer_asking": 1,
        "no_longer_forbidden": 0,
    }
    assert result.changes["no_longer_asking"].examples[0]["operation"] == "op_1"


def test_policy_simulate_replays_the_ledger_with_the_runs_counters_as_they_were(api):
    api.tool("refund")
    api.tool("payout")
    first, second = api.run(), api.run()
    amounts = [5, 20000, 20000, 700000]
    for amount in amounts:
        api.register(first, "refund", {"payment_id": "p", "amount_cents": amount})
    api.register(second, "payout", {"payment_id": "p", "amount_cents": 5})
    services.policies.policy_write(user=steward(), text=THIRD_CALL)
    user = steward()

    calls = policy_simulate(user=user, policy_id="third-call", days=1)
    # The run's third and fourth calls (tool_calls 2 and 3 before them); the other run
    # made one call.
    assert (calls.operations, calls.changes["newly_asking"].count) == (5, 2)

    in_force(BIG_REFUNDS)
    services.policies.policy_write(user=steward(), text=BIG_REFUNDS_V2)
    result = policy_simulate(user=user, policy_id="big-refunds", days=1).as_dict()
    assert result["no_longer_asking"]["count"] == 2
    assert {e["tool"] for e in result["no_longer_asking"]["examples"]} == {"refund"}
    # Version 1 against itself: nothing changes.
    same = policy_simulate(user=user, policy_id="big-refunds", days=1, version=1)
    assert all(change.count == 0 for change in same.changes.values())


def test_policy_simulate_reads_only_the_window_and_at_most_the_limit(api):
    api.tool("refund")
    run = api.run()
    with time_machine.travel(datetime.now(UTC) - timedelta(days=3)):
        api.register(run, "refund", {"payment_id": "old", "amount_cents": 20000})
    for _ in range(3):
        api.register(run, "refund", {"payment_id": "p", "amount_cents": 20000})
    services.policies.policy_write(user=steward(), text=BIG_REFUNDS)
    user = steward()
    assert policy_simulate(user=user, policy_id="big-refunds", days=1).operations == 3
    assert policy_simulate(user=user, policy_id="big-refunds", days=7).operations == 4
    bounded = policy_simulate(user=user, policy_id="big-refunds", days=7, limit=2)
    assert (bounded.operations, bounded.truncated) == (2, True)


def test_contract_simulate_compares_a_held_version_with_the_active_one(api):
    api.tool("refund", contract(approval={"mode": "always"}))
    run = api.run()
    for amount in (50, 500, 5000):
        api.register(run, "refund", {"payment_id": "p", "amount_cents": amount})
    rules = {
        "mode": "rules",
        "rules": [{"path": "/amount_cents", "op": "gt", "value": 100}],
    }
    held = api.tool("refund", contract(approval=rules))
    assert (held["version"], held["active"]) == (2, False)
    result = contract_simulate(user=steward(), tool="refund", version=2, days=1)
    assert result.operations == 3
    assert result.changes["no_longer_asking"].count == 1
    assert result.changes["newly_asking"].count == 0


def test_contract_simulate_is_for_stewards_and_the_tools_activators(api):
    from guardian.shortcuts import assign_perm

    from approvals.errors import PermissionRefused
    from operations.errors import NotFound
    from operations.models import Tool
    from tests.approvals.conftest import person

    api.tool("refund", contract(approval={"mode": "always"}))
    api.tool("refund", contract(approval={"mode": "never"}))
    activator, decider = person(), person()
    assign_perm("operations.activate_tool", activator, Tool.objects.get(pk="refund"))
    assign_perm("operations.decide_tool", decider, Tool.objects.get(pk="refund"))
    assert contract_simulate(user=activator, tool="refund", version=2, days=1).operations == 0
    with pytest.raises(PermissionRefused, match="You may not simulate versions of this tool"):
        contract_simulate(user=decider, tool="refund", version=2, days=1)
    with pytest.raises(NotFound):
        contract_simulate(user=activator, tool="gone", version=2, days=1)
