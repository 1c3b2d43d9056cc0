"""The OpenAI Agents SDK adapter against the real SDK: an agent driven by the SDK's own
``ScriptedModel`` (no network, no model) calls a guarded ``function_tool``; a live
Effectgate decides. Each test checks what the model reads back.

The SDK takes about a second to import: the tests and helpers that use it import it
themselves, since every parallel worker collects this module and only the one that runs
a test needs it."""

import asyncio
import json
import threading
import time

import pytest
from django.db import connections
from guardian.shortcuts import assign_perm

from effectgate_client import AsyncEffectgateClient, AsyncRunner, EffectgateClient, Failed, Runner
from operations import services
from operations.models import Operation, Tool
from tests.approvals.conftest import person
from tests.client.support import LosingTransport
from tests.conftest import contract, make_runner
from tests.support.event_loop import run_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

ARGS = {"payment_id": "pay_1", "amount_cents": 500}


class Provider:
    """The payment provider behind the tool: counts the refunds it commits."""

    def __init__(self, *script):
        self.script = list(script)
        self.refunds: list[tuple[str, str]] = []

    def refund(self, payment_id: str, amount_cents: int) -> str:
        from effectgate_client.integrations.openai_agents import current_attempt

        step = self.script.pop(0) if self.script else None
        if isinstance(step, BaseException):
            if getattr(step, "after_commit", False):
                self.refunds.append((payment_id, current_attempt().idempotency_key))
            raise step
        attempt = current_attempt()
        assert attempt is not None, "the tool runs inside an Effectgate attempt"
        self.refunds.append((payment_id, attempt.idempotency_key))
        return f"refunded {amount_cents} on {payment_id}"


@pytest.fixture(autouse=True)
def _no_tracing():
    from agents import set_tracing_disabled

    set_tracing_disabled(True)  # the SDK's tracing would export to OpenAI


@pytest.fixture
def world(live_server):
    api = make_runner()
    client = EffectgateClient(live_server.url, api.token)
    yield api, client
    client.close()


def _agent(provider, runner, run, *, approval=None, steps=None):
    from agents import Agent, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from effectgate_client.integrations.openai_agents import guard

    @function_tool(failure_error_function=None)
    def send_refund(payment_id: str, amount_cents: int) -> str:
        """Refund a payment."""
        return provider.refund(payment_id, amount_cents)

    body = contract("irreversible", approval=approval or {"mode": "never"})
    guarded = guard(send_refund, runner=runner, run=run, contract=body)
    model = ScriptedModel(
        steps
        or [
            [function_call("send_refund", ARGS, call_id="call_1")],
            [assistant_message("done")],
        ]
    )
    return Agent(name="support", tools=[guarded], model=model), model


def _seen(model, call_id="call_1"):
    """The tool output the model read back for ``call_id`` (the envelope)."""
    for call in model.calls[1:]:
        for item in call.input:
            if item.get("type") == "function_call_output" and item.get("call_id") == call_id:
                return json.loads(item["output"])
    raise AssertionError("the model never saw the tool's output")


def _run(agent):
    from agents import Runner as AgentRunner

    return run_in_thread(asyncio.run, AgentRunner.run(agent, "refund order 551"))


def test_a_guarded_call_succeeds_once_with_the_operations_key(world):
    _, client = world
    provider = Provider()
    runner = Runner(client, lease_s=10)
    run = client.create_run(principal="user:alice")["id"]
    agent, model = _agent(provider, runner, run)
    result = _run(agent)
    assert result.final_output == "done"
    envelope = _seen(model)
    assert envelope["status"] == "succeeded"
    assert envelope["result"] == "refunded 500 on pay_1"
    op = Operation.objects.get(operation_key="send_refund:call_1")
    assert envelope["logical_operation_id"] == op.id
    assert provider.refunds == [("pay_1", op.idempotency_key)]
    assert op.call_id == "call_1"


def test_the_same_call_again_is_the_same_operation_and_no_second_refund(world):
    _, client = world
    provider = Provider()
    runner = Runner(client, lease_s=10)
    run = client.create_run(principal="user:alice")["id"]
    agent, _model = _agent(provider, runner, run)
    _run(agent)
    # The agent restarts and the model repeats the call it had made (same call id).
    again, model_again = _agent(provider, runner, run)
    _run(again)
    assert len(provider.refunds) == 1
    assert _seen(model_again)["status"] == "succeeded"
    assert Operation.objects.filter(tool_id="send_refund").count() == 1


def test_an_approval_still_pending_comes_back_as_waiting(world):
    _, client = world
    provider = Provider()
    runner = Runner(client, lease_s=10, wait_s=0.5)
    run = client.create_run(principal="user:alice")["id"]
    agent, model = _agent(provider, runner, run, approval={"mode": "always"})
    _run(agent)
    envelope = _seen(model)
    assert envelope["status"] == "awaiting_approval"
    assert "do not call it again" in envelope["message"]
    assert envelope["allowed_next_actions"] == ["wait_for_approval"]
    assert provider.refunds == []


def _decide_soon(approve, comment=""):
    def decide():
        try:
            for _ in range(200):
                op = Operation.objects.filter(status="awaiting_approval").first()
                if op is not None:
                    user = person()
                    assign_perm("operations.decide_tool", user, Tool.objects.get(pk=op.tool_id))
                    services.approval_decide(
                        request_id=op.approval_requests.get(status="pending").id,
                        user=user,
                        approve=approve,
                        comment=comment,
                    )
                    return
                time.sleep(0.05)
        finally:
            connections.close_all()

    thread = threading.Thread(target=decide)
    thread.start()
    return thread


def test_a_person_approves_while_the_agent_waits_and_the_call_runs(world):
    _, client = world
    provider = Provider()
    runner = Runner(client, lease_s=10, wait_s=20)
    run = client.create_run(principal="user:alice")["id"]
    agent, model = _agent(provider, runner, run, approval={"mode": "always"})
    thread = _decide_soon(True)
    _run(agent)
    thread.join()
    assert _seen(model)["status"] == "succeeded"
    assert len(provider.refunds) == 1


def test_a_rejection_reaches_the_model_with_the_reviewers_comment(world):
    _, client = world
    provider = Provider()
    runner = Runner(client, lease_s=10, wait_s=20)
    run = client.create_run(principal="user:alice")["id"]
    agent, model = _agent(provider, runner, run, approval={"mode": "always"})
    thread = _decide_soon(False, "The customer was refunded by phone")
    _run(agent)
    thread.join()
    envelope = _seen(model)
    assert (envelope["status"], envelope["code"]) == ("rejected", "approval_rejected")
    assert "The customer was refunded by phone" in envelope["message"]
    assert provider.refunds == []


def test_a_lost_answer_is_unknown_and_never_retried(world):
    _, client = world
    lost = TimeoutError("read timed out")
    lost.after_commit = True  # the provider committed, the answer never came
    provider = Provider(lost)
    runner = Runner(client, lease_s=10)
    run = client.create_run(principal="user:alice")["id"]
    agent, model = _agent(provider, runner, run)
    _run(agent)
    envelope = _seen(model)
    assert envelope["status"] == "outcome_unknown"
    assert "do not retry" in envelope["message"]
    assert len(provider.refunds) == 1


def test_a_refusal_by_the_provider_is_a_failure(world):
    _, client = world
    provider = Provider(Failed("card_declined", "the card was declined"))
    runner = Runner(client, lease_s=10)
    run = client.create_run(principal="user:alice")["id"]
    agent, model = _agent(provider, runner, run)
    _run(agent)
    envelope = _seen(model)
    assert (envelope["status"], envelope["code"]) == ("failed_permanent", "card_declined")


def test_an_exhausted_budget_is_refused_without_calling_the_tool(world):
    from agents.testing import assistant_message, function_call

    _, client = world
    provider = Provider()
    runner = Runner(client, lease_s=10)
    run = client.create_run(principal="user:alice", budgets={"max_tool_calls": 1})["id"]
    steps = [
        [function_call("send_refund", ARGS, call_id="call_1")],
        [function_call("send_refund", {**ARGS, "payment_id": "pay_2"}, call_id="call_2")],
        [assistant_message("done")],
    ]
    agent, model = _agent(provider, runner, run, steps=steps)
    _run(agent)
    assert _seen(model, "call_1")["status"] == "succeeded"
    envelope = _seen(model, "call_2")
    assert (envelope["status"], envelope["code"]) == ("refused", "budget_exhausted")
    assert len(provider.refunds) == 1


def test_an_outcome_that_cannot_be_recorded_is_unknown_to_the_model(live_server):
    api = make_runner()
    # Every answer to the outcome post is lost: the refund happened, Effectgate may not
    # know it yet. The model must not be told the call "was not made".
    transport = LosingTransport(lose={r"POST /api/v1/operations/[^/]+/attempts/1/outcome": 50})
    client = EffectgateClient(live_server.url, api.token)
    provider = Provider()
    runner = AsyncRunner(
        AsyncEffectgateClient(live_server.url, api.token, transport=transport, backoff_base_s=0.01),
        lease_s=10,
    )
    run = client.create_run(principal="user:alice")["id"]
    agent, model = _agent(provider, runner, run)
    _run(agent)
    client.close()
    envelope = _seen(model)
    assert (envelope["status"], envelope["code"]) == ("outcome_unknown", "outcome_not_recorded")
    assert "Do not retry" in envelope["message"]
    assert len(provider.refunds) == 1


def test_the_sdks_timeout_is_not_kept(world):
    from agents import function_tool

    from effectgate_client.integrations.openai_agents import guard

    _, client = world

    @function_tool(failure_error_function=None, timeout=5)
    async def slow(x: int) -> int:
        """Slow."""
        return x

    guarded = guard(slow, runner=Runner(client), run="run_unused")
    assert slow.timeout_seconds == 5
    assert guarded.timeout_seconds is None


def test_an_async_guarded_call_runs_on_the_agents_loop_with_no_thread_hop(world, monkeypatch):
    from agents import Agent, function_tool
    from agents import Runner as AgentRunner
    from agents.testing import ScriptedModel, assistant_message, function_call

    from effectgate_client.integrations.openai_agents import current_attempt, guard

    api, client = world

    def hop(*args, **kwargs):
        raise AssertionError("the guarded call hopped to a thread")

    monkeypatch.setattr(asyncio, "to_thread", hop)
    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", hop)
    seen = []

    @function_tool(failure_error_function=None)
    async def send_refund(payment_id: str, amount_cents: int) -> str:
        """Refund a payment."""
        heartbeats = [t.name for t in threading.enumerate() if t.name.startswith("heartbeat-")]
        seen.append((threading.get_ident(), heartbeats, current_attempt().idempotency_key))
        return f"refunded {amount_cents} on {payment_id}"

    async def main():
        async with AsyncEffectgateClient(client.base_url, api.token) as async_client:
            runner = AsyncRunner(async_client, lease_s=10)
            body = contract("irreversible", approval={"mode": "never"})
            guarded = guard(send_refund, runner=runner, run=run, contract=body)
            model = ScriptedModel(
                [[function_call("send_refund", ARGS, call_id="call_1")], [assistant_message("ok")]]
            )
            agent = Agent(name="support", tools=[guarded], model=model)
            await AgentRunner.run(agent, "refund order 551")
            return threading.get_ident(), model

    run = client.create_run(principal="user:alice")["id"]
    loop_thread, model = run_in_thread(asyncio.run, main())
    op = Operation.objects.get(operation_key="send_refund:call_1")
    assert seen == [(loop_thread, [], op.idempotency_key)]
    assert _seen(model)["status"] == "succeeded"
    assert op.status == "succeeded"
    assert current_attempt() is None  # the attempt's context did not leak out


def test_a_guard_made_with_a_runner_serves_one_loop_after_another(world):
    _, client = world
    provider = Provider()
    runner = Runner(client, lease_s=10)
    run = client.create_run(principal="user:alice")["id"]
    agent, _model = _agent(provider, runner, run)
    _run(agent)
    # The same guarded tool in a second asyncio.run (a new loop): a second mirror,
    # whose connections belong to that loop.
    from agents.testing import ScriptedModel, assistant_message, function_call

    agent.model = ScriptedModel(
        [
            [function_call("send_refund", {**ARGS, "payment_id": "pay_2"}, call_id="call_2")],
            [assistant_message("done")],
        ]
    )
    _run(agent)
    assert _seen(agent.model, "call_2")["status"] == "succeeded"
    assert [payment for payment, _ in provider.refunds] == ["pay_1", "pay_2"]
