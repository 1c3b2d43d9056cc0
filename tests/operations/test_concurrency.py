"""Concurrency claims, proven with real concurrent HTTP clients against a live server.

Each thread has its own connection to the live server, which serves every request on
its own thread with its own database connection. In CI the database is PostgreSQL.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from operations.models import Attempt, Event, Operation, Run
from tests.conftest import contract, make_runner

THREADS = 20


def _all_at_once(live_server, token, method, path, bodies):
    barrier = threading.Barrier(len(bodies))

    def call(body):
        with httpx.Client(
            base_url=live_server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as client:
            barrier.wait()
            response = client.request(method, path, json=body)
            return response.status_code, response.json()

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(call, bodies))


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_claims_of_one_operation_one_wins(live_server):
    api = make_runner()
    api.tool("t")
    op = api.register(api.run(), "t")
    results = _all_at_once(
        live_server,
        api.token,
        "POST",
        f"/api/v1/operations/{op['id']}/attempts",
        [{"lease_s": 60}] * THREADS,
    )
    codes = sorted(code for code, _ in results)
    assert codes == [201] + [409] * (THREADS - 1)
    assert {body["code"] for code, body in results if code == 409} == {"attempt_in_progress"}
    assert Attempt.objects.filter(operation_id=op["id"]).count() == 1
    assert Event.objects.filter(stream=op["id"], kind="claimed").count() == 1
    assert Operation.objects.get(pk=op["id"]).status == "executing"


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_registrations_with_one_key_make_one_operation(live_server):
    api = make_runner()
    api.tool("t")
    run = api.run()
    body = {
        "run": run,
        "tool": "t",
        "operation_key": "order-1:refund",
        "arguments": {"payment_id": "pay_1", "amount_cents": 500},
    }
    results = _all_at_once(live_server, api.token, "POST", "/api/v1/operations", [body] * THREADS)
    codes = sorted(code for code, _ in results)
    assert codes == [200] * (THREADS - 1) + [201]
    assert len({b["id"] for _, b in results}) == 1
    assert Operation.objects.count() == 1
    assert Run.objects.get(pk=run).tool_calls == 1


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_registrations_with_one_key_and_different_intents(live_server):
    api = make_runner()
    api.tool("t")
    run = api.run()
    bodies = [
        {
            "run": run,
            "tool": "t",
            "operation_key": "order-2:refund",
            "arguments": {"payment_id": "pay_1", "amount_cents": 100 + i},
        }
        for i in range(THREADS)
    ]
    results = _all_at_once(live_server, api.token, "POST", "/api/v1/operations", bodies)
    codes = sorted(code for code, _ in results)
    assert codes == [201] + [422] * (THREADS - 1)
    assert {b["code"] for code, b in results if code == 422} == {"intent_mismatch"}
    assert Operation.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_on_one_concurrency_key_let_one_through(live_server):
    api = make_runner()
    api.tool("refund", contract("idempotent", concurrency_key="/payment_id"))
    run = api.run()
    ops = [
        api.register(run, "refund", {"payment_id": "pay_hot", "amount_cents": i + 1})["id"]
        for i in range(10)
    ]
    barrier = threading.Barrier(len(ops))

    def claim(op_id):
        with httpx.Client(
            base_url=live_server.url, headers={"Authorization": f"Bearer {api.token}"}, timeout=60
        ) as client:
            barrier.wait()
            response = client.post(f"/api/v1/operations/{op_id}/attempts", json={})
            return response.status_code, response.json()

    with ThreadPoolExecutor(len(ops)) as pool:
        results = list(pool.map(claim, ops))
    assert sorted(code for code, _ in results) == [201] + [409] * 9
    assert {b["code"] for code, b in results if code == 409} == {"concurrency_conflict"}
    assert Operation.objects.filter(status="executing").count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_registrations_in_one_run_spend_its_budget_exactly(live_server):
    """The run's budget is taken by a conditional UPDATE at the end of each registration's
    transaction, no lock held before it: under twenty racing registrations (each claiming
    inline) exactly the budget's worth are created, and the run counts exactly them."""
    api = make_runner()
    api.tool("t")
    budget = 7
    run = api.run(max_tool_calls=budget)
    bodies = [
        {
            "run": run,
            "tool": "t",
            "operation_key": f"order-{i}:refund",
            "arguments": {"payment_id": f"pay_{i}", "amount_cents": 500},
            "claim": {"lease_s": 60},
        }
        for i in range(THREADS)
    ]
    results = _all_at_once(live_server, api.token, "POST", "/api/v1/operations", bodies)
    codes = sorted(code for code, _ in results)
    assert codes == [201] * budget + [409] * (THREADS - budget)
    assert {b["code"] for code, b in results if code == 409} == {"budget_exhausted"}
    assert all(b["status"] == "executing" for code, b in results if code == 201)
    assert Run.objects.get(pk=run).tool_calls == budget
    assert Operation.objects.filter(run_id=run).count() == budget
    assert Attempt.objects.filter(operation__run_id=run).count() == budget
    # Each created operation has its two events, chained, and its head on its row.
    for op in Operation.objects.filter(run_id=run):
        events = list(Event.objects.filter(stream=op.id).order_by("seq"))
        assert [e.kind for e in events] == ["registered", "claimed"]
        assert events[1].prev_hash == events[0].hash
        assert (op.event_seq, op.event_head) == (2, events[1].hash)
