"""Batches from the Python client against a live Effectgate: ``register_many`` and
``post_outcomes`` (each item a ``BatchItem`` with the single call's answer or typed
refusal) and ``execute_many`` (``Runner`` and ``AsyncRunner``), counted by request."""

import asyncio
import threading
import time

import pytest

from effectgate_client import (
    BatchItem,
    BudgetExhausted,
    EffectgateClient,
    InvalidArguments,
    NotFound,
    OutcomeNotRecorded,
    Succeeded,
)
from operations.models import Operation
from tests.client.support import LosingTransport
from tests.client.test_runner_live import Calls, Setup

pytestmark = pytest.mark.django_db(transaction=True)


def _args(n, amount=500):
    return {"payment_id": f"pay_{n}", "amount_cents": amount}


@pytest.fixture
def client(live_server):
    from tests.conftest import make_runner

    api = make_runner()
    transport = LosingTransport()
    with EffectgateClient(live_server.url, api.token, transport=transport) as client:
        client.transport = transport  # type: ignore[attr-defined]
        client.put_tool("refund", contract_never())
        yield client


def contract_never():
    from tests.conftest import contract

    return contract("idempotent")


def test_register_many_answers_each_item_in_order_ok_refused_and_the_budgets_remainder(client):
    run = client.create_run(principal="user:alice", budgets={"max_tool_calls": 2})["id"]
    items = client.register_many(
        run,
        [
            {"tool": "refund", "operation_key": "k1", "arguments": _args(1), "claim_lease_s": 30},
            {"tool": "refund", "operation_key": "k2", "arguments": _args(2, amount=0)},
            {"tool": "refund", "operation_key": "k3", "arguments": _args(3)},
            {"tool": "refund", "operation_key": "k4", "arguments": _args(4)},
        ],
    )
    assert [item.status for item in items] == [201, 422, 201, 409]
    assert all(isinstance(item, BatchItem) for item in items)
    assert items[0].operation["status"] == "executing"
    assert items[0].operation["attempt"]["attempt"] == 1
    assert items[2].operation["status"] == "ready"
    assert "attempt" not in items[2].operation
    assert isinstance(items[1].error, InvalidArguments)
    assert items[1].error.errors[0]["path"] == "/arguments/amount_cents"
    assert isinstance(items[3].error, BudgetExhausted)
    assert items[3].error.request_id
    assert items[3].error.request_id == items[1].error.request_id
    with pytest.raises(BudgetExhausted):
        items[3].unwrap()
    assert items[0].unwrap()["operation_key"] == "k1"
    assert sorted(Operation.objects.values_list("operation_key", flat=True)) == ["k1", "k3"]
    assert client.transport.sent.count("POST /api/v1/operations") == 1
    # The same batch again: the same operations (200), nothing new, nothing claimed.
    again = client.register_many(
        run, [{"tool": "refund", "operation_key": "k1", "arguments": _args(1)}]
    )
    assert again[0].status == 200
    assert again[0].operation["id"] == items[0].operation["id"]


def test_post_outcomes_answers_each_item_and_a_repeat_the_same(client):
    run = client.create_run(principal="user:alice")["id"]
    items = client.register_many(
        run,
        [
            {"tool": "refund", "operation_key": f"o{n}", "arguments": _args(n), "claim_lease_s": 30}
            for n in (1, 2)
        ],
    )
    first, second = (item.unwrap() for item in items)
    outcomes = [
        {"operation": first["id"], "attempt": 1, "kind": "succeeded", "downstream_id": "re_1"},
        {"operation": second["id"], "attempt": 1, "kind": "failed", "code": "card_declined"},
        {"operation": second["id"], "attempt": 7, "kind": "succeeded"},
    ]
    answers = client.post_outcomes(run, outcomes)
    assert [item.status for item in answers] == [200, 200, 404]
    assert answers[0].operation["status"] == "succeeded"
    assert answers[0].operation["tool_result"]["status"] == "succeeded"
    assert answers[1].operation["status"] == "failed_permanent"
    assert isinstance(answers[2].error, NotFound)
    assert client.post_outcomes(run, outcomes[:2])[0].operation == answers[0].operation
    assert Operation.objects.get(id=first["id"]).downstream_id == "re_1"


def test_batches_of_no_or_more_than_50_items_are_refused_before_sending(client):
    run = client.create_run(principal="user:alice")["id"]
    sent = len(client.transport.sent)
    one = {"tool": "refund", "operation_key": "k", "arguments": _args(1)}
    with pytest.raises(ValueError, match="1 to 50"):
        client.register_many(run, [])
    with pytest.raises(ValueError, match="1 to 50"):
        client.register_many(run, [one] * 51)
    with pytest.raises(ValueError, match="1 to 50"):
        client.post_outcomes(run, [])
    with pytest.raises(ValueError, match="of run"):
        client.register_many(run, [{**one, "run": "run_other"}])
    assert len(client.transport.sent) == sent


@pytest.fixture(params=["sync", "async"])
def setup(live_server, request):
    made = Setup(live_server, request.param)
    yield made
    made.close()


def _execute_many(setup, calls):
    running = setup.runner.execute_many(calls)
    return running if setup.loop is None else setup.loop.run(running)


def _call(setup, n, tool="refund", arguments=None, calls=None, **options):
    return {
        "run": setup.run,
        "tool": tool,
        "operation_key": f"turn-1:{n}",
        "arguments": arguments or _args(n),
        "call": calls,
        **options,
    }


def test_execute_many_runs_each_call_once_in_two_requests_and_a_rerun_replays(setup):
    setup.tool("refund")
    tools = [Calls(Succeeded(result={"n": n}, downstream_id=f"re_{n}")) for n in range(3)]
    calls = [_call(setup, n, calls=tools[n]) for n in range(3)]
    results = _execute_many(setup, calls)

    assert [result.status for result in results] == ["succeeded"] * 3
    assert [result.for_model()["result"] for result in results] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert [len(tool.contexts) for tool in tools] == [1, 1, 1]
    ops = {op.operation_key: op for op in Operation.objects.all()}
    assert [tools[n].contexts[0].idempotency_key for n in range(3)] == [
        ops[f"turn-1:{n}"].idempotency_key for n in range(3)
    ]
    assert all(op.status == "succeeded" and op.attempts == 1 for op in ops.values())
    sent = [line for line in setup.transport.sent if "/operations" in line or "outcome" in line]
    assert sent == ["POST /api/v1/operations", f"POST /api/v1/runs/{setup.run}/outcomes"]

    # The same calls again (a crashed runner's restart): replays, no tool is called.
    again = _execute_many(setup, calls)
    assert [result.status for result in again] == ["succeeded"] * 3
    assert [len(tool.contexts) for tool in tools] == [1, 1, 1]
    assert [result.operation["id"] for result in again] == [r.operation["id"] for r in results]


def test_execute_many_gives_each_item_what_execute_gives_it(setup):
    setup.tool("refund")
    setup.tool("big_refund", approval={"mode": "always"})
    ran, waiting, invalid = Calls(), Calls(), Calls()
    results = _execute_many(
        setup,
        [
            _call(setup, 1, calls=ran),
            _call(setup, 2, tool="big_refund", calls=waiting, approval_wait_s=0),
            _call(setup, 3, arguments=_args(3, amount=0), calls=invalid),
        ],
    )
    assert results[0].status == "succeeded"
    assert (results[1].status, results[1].refusal) == ("awaiting_approval", "approval_required")
    assert isinstance(results[2], InvalidArguments)
    assert (len(ran.contexts), len(waiting.contexts), len(invalid.contexts)) == (1, 0, 0)
    # What execute answers for the call that waits for a person: the same.
    alone = setup.execute(
        "big_refund", waiting, key="turn-1:2", arguments=_args(2), approval_wait_s=0
    )
    assert (alone.status, alone.refusal, alone.envelope) == (
        results[1].status,
        results[1].refusal,
        results[1].envelope,
    )
    # A single claimed call posts its outcome as the single call.
    assert f"POST /api/v1/runs/{setup.run}/outcomes" not in setup.transport.sent


def test_execute_many_takes_1_to_50_calls_of_one_run(setup):
    with pytest.raises(ValueError, match="1 to 50"):
        _execute_many(setup, [])
    call = _call(setup, 1, calls=Calls())
    with pytest.raises(ValueError, match="one run"):
        _execute_many(setup, [call, {**call, "run": "run_other"}])


@pytest.fixture(params=["sync", "async"])
def make_setup(live_server, request):
    made = []

    def make(**options):
        made.append(Setup(live_server, request.param, **options))
        return made[-1]

    yield make
    for item in made:
        item.close()


def test_an_outcome_batch_that_stays_lost_keeps_each_outcome_and_runs_nothing_again(make_setup):
    transport = LosingTransport(lose={r"POST /api/v1/runs/[^/]+/outcomes": 100})
    setup = make_setup(transport=transport)
    setup.tool("refund")
    tools = [Calls(Succeeded(downstream_id=f"re_{n}")) for n in range(2)]
    results = _execute_many(setup, [_call(setup, n, calls=tools[n]) for n in range(2)])

    assert all(isinstance(result, OutcomeNotRecorded) for result in results)
    assert [result.outcome for result in results] == [
        {"kind": "succeeded", "downstream_id": "re_0"},
        {"kind": "succeeded", "downstream_id": "re_1"},
    ]
    assert [result.attempt for result in results] == [1, 1]
    assert [len(tool.contexts) for tool in tools] == [1, 1]
    # Every answer was lost after Effectgate recorded the outcome: the batch was sent
    # once and repeated six times, and each outcome is recorded once.
    assert len(transport.lost) == 7
    assert set(Operation.objects.values_list("status", "attempts")) == {("succeeded", 1)}


def test_an_unknown_outcome_in_a_batch_is_never_run_again(setup):
    setup.tool("refund", effect_class="irreversible")
    crashing, fine = Calls(RuntimeError("connection reset after send")), Calls()
    results = _execute_many(setup, [_call(setup, 1, calls=crashing), _call(setup, 2, calls=fine)])
    assert [result.status for result in results] == ["outcome_unknown", "succeeded"]
    assert (len(crashing.contexts), len(fine.contexts)) == (1, 1)
    again = _execute_many(setup, [_call(setup, 1, calls=crashing), _call(setup, 2, calls=fine)])
    assert [result.status for result in again] == ["outcome_unknown", "succeeded"]
    assert (len(crashing.contexts), len(fine.contexts)) == (1, 1)


# --- size, interruptions, leases ------------------------------------------------------

# An outcome of about 600 KB: accepted alone, two of them are over the server's 1 MiB.
BIG = "x" * 600_000


def test_post_outcomes_too_large_for_one_request_go_in_several(client):
    run = client.create_run(principal="user:alice")["id"]
    items = client.register_many(
        run,
        [
            {"tool": "refund", "operation_key": f"b{n}", "arguments": _args(n), "claim_lease_s": 30}
            for n in (1, 2)
        ],
    )
    outcomes = [
        {"operation": item.unwrap()["id"], "attempt": 1, "kind": "succeeded", "result": {"b": BIG}}
        for item in items
    ]
    answers = client.post_outcomes(run, outcomes)
    assert [item.status for item in answers] == [200, 200]
    assert client.transport.sent.count(f"POST /api/v1/runs/{run}/outcomes") == 2
    assert set(Operation.objects.values_list("status", flat=True)) == {"succeeded"}


def test_a_batch_refused_as_too_large_is_sent_again_item_by_item(live_server):
    from tests.conftest import make_runner

    transport = LosingTransport()
    # A client whose limit is above the server's: the server answers 413.
    with EffectgateClient(
        live_server.url, make_runner().token, transport=transport, max_batch_bytes=4 << 20
    ) as client:
        client.put_tool("refund", contract_never())
        run = client.create_run(principal="user:alice")["id"]
        items = client.register_many(
            run,
            [{"tool": "refund", "operation_key": f"b{n}", "arguments": _args(n)} for n in (1, 2)],
        )
        claimed = [client.claim(item.unwrap()["id"]) for item in items]
        outcomes = [
            {
                "operation": item.unwrap()["id"],
                "attempt": attempt["attempt"],
                "kind": "succeeded",
                "result": {"b": BIG},
            }
            for item, attempt in zip(items, claimed, strict=True)
        ]
        answers = client.post_outcomes(run, outcomes)
    assert [item.status for item in answers] == [200, 200]
    assert transport.sent.count(f"POST /api/v1/runs/{run}/outcomes") == 3
    assert client.stats["batch_split_413"] == 1
    assert set(Operation.objects.values_list("status", flat=True)) == {"succeeded"}


def test_execute_many_records_outcomes_too_large_to_share_a_request(setup):
    setup.tool("refund")
    tools = [Calls(Succeeded(result={"blob": BIG}, downstream_id=f"re_{n}")) for n in range(2)]
    results = _execute_many(setup, [_call(setup, n, calls=tools[n]) for n in range(2)])
    assert [result.status for result in results] == ["succeeded", "succeeded"]
    assert [len(tool.contexts) for tool in tools] == [1, 1]
    assert set(Operation.objects.values_list("status", "downstream_id")) == {
        ("succeeded", "re_0"),
        ("succeeded", "re_1"),
    }


def _status_later(key, seconds, seen):
    """A thread that notes the status of operation ``key`` after ``seconds``."""
    from django.db import connections

    def watch():
        time.sleep(seconds)
        try:
            seen[key] = Operation.objects.get(operation_key=key).status
        finally:
            connections.close_all()

    watcher = threading.Thread(target=watch)
    watcher.start()
    return watcher


def test_a_finished_calls_outcome_is_posted_before_the_slowest_tool_returns(setup):
    setup.tool("refund")
    fast = Calls(Succeeded(downstream_id="re_fast"))

    if setup.loop is None:

        def slow(ctx):
            time.sleep(3)
            return Succeeded(downstream_id="re_slow")
    else:

        async def slow(ctx):
            await asyncio.sleep(3)
            return Succeeded(downstream_id="re_slow")

    seen = {}
    watcher = _status_later("turn-1:1", 2, seen)
    results = _execute_many(setup, [_call(setup, 1, calls=fast), _call(setup, 2, calls=slow)])
    watcher.join()
    assert [result.status for result in results] == ["succeeded", "succeeded"]
    assert seen["turn-1:1"] == "succeeded"


@pytest.mark.parametrize("make_setup", ["async"], indirect=True)  # a cancellation is asyncio's
def test_cancelling_execute_many_posts_the_outcomes_of_the_tools_that_returned(make_setup):
    setup = make_setup()
    setup.tool("refund")
    fast, started = Calls(Succeeded(downstream_id="re_fast")), []

    async def slow(ctx):
        started.append(ctx)
        await asyncio.sleep(30)

    calls = [_call(setup, 1, calls=fast), _call(setup, 2, calls=slow)]

    async def main():
        task = asyncio.ensure_future(setup.runner.execute_many(calls))
        await asyncio.sleep(1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    setup.loop.run(main())
    assert (len(fast.contexts), len(started)) == (1, 1)
    ops = dict(Operation.objects.values_list("operation_key", "status"))
    # The cancelled tool's outcome is left to its lease (unknown), as for execute.
    assert ops == {"turn-1:1": "succeeded", "turn-1:2": "executing"}


class _Interrupt(BaseException):
    """What a KeyboardInterrupt is to a thread pool's worker."""


@pytest.mark.parametrize("make_setup", ["sync"], indirect=True)  # the thread pool's
def test_an_interrupted_execute_many_posts_the_outcomes_of_the_tools_that_ran(make_setup):
    setup = make_setup()
    setup.tool("refund")

    def interrupted(ctx):
        time.sleep(0.5)
        raise _Interrupt

    fast, later = Calls(Succeeded(downstream_id="re_fast")), Calls()

    def slower(ctx):
        time.sleep(1)
        return later(ctx)

    calls = [
        _call(setup, 1, calls=fast),
        _call(setup, 2, calls=interrupted),
        _call(setup, 3, calls=slower),
    ]
    with pytest.raises(_Interrupt):
        setup.runner.execute_many(calls, max_workers=3)
    ops = dict(Operation.objects.values_list("operation_key", "status"))
    # The tools that ran have their outcomes; the interrupted one is left to its lease.
    assert ops == {"turn-1:1": "succeeded", "turn-1:2": "executing", "turn-1:3": "succeeded"}
    assert (len(fast.contexts), len(later.contexts)) == (1, 1)


@pytest.mark.parametrize("make_setup", ["sync"], indirect=True)  # the thread pool's queue
def test_a_call_waiting_for_a_worker_keeps_its_lease_and_runs(make_setup):
    setup = make_setup(lease_s=5, heartbeat_every_s=0.5)
    setup.tool("refund")

    def slow(ctx):
        time.sleep(4.5)  # past the queued call's claim + lease - margin (4 s)
        return Succeeded(downstream_id="re_slow")

    queued = Calls(Succeeded(downstream_id="re_queued"))
    results = setup.runner.execute_many(
        [_call(setup, 1, calls=slow), _call(setup, 2, calls=queued)], max_workers=1
    )
    assert [result.status for result in results] == ["succeeded", "succeeded"]
    assert len(queued.contexts) == 1
    assert Operation.objects.get(operation_key="turn-1:2").attempts == 1
