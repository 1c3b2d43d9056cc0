"""``put_tool`` against a live Effectgate: a contract stored but not activated (it
weakens the active one) raises by default, or warns with ``inactive="warn"``; either
way nothing runs under the new contract until a person activates it."""

import warnings

import pytest

from effectgate_client import (
    ContractNotActive,
    ContractNotActiveWarning,
    EffectgateClient,
    ToolNotActive,
)
from operations.models import Tool
from tests.conftest import contract, make_runner

pytestmark = pytest.mark.django_db(transaction=True)

STRICT = contract("irreversible", approval={"mode": "always"})
WEAKER = contract(
    "irreversible",
    approval={"mode": "rules", "rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}]},
)


@pytest.fixture
def client(live_server):
    with EffectgateClient(live_server.url, make_runner().token) as client:
        yield client


def test_a_weakening_contract_raises_naming_the_reasons_and_what_to_do(client):
    first = client.put_tool("refund", STRICT)
    assert (first["version"], first["active"]) == (1, True)

    with pytest.raises(ContractNotActive) as raised:
        client.put_tool("refund", WEAKER)

    error = raised.value
    assert (error.tool, error.version, error.active_version) == ("refund", 2, 1)
    assert error.weakens, "the reasons travel with the exception"
    assert any("approval" in reason for reason in error.weakens), error.weakens
    message = str(error)
    for reason in error.weakens:
        assert reason in message
    assert "press Activate on the tool's console page" in message
    assert "operations run under version 1" in message
    assert error.answer["active"] is False
    assert Tool.objects.get(pk="refund").active_version.number == 1


def test_the_warn_switch_warns_and_returns_the_answer(client):
    client.put_tool("refund", STRICT)
    with pytest.warns(ContractNotActiveWarning, match="did not activate") as caught:
        answer = client.put_tool("refund", WEAKER, inactive="warn")
    assert (answer["version"], answer["active"]) == (2, False)
    assert caught[0].filename == __file__, "the warning points at the caller"


def test_an_activated_or_unchanged_contract_neither_raises_nor_warns(client):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert client.put_tool("refund", WEAKER)["active"] is True
        stronger = client.put_tool("refund", STRICT)  # provably stronger: activates itself
        assert (stronger["version"], stronger["active"]) == (2, True)
        assert client.put_tool("refund", STRICT)["version"] == 2  # unchanged: same version


def test_the_switch_takes_only_its_two_values(client):
    with pytest.raises(ValueError, match="'raise' or 'warn'"):
        client.put_tool("refund", STRICT, inactive="ignore")
    assert not Tool.objects.filter(pk="refund").exists(), "refused before any request"


def test_an_unchanged_contract_a_person_replaced_says_so(client):
    # A person made version 1 active again after the stronger version 2 activated itself:
    # the runner putting version 2's contract is told that, not of a weakening.
    from guardian.shortcuts import assign_perm

    from operations import services
    from tests.approvals.conftest import person

    client.put_tool("refund", WEAKER)
    client.put_tool("refund", STRICT)
    operator = person()
    tool = Tool.objects.get(pk="refund")
    assign_perm("operations.activate_tool", operator, tool)
    services.tool_version_activate(version=tool.versions.get(number=1), user=operator)

    with pytest.raises(ContractNotActive) as raised:
        client.put_tool("refund", STRICT)
    assert raised.value.weakens == []
    assert "a person made version 1 the active one" in str(raised.value)
    assert "weakens" not in str(raised.value)


def test_a_new_tool_the_server_holds_raises_and_its_operations_are_refused(client, settings):
    settings.HOLD_NEW_TOOLS = "irreversible"
    with pytest.raises(ContractNotActive) as raised:
        client.put_tool("refund", contract("irreversible", approval={"mode": "never"}))
    error = raised.value
    assert (error.tool, error.version, error.active_version) == ("refund", 1, None)
    assert error.weakens == [
        "refund is a new irreversible tool (no version of it is active yet), and "
        'HOLD_NEW_TOOLS is "irreversible": a person activates it'
    ]
    message = str(error)
    assert error.weakens[0] in message
    assert "weakens" not in message
    assert "until then the tool has no active version" in message
    run = client.create_run(principal="user:alice")["id"]
    with pytest.raises(ToolNotActive) as refused:
        client.register(
            run=run,
            tool="refund",
            operation_key="k1",
            arguments={"payment_id": "pay_1", "amount_cents": 5},
        )
    assert (refused.value.status, refused.value.problem["waiting_version"]) == (409, 1)
    assert "waiting for a person to activate version 1" in refused.value.detail
