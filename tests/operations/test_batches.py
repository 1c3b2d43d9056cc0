"""Batches (api.md, Batches): registrations and outcomes, each item its own unit, in
order, with the single call's answer or problem; budgets exact under racing batches on
real concurrent clients against a live server."""

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.conf import settings

from operations.audit.chains import chains_verify
from operations.models import Attempt, Event, Operation, Run
from tests.conftest import contract, make_runner

POSTGRES = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def _item(run: str, key: str, tool: str = "t", n: int = 1, **extra):
    return {
        "run": run,
        "tool": tool,
        "operation_key": key,
        "arguments": {"payment_id": f"pay_{n}", "amount_cents": 100 + n},
        **extra,
    }


def _batch(api, items, path="/api/v1/operations", **kwargs):
    response = api.post(path, items, HTTP_X_REQUEST_ID="req-batch-1", **kwargs)
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def test_each_item_answers_as_its_single_call_in_order_and_none_undoes_another(api):
    api.tool("t")
    run = api.run()
    first = _item(run, "k1", claim={"lease_s": 30})
    results = _batch(
        api,
        [
            first,
            {"run": run, "tool": "t", "arguments": {}},  # no operation_key
            {**_item(run, "k3"), "claim": {"lease_s": 0}},  # invalid
            _item(run, "k4", tool="nope"),
            first,  # the same key and intent again: a replay
            {**first, "arguments": {"payment_id": "other", "amount_cents": 1}},
            _item(run, "k7", n=7),
        ],
    )
    statuses = [item["status"] for item in results]
    assert statuses == [201, 400, 400, 404, 200, 422, 201]
    codes = [item["problem"]["code"] for item in results if "problem" in item]
    assert codes == ["operation_key_required", "invalid_request", "unknown_tool", "intent_mismatch"]
    assert results[2]["problem"]["errors"] == [
        {"path": "/claim/lease_s", "message": "Ensure this value is greater than or equal to 1."}
    ]
    assert {item["problem"]["request_id"] for item in results if "problem" in item} == {
        "req-batch-1"
    }
    created = results[0]["operation"]
    assert created["status"] == "executing"
    assert created["attempt"]["attempt"] == 1
    assert results[4]["operation"]["id"] == created["id"]
    assert results[6]["operation"]["status"] == "ready"
    # What each item answered is what the ledger holds, and every chain verifies.
    assert api.operation(created["id"])["status"] == "executing"
    assert Operation.objects.filter(run_id=run).count() == 2
    assert Run.objects.get(pk=run).tool_calls == 2
    assert chains_verify().ok


def test_approvals_and_policies_apply_per_item(api):
    api.tool("t")
    api.tool("needs", contract("irreversible", approval={"mode": "always"}))
    run = api.run()
    results = _batch(
        api,
        [
            _item(run, "a", tool="needs", claim={"lease_s": 30}),
            _item(run, "b", claim={"lease_s": 30}),
            _item(run, "c", approval={"require": True, "reason": "a person looks"}),
        ],
    )
    assert [item["status"] for item in results] == [201, 201, 201]
    ops = [item["operation"] for item in results]
    assert [op["status"] for op in ops] == ["awaiting_approval", "executing", "awaiting_approval"]
    assert ops[0]["attempt"] is None
    assert "claim_error" not in ops[0]  # as the single call answers: no attempt yet
    assert ops[0]["approval"]["status"] == "pending"


def test_a_batch_crossing_the_budget_gets_exactly_the_remainder(api):
    api.tool("t")
    run = api.run(max_tool_calls=3)
    results = _batch(api, [_item(run, f"k{i}", n=i) for i in range(5)])
    assert [item["status"] for item in results] == [201, 201, 201, 409, 409]
    assert {item["problem"]["code"] for item in results[3:]} == {"budget_exhausted"}
    assert Run.objects.get(pk=run).tool_calls == 3


@pytest.mark.parametrize("size", [0, 51])
def test_an_empty_or_oversized_batch_is_refused_whole(api, size):
    api.tool("t")
    run = api.run()
    response = api.post("/api/v1/operations", [_item(run, f"k{i}") for i in range(size)])
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_request"
    assert response.json()["errors"] == [{"path": "/", "message": "A batch holds 1 to 50 items."}]
    assert not Operation.objects.filter(run_id=run).exists()


def test_outcomes_of_a_run_in_one_batch(api, other_api):
    api.tool("t")
    run, other_run = api.run(), api.run()
    ops = [
        item["operation"]
        for item in _batch(api, [_item(run, f"k{i}", n=i, claim={"lease_s": 30}) for i in range(3)])
    ]
    elsewhere = api.register(other_run, "t", {"payment_id": "x", "amount_cents": 5}, claim={})
    other_api.tool("t2")
    theirs = other_api.register(
        other_api.run(), "t2", {"payment_id": "y", "amount_cents": 5}, claim={}
    )
    results = _batch(
        api,
        [
            {"operation": ops[0]["id"], "attempt": 1, "kind": "succeeded", "downstream_id": "re_0"},
            {"operation": ops[1]["id"], "attempt": 1, "kind": "failed"},  # no code
            {"operation": ops[1]["id"], "attempt": 2, "kind": "succeeded"},
            {"operation": elsewhere["id"], "attempt": 1, "kind": "succeeded"},
            {"operation": theirs["id"], "attempt": 1, "kind": "succeeded"},
            {"operation": ops[2]["id"], "attempt": 1, "kind": "failed", "code": "card_declined"},
            {"operation": ops[0]["id"], "attempt": 1, "kind": "unknown"},
        ],
        path=f"/api/v1/runs/{run}/outcomes",
    )
    assert [item["status"] for item in results] == [200, 400, 404, 404, 404, 200, 409]
    assert results[0]["operation"]["status"] == "succeeded"
    assert results[0]["operation"]["tool_result"]["message"].endswith("(reference re_0).")
    assert results[1]["problem"]["errors"] == [
        {"path": "/code", "message": "A failed outcome needs a code."}
    ]
    assert [results[i]["problem"]["code"] for i in (2, 3, 4, 6)] == [
        "not_found",
        "not_found",
        "not_found",
        "outcome_conflict",
    ]
    # The items refused left their operations as they were.
    assert api.operation(elsewhere["id"])["status"] == "executing"
    assert other_api.operation(theirs["id"])["status"] == "executing"
    assert api.operation(ops[1]["id"])["status"] == "executing"
    # The conflict is recorded, as the single call records it.
    assert Event.objects.filter(stream=ops[0]["id"], kind="outcome_conflict").count() == 1
    assert chains_verify().ok


def test_an_outcome_batch_of_an_unknown_run_or_not_a_list_is_refused_whole(api, other_api):
    other_run = other_api.run()
    item = {"operation": "op_x", "attempt": 1, "kind": "succeeded"}
    response = api.post(f"/api/v1/runs/{other_run}/outcomes", [item])
    assert (response.status_code, response.json()["code"]) == (404, "not_found")
    response = api.post(f"/api/v1/runs/{api.run()}/outcomes", item)
    assert (response.status_code, response.json()["code"]) == (400, "invalid_request")


@pytest.mark.skipif(not POSTGRES, reason="racing transactions need PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_racing_batches_crossing_the_budget_get_exactly_the_remainder_in_total(live_server):
    """Two clients, each sending a batch of 20 inline-claimed registrations at once into a
    run whose budget is 30 tool calls: exactly 30 succeed in total, the rest are
    budget_exhausted, and the run counts exactly them."""
    api = make_runner()
    api.tool("t")
    budget, size = 30, 20
    run = api.run(max_tool_calls=budget)
    barrier = threading.Barrier(2)

    def send(client_index: int) -> list[dict]:
        items = [
            _item(run, f"c{client_index}-{i}", n=client_index * 100 + i, claim={"lease_s": 60})
            for i in range(size)
        ]
        with httpx.Client(
            base_url=live_server.url, headers={"Authorization": f"Bearer {api.token}"}, timeout=120
        ) as client:
            barrier.wait()
            response = client.post("/api/v1/operations", json=items)
            assert response.status_code == 200, response.text
            return response.json()["results"]

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(send, range(2)))
    statuses = [item["status"] for results in answers for item in results]
    assert statuses.count(201) == budget
    assert statuses.count(409) == 2 * size - budget
    refused = [item for results in answers for item in results if item["status"] == 409]
    assert {item["problem"]["code"] for item in refused} == {"budget_exhausted"}
    # Within each batch the items that got the budget precede those refused: in order.
    for results in answers:
        got = [item["status"] for item in results]
        assert got == sorted(got), got
    assert Run.objects.get(pk=run).tool_calls == budget
    assert Operation.objects.filter(run_id=run, status="executing").count() == budget
    assert Attempt.objects.filter(operation__run_id=run).count() == budget
    assert chains_verify().ok


@pytest.mark.skipif(not POSTGRES, reason="the set-based write is PostgreSQL's (RETURNING)")
def test_a_batch_of_lean_registrations_is_written_set_based_in_one_transaction(api):
    """On PostgreSQL the lean items of a batch are one transaction of a fixed number of
    statements, whatever their number; each has its attempt and its two chained events."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    api.tool("t")
    counts = []
    for size in (2, 20):
        run = api.run(max_tool_calls=100, max_turns=9)
        items = [
            _item(run, f"s{size}-{i}", n=i, claim={"lease_s": 30}, turn=3) for i in range(size)
        ]
        with CaptureQueriesContext(connection) as seen:
            results = _batch(api, items)
        assert [item["status"] for item in results] == [201] * size
        assert {item["operation"]["status"] for item in results} == {"executing"}
        counts.append([q["sql"][:80] for q in seen.captured_queries])
        inserts = [q for q in counts[-1] if 'INTO "operations_operation"' in q]
        assert len(inserts) == 1, inserts
        stored = Run.objects.get(pk=run)
        assert (stored.tool_calls, stored.turns) == (size, 3)
        assert Attempt.objects.filter(operation__run_id=run).count() == size
        assert Event.objects.filter(stream__in=[i["operation"]["id"] for i in results]).count() == (
            2 * size
        )
        # Each answer is what a later read of the operation says.
        for item in results[:3]:
            answered = {k: v for k, v in item["operation"].items() if k != "attempt"}
            assert api.operation(item["operation"]["id"]) == answered
    assert len(counts[0]) == len(counts[1]), counts
    assert chains_verify().ok


def test_a_concurrency_key_taken_inside_the_batch_answers_as_single_calls(api):
    """Two items on one resource: the set-based write finds the second refused by the
    concurrency key's index, writes nothing, and both go as single calls: the first
    executes, the second is registered ready with the claim's conflict, as two single
    calls answer."""
    api.tool("c", contract("irreversible", concurrency_key="/payment_id"))
    run = api.run(max_tool_calls=5)
    same = {"payment_id": "pay_same", "amount_cents": 100}
    results = _batch(
        api,
        [
            {**_item(run, "c1", tool="c", claim={"lease_s": 30}), "arguments": same},
            {**_item(run, "c2", tool="c", claim={"lease_s": 30}), "arguments": same},
            _item(run, "t1", tool="c", n=3, claim={"lease_s": 30}),
        ],
    )
    assert [item["status"] for item in results] == [201, 201, 201]
    ops = [item["operation"] for item in results]
    assert [op["status"] for op in ops] == ["executing", "ready", "executing"]
    assert ops[1]["claim_error"]["code"] == "concurrency_conflict"
    assert Run.objects.get(pk=run).tool_calls == 3
    assert chains_verify().ok


def test_replays_and_new_keys_mixed_in_one_batch_count_only_the_new(api):
    api.tool("t")
    run = api.run(max_tool_calls=4)
    first = _batch(api, [_item(run, f"r{i}", n=i, claim={"lease_s": 30}) for i in range(2)])
    again = _batch(api, [_item(run, f"r{i}", n=i, claim={"lease_s": 30}) for i in range(4)])
    assert [item["status"] for item in again] == [200, 200, 201, 201]
    assert [item["operation"]["id"] for item in again[:2]] == [
        item["operation"]["id"] for item in first
    ]
    over = _batch(api, [_item(run, "r9", n=9)])
    assert over[0]["problem"]["code"] == "budget_exhausted"
    assert Run.objects.get(pk=run).tool_calls == 4


def _claimed(api, run, prefix, size, tool="t"):
    items = [_item(run, f"{prefix}{i}", tool=tool, n=i, claim={"lease_s": 30}) for i in range(size)]
    return [item["operation"]["id"] for item in _batch(api, items)]


@pytest.mark.skipif(not POSTGRES, reason="the set-based write is PostgreSQL's")
def test_an_outcome_batch_sends_the_same_statements_for_2_as_for_20(api):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    api.tool("t")
    seen_counts = []
    for size in (2, 20):
        run = api.run()
        ids = _claimed(api, run, f"o{size}-", size)
        body = [
            {"operation": op, "attempt": 1, "kind": "succeeded", "downstream_id": f"re_{n}"}
            for n, op in enumerate(ids)
        ]
        with CaptureQueriesContext(connection) as seen:
            results = _batch(api, body, path=f"/api/v1/runs/{run}/outcomes")
        assert [item["status"] for item in results] == [200] * size
        assert {item["operation"]["status"] for item in results} == {"succeeded"}
        seen_counts.append([q["sql"][:80] for q in seen.captured_queries])
        for n, op in enumerate(ids):
            stored = Operation.objects.get(pk=op)
            assert (stored.status, stored.downstream_id, stored.event_seq) == (
                "succeeded",
                f"re_{n}",
                3,
            )
            assert Attempt.objects.get(operation_id=op).status == "succeeded"
        # What each item answered is what a later read says.
        answered = {k: v for k, v in results[0]["operation"].items() if k != "tool_result"}
        assert api.operation(ids[0]) == answered
    assert len(seen_counts[0]) == len(seen_counts[1]), seen_counts
    assert chains_verify().ok


def test_an_outcome_batch_ends_each_operation_as_its_single_call_would(api):
    """Every kind of outcome in one batch, on tools of each effect class: each operation
    ends where the same outcome posted alone leaves it."""
    api.tool("t")
    api.tool("irr", contract("irreversible"))
    outcomes = [
        ("t", {"kind": "succeeded", "downstream_id": "re_1", "cost": 2.5}),
        ("t", {"kind": "failed", "code": "rate_limited"}),
        ("t", {"kind": "failed", "code": "card_declined", "detail": "declined"}),
        ("t", {"kind": "unknown"}),
        ("irr", {"kind": "unknown"}),
        ("irr", {"kind": "failed", "code": "not_sent"}),
    ]
    ended = []
    for together in (True, False):
        run = api.run()
        ids = [
            _claimed(api, run, f"{together}{n}", 1, tool=tool)[0]
            for n, (tool, _) in enumerate(outcomes)
        ]
        if together:
            body = [
                {"operation": op, "attempt": 1, **o}
                for op, (_, o) in zip(ids, outcomes, strict=True)
            ]
            results = _batch(api, body, path=f"/api/v1/runs/{run}/outcomes")
            assert [item["status"] for item in results] == [200] * len(outcomes)
        else:
            for op, (_, o) in zip(ids, outcomes, strict=True):
                assert api.post(f"/api/v1/operations/{op}/attempts/1/outcome", o).status_code == 200
        ended.append(
            (
                [
                    (s.status, s.error_code, s.attempts, s.unknown_sticky)
                    for s in (Operation.objects.get(pk=op) for op in ids)
                ],
                str(Run.objects.get(pk=run).spend),
                [
                    list(Event.objects.filter(stream=op).values_list("kind", flat=True))
                    for op in ids
                ],
            )
        )
    assert ended[0] == ended[1]
    assert chains_verify().ok


def test_a_breaker_counts_a_batch_of_outcomes_as_consecutive_single_calls(api):
    """Failures and a success of one tool in one batch: the success between them resets
    the count, as it does between single calls, so the third failure does not open it."""
    from operations.models import Tool

    body = contract("idempotent", breaker={"failure_codes": ["upstream_5xx"], "threshold": 2})
    body["retry"]["max_attempts"] = 10
    api.tool("pay", body)
    run = api.run()
    ids = _claimed(api, run, "b", 3, tool="pay")
    kinds = [
        {"kind": "failed", "code": "upstream_5xx"},
        {"kind": "succeeded"},
        {"kind": "failed", "code": "upstream_5xx"},
    ]
    body = [{"operation": op, "attempt": 1, **k} for op, k in zip(ids, kinds, strict=True)]
    results = _batch(api, body, path=f"/api/v1/runs/{run}/outcomes")
    assert [item["status"] for item in results] == [200, 200, 200]
    tool = Tool.objects.get(pk="pay")
    assert (tool.breaker_state, tool.breaker_failures) == ("closed", 1)
    # A second failure in the next batch opens it, as a second consecutive single call.
    more = _claimed(api, run, "c", 1, tool="pay")
    _batch(
        api,
        [
            {"operation": more[0], "attempt": 1, "kind": "failed", "code": "upstream_5xx"},
            {"operation": ids[0], "attempt": 1, "kind": "failed", "code": "upstream_5xx"},
        ],
        path=f"/api/v1/runs/{run}/outcomes",
    )
    tool = Tool.objects.get(pk="pay")
    assert (tool.breaker_state, tool.breaker_failures) == ("open", 2)
