"""The LangGraph / LangChain adapter against the real packages: a graph whose agent node
is LangChain's fake chat model (scripted tool calls, no network, no model) and whose
tools run in LangGraph's ``ToolNode``; a live Effectgate decides.

LangGraph takes half a second to import: the tests and helpers that use it import it
themselves, since every parallel worker collects this module and only the one that runs
a test needs it."""

import asyncio
import json
import threading

import pytest
from django.db import connections
from guardian.shortcuts import assign_perm

from effectgate_client import AsyncEffectgateClient, AsyncRunner, EffectgateClient, Runner
from operations import services
from operations.models import Operation, Tool
from tests.approvals.conftest import person
from tests.client.support import LoopThread
from tests.conftest import contract, make_runner
from tests.support.event_loop import run_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

ARGS = {"payment_id": "pay_1", "amount_cents": 500}


@pytest.fixture
def world(live_server):
    api = make_runner()
    client = EffectgateClient(live_server.url, api.token)
    yield client
    client.close()
    connections.close_all()


def _graph(client, *, approval=None, refunds=None, calls=None, budgets=None, runner=None):
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    from effectgate_client.integrations.langgraph import current_attempt, guard

    refunds = refunds if refunds is not None else []

    if isinstance(runner, AsyncRunner):
        # An async tool, awaited on the graph's loop; it notes the thread it runs in.
        @tool
        async def send_refund(payment_id: str, amount_cents: int) -> str:
            """Refund a payment."""
            refunds.append((payment_id, current_attempt().idempotency_key, threading.get_ident()))
            return f"refunded {amount_cents} on {payment_id}"

    else:

        @tool
        def send_refund(payment_id: str, amount_cents: int) -> str:
            """Refund a payment."""
            refunds.append((payment_id, current_attempt().idempotency_key))
            return f"refunded {amount_cents} on {payment_id}"

    runner = runner or Runner(client, lease_s=10)
    run = client.create_run(principal="user:alice", budgets=budgets)["id"]
    guarded = guard(
        send_refund,
        runner=runner,
        run=run,
        contract=contract("irreversible", approval=approval or {"mode": "never"}),
    )
    script = [
        AIMessage(content="", tool_calls=[{"name": "send_refund", "args": a, "id": i}])
        for i, a in (calls or [("call_1", ARGS)])
    ]
    model = GenericFakeChatModel(messages=iter([*script, AIMessage(content="done")]))

    def agent(state: MessagesState):
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([guarded]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver()), refunds


def _seen(state, call_id="call_1"):
    """The envelope the model read for ``call_id``."""
    from langchain_core.messages import ToolMessage

    for message in state["messages"]:
        if isinstance(message, ToolMessage) and message.tool_call_id == call_id:
            return json.loads(message.content)
    raise AssertionError("no tool message")


CONFIG = {"configurable": {"thread_id": "t1"}}


def test_a_guarded_tool_call_succeeds_through_effectgate(world):
    graph, refunds = _graph(world)
    state = graph.invoke({"messages": [("user", "refund order 551")]}, CONFIG)
    envelope = _seen(state)
    assert envelope["status"] == "succeeded"
    assert envelope["result"] == "refunded 500 on pay_1"
    op = Operation.objects.get(operation_key="send_refund:call_1")
    assert refunds == [("pay_1", op.idempotency_key)]
    assert state["messages"][-1].content == "done"


def test_approval_interrupts_the_graph_and_the_decision_resumes_it(world):
    from langgraph.types import Command

    graph, refunds = _graph(world, approval={"mode": "always"})
    state = graph.invoke({"messages": [("user", "refund order 551")]}, CONFIG)
    [pending] = state["__interrupt__"]
    op = Operation.objects.get(operation_key="send_refund:call_1")
    request = op.approval_requests.get(status="pending")
    assert pending.value["effectgate"] == "approval_required"
    assert pending.value["operation"] == op.id
    assert pending.value["approval_url"].endswith(f"/approvals/{request.id}/")
    assert refunds == []

    # Resumed before anyone decided: it interrupts again, nothing runs.
    state = graph.invoke(Command(resume="not yet"), CONFIG)
    assert state["__interrupt__"]
    assert refunds == []

    approver = person()
    assign_perm("operations.decide_tool", approver, Tool.objects.get(pk="send_refund"))
    services.approval_decide(request_id=request.id, user=approver, approve=True, comment="ok")
    state = graph.invoke(Command(resume="decided"), CONFIG)
    assert "__interrupt__" not in state
    assert _seen(state)["status"] == "succeeded"
    assert len(refunds) == 1


def test_a_rejection_resumes_with_the_reviewers_comment(world):
    from langgraph.types import Command

    graph, refunds = _graph(world, approval={"mode": "always"})
    graph.invoke({"messages": [("user", "refund order 551")]}, CONFIG)
    op = Operation.objects.get(operation_key="send_refund:call_1")
    approver = person()
    assign_perm("operations.decide_tool", approver, Tool.objects.get(pk="send_refund"))
    services.approval_decide(
        request_id=op.approval_requests.get(status="pending").id,
        user=approver,
        approve=False,
        comment="Refunded by phone already",
    )
    state = graph.invoke(Command(resume="decided"), CONFIG)
    envelope = _seen(state)
    assert (envelope["status"], envelope["code"]) == ("rejected", "approval_rejected")
    assert "Refunded by phone already" in envelope["message"]
    assert refunds == []


def test_an_exhausted_budget_reaches_the_model_as_a_refusal(world):
    graph, refunds = _graph(
        world,
        budgets={"max_tool_calls": 1},
        calls=[("call_1", ARGS), ("call_2", {**ARGS, "payment_id": "pay_2"})],
    )
    state = graph.invoke({"messages": [("user", "refund both")]}, CONFIG)
    assert _seen(state, "call_1")["status"] == "succeeded"
    envelope = _seen(state, "call_2")
    assert (envelope["status"], envelope["code"]) == ("refused", "budget_exhausted")
    assert len(refunds) == 1


def test_an_async_graph_keys_the_operation_by_the_tool_call(world):
    graph, refunds = _graph(world)
    state = run_in_thread(
        asyncio.run, graph.ainvoke({"messages": [("user", "refund order 551")]}, CONFIG)
    )
    assert _seen(state)["status"] == "succeeded"
    op = Operation.objects.get(tool_id="send_refund")
    assert op.operation_key == "send_refund:call_1"
    assert op.call_id == "call_1"
    assert len(refunds) == 1


def test_outside_a_graph_a_pending_approval_is_waited_for_not_raised(world):
    from langchain_core.tools import tool

    from effectgate_client.integrations.langgraph import guard

    refunds = []

    @tool
    def send_refund(payment_id: str, amount_cents: int) -> str:
        """Refund a payment."""
        refunds.append(payment_id)
        return "ok"

    guarded = guard(
        send_refund,
        runner=Runner(world, lease_s=10, wait_s=0.3),
        run=world.create_run(principal="user:alice")["id"],
        contract=contract("irreversible", approval={"mode": "always"}),
    )
    envelope = json.loads(guarded.invoke(ARGS))
    assert envelope["status"] == "awaiting_approval"
    assert refunds == []


def test_without_a_call_id_500_then_500_0_is_one_operation_and_one_refund(world):
    """Without a tool-call id the key is derived from the arguments; it follows their
    RFC 8785 canonical form, so the same amount written as a float is the same call."""
    from langchain_core.tools import tool

    from effectgate_client.integrations.langgraph import guard

    refunds = []

    @tool
    def send_refund(payment_id: str, amount_cents: int | float) -> str:
        """Refund a payment (the union keeps the number as the caller wrote it)."""
        refunds.append((payment_id, amount_cents))
        return "ok"

    guarded = guard(
        send_refund,
        runner=Runner(world, lease_s=10),
        run=world.create_run(principal="user:alice")["id"],
        contract=contract("irreversible"),
    )
    first = json.loads(guarded.invoke({"payment_id": "pay_1", "amount_cents": 500}, CONFIG))
    second = json.loads(guarded.invoke({"amount_cents": 500.0, "payment_id": "pay_1"}, CONFIG))
    assert first["status"] == second["status"] == "succeeded"
    operation = Operation.objects.get()
    assert first["logical_operation_id"] == second["logical_operation_id"] == operation.id
    assert operation.attempts == 1
    assert refunds == [("pay_1", 500)]


def test_an_async_graph_on_an_async_runner_interrupts_resumes_and_never_hops(world, monkeypatch):
    from langgraph.types import Command

    from effectgate_client.integrations.langgraph import GuardedTool

    def hop(*args, **kwargs):
        raise AssertionError("the guarded call left the loop")

    monkeypatch.setattr(asyncio, "to_thread", hop)
    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", hop)
    monkeypatch.setattr(GuardedTool, "_run", hop)  # the synchronous path
    loop = LoopThread()
    async_client = AsyncEffectgateClient.like(world)
    try:
        runner = AsyncRunner(async_client, lease_s=10)
        graph, refunds = _graph(world, approval={"mode": "always"}, runner=runner)
        state = loop.run(graph.ainvoke({"messages": [("user", "refund order 551")]}, CONFIG))
        [pending] = state["__interrupt__"]
        op = Operation.objects.get(operation_key="send_refund:call_1")
        assert pending.value["operation"] == op.id
        assert refunds == []

        request = op.approval_requests.get(status="pending")
        approver = person()
        assign_perm("operations.decide_tool", approver, Tool.objects.get(pk="send_refund"))
        services.approval_decide(request_id=request.id, user=approver, approve=True, comment="ok")
        state = loop.run(graph.ainvoke(Command(resume="decided"), CONFIG))
        assert "__interrupt__" not in state
        assert _seen(state)["status"] == "succeeded"
        op.refresh_from_db()
        assert (op.status, op.call_id) == ("succeeded", "call_1")
        assert refunds == [("pay_1", op.idempotency_key, loop.thread.ident)]
    finally:
        loop.run(async_client.aclose())
        loop.close()
