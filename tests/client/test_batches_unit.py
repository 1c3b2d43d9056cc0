"""Batches without a server: items answered 429/5xx are repeated alone, a lost answer
repeats the whole batch, a batch is split by size and sent item by item after a 413,
each item of an answer is checked, and the gateway's coalescing sends concurrent calls
together and a lone one at once, each call failing only for itself."""

import asyncio
import json

import httpx
import pytest

from effectgate_client import (
    AsyncEffectgateClient,
    AsyncRunner,
    EffectgateClient,
    InternalError,
    InvalidArguments,
    OutcomeNotRecorded,
    PayloadTooLarge,
    Runner,
    StaleAttempt,
    TransportError,
    UnexpectedResponse,
)
from effectgate_client._effects import _PostOutcome, _Register
from effectgate_client.integrations._mcp_batch import CoalescingRunner


def _problem(status, code):
    return {
        "type": f"https://effectgate.dev/problems/{code}",
        "title": code,
        "status": status,
        "detail": f"detail of {code}",
        "code": code,
        "request_id": "req_1",
    }


def _operation(body):
    return {"id": f"op_{body['operation_key']}", "status": "ready"}


def test_items_answered_5xx_are_repeated_alone_and_refusals_are_answers():
    seen = []
    answers = iter(["lost", "first", "second"])

    def handler(request):
        keys = [item["operation_key"] for item in json.loads(request.content)]
        seen.append(keys)
        step = next(answers)
        if step == "lost":
            raise httpx.ReadError("lost", request=request)
        results = []
        for key in keys:
            if key == "bad":
                results.append({"status": 422, "problem": _problem(422, "invalid_arguments")})
            elif key == "flaky" and step == "first":
                results.append({"status": 500, "problem": _problem(500, "internal_error")})
            else:
                results.append({"status": 201, "operation": _operation({"operation_key": key})})
        return httpx.Response(200, json={"results": results})

    client = EffectgateClient(
        "http://eg.test", "egr_x", transport=httpx.MockTransport(handler), sleep=lambda s: None
    )
    items = client.register_many(
        "run_1",
        [{"tool": "t", "operation_key": key, "arguments": {}} for key in ("ok", "bad", "flaky")],
    )
    assert seen == [["ok", "bad", "flaky"], ["ok", "bad", "flaky"], ["flaky"]]
    assert [item.status for item in items] == [201, 422, 201]
    assert items[2].operation == {"id": "op_flaky", "status": "ready"}
    assert isinstance(items[1].error, InvalidArguments)
    assert items[1].error.request_id == "req_1"
    assert client.stats["batch_items_repeated"] == 1


def test_an_item_still_5xx_after_every_repeat_is_its_error():
    def handler(request):
        count = len(json.loads(request.content))
        problem = {"status": 503, "problem": _problem(503, "internal_error")}
        return httpx.Response(200, json={"results": [problem] * count})

    client = EffectgateClient(
        "http://eg.test",
        "egr_x",
        transport=httpx.MockTransport(handler),
        sleep=lambda s: None,
        max_retries=2,
    )
    (item,) = client.post_outcomes(
        "run_1", [{"operation": "op_1", "attempt": 1, "kind": "succeeded"}]
    )
    assert isinstance(item.error, InternalError)
    assert item.error.repeated


class _FakeClient:
    """Records what the coalescing runner sends instead of sending it."""

    def __init__(self):
        self.sent = []
        self.max_retry_wait_s = 60
        self.max_batch_bytes = 512 * 1024

    def _register_many_plan(self, run, items):
        from effectgate_client import BatchItem

        self.sent.append(("register_many", run, [item["operation_key"] for item in items]))
        return [BatchItem(201, operation=_operation(item)) for item in items]
        yield

    def _post_outcomes_plan(self, run, items):
        from effectgate_client import BatchItem

        self.sent.append(("post_outcomes", run, [item["operation"] for item in items]))
        return [BatchItem(200, operation={"id": item["operation"]}) for item in items]
        yield

    def _register_plan(self, fields):
        self.sent.append(("register", fields["run"], [fields["operation_key"]]))
        return _operation(fields)
        yield  # a plan that sends nothing

    def _post_outcome_plan(self, operation_id, attempt, body):
        self.sent.append(("post_outcome", None, [operation_id]))
        return {"id": operation_id}
        yield

    async def _perform(self, effect):
        raise AssertionError(effect)


def _register(key, run="run_1"):
    return _Register({"run": run, "tool": "t", "operation_key": key, "arguments": {}})


def test_concurrent_registrations_of_a_run_share_a_batch_and_a_lone_one_goes_at_once():
    async def scenario():
        client = _FakeClient()
        runner = CoalescingRunner(client, window_s=0.05)  # type: ignore[arg-type]
        answers = await asyncio.gather(*(runner._perform(_register(k)) for k in "abc"))
        assert [answer["id"] for answer in answers] == ["op_a", "op_b", "op_c"]
        outcome = _PostOutcome("run_1", "op_a", 1, {"kind": "succeeded"})
        loop = asyncio.get_running_loop()
        started = loop.time()
        await runner._perform(outcome)
        alone = loop.time() - started
        lone = CoalescingRunner(client, window_s=0)  # type: ignore[arg-type]
        await lone._perform(_register("d", run="run_2"))
        return client.sent, alone

    sent, alone = asyncio.run(scenario())
    assert sent == [
        ("register_many", "run_1", ["a", "b", "c"]),
        ("post_outcome", None, ["op_a"]),
        ("register", "run_2", ["d"]),
    ]
    assert alone < 1.0


# --- size ------------------------------------------------------------------------------


def _outcome(n, size=0):
    return {"operation": f"op_{n}", "attempt": 1, "kind": "succeeded", "result": {"b": "x" * size}}


def _answering(limit=None, seen=None):
    """A handler answering each outcome 200 (413 above ``limit`` bytes), recording the
    operations of each request."""

    def handler(request):
        if limit is not None and len(request.content) > limit:
            return httpx.Response(413, json=_problem(413, "payload_too_large"))
        items = json.loads(request.content)
        if seen is not None:
            seen.append([item["operation"] for item in items])
        ops = [{"status": 200, "operation": {"id": item["operation"]}} for item in items]
        return httpx.Response(200, json={"results": ops})

    return handler


def test_a_batch_is_split_by_its_encoded_size():
    seen = []
    client = EffectgateClient(
        "http://eg.test",
        "egr_x",
        transport=httpx.MockTransport(_answering(seen=seen)),
        max_batch_bytes=10_000,
    )
    sizes = [4000, 4000, 4000, 20_000, 10]
    items = client.post_outcomes("run_1", [_outcome(n, size) for n, size in enumerate(sizes)])
    # Two of 4 KB fit under 10 KB, the third starts a request; 20 KB goes alone.
    assert seen == [["op_0", "op_1"], ["op_2"], ["op_3"], ["op_4"]]
    assert [item.operation["id"] for item in items] == [f"op_{n}" for n in range(5)]


def test_the_default_batch_limit_is_well_under_the_servers_1_mib():
    client = EffectgateClient("http://eg.test", "egr_x")
    assert client.max_batch_bytes == 512 * 1024


def test_a_batch_refused_413_is_sent_item_by_item_and_an_item_too_large_alone_is_its_error():
    seen = []
    client = EffectgateClient(
        "http://eg.test",
        "egr_x",
        transport=httpx.MockTransport(_answering(limit=50_000, seen=seen)),
        max_batch_bytes=10 << 20,
    )
    items = client.post_outcomes(
        "run_1", [_outcome(0, 30_000), _outcome(1, 30_000), _outcome(2, 60_000)]
    )
    assert seen == [["op_0"], ["op_1"]]
    assert [item.status for item in items] == [200, 200, 413]
    assert isinstance(items[2].error, PayloadTooLarge)
    assert client.stats["batch_split_413"] == 1


# --- the answer's items ----------------------------------------------------------------


REGISTRATIONS = [{"tool": "t", "operation_key": key, "arguments": {}} for key in ("a", "b")]
GOOD = {"status": 201, "operation": {"id": "op_b", "status": "ready"}}


@pytest.mark.parametrize(
    "item",
    [
        "oops",
        {"status": "201", "operation": {"id": "op_a"}},
        {"status": True, "operation": {"id": "op_a"}},
        {"status": 201},
        {"status": 500},
        {"status": 201, "operation": {"status": "ready"}},
        {"status": 201, "operation": "op_a"},
        {"status": 422, "problem": "nope"},
        {"status": 201, "problem": _problem(422, "invalid_arguments")},
        {"status": 422, "problem": _problem(422, "invalid_arguments"), "operation": {"id": "x"}},
    ],
)
def test_an_unreadable_item_of_a_batch_answer_raises_unexpected_response(item):
    client = EffectgateClient(
        "http://eg.test",
        "egr_x",
        transport=httpx.MockTransport(
            lambda request: httpx.Response(
                200, json={"results": [item, GOOD]}, headers={"X-Request-Id": "req_h"}
            )
        ),
    )
    with pytest.raises(UnexpectedResponse) as raised:
        client.register_many("run_1", REGISTRATIONS)
    assert raised.value.request_id == "req_h"


def _claiming(request):
    """Registrations answered with their inline claims."""
    attempt = {"attempt": 1, "idempotency_key": "ik", "lease_until": "2099-01-01T00:00:00Z"}
    items = json.loads(request.content)
    ops = [
        {
            "status": 201,
            "operation": {
                "id": f"op_{item['operation_key']}",
                "run": "run_1",
                "status": "executing",
                "attempt": attempt,
            },
        }
        for item in items
    ]
    return httpx.Response(200, json={"results": ops})


def _calls(call):
    return [
        {"run": "run_1", "tool": "t", "operation_key": key, "arguments": {}, "call": call}
        for key in ("a", "b")
    ]


def test_execute_many_raises_for_an_unreadable_registration_answer_and_calls_no_tool():
    def handler(request):
        return httpx.Response(200, json={"results": [{"status": 201}, {"status": 201}]})

    called = []
    runner = Runner(
        EffectgateClient("http://eg.test", "egr_x", transport=httpx.MockTransport(handler)),
        sleep=lambda s: None,
    )
    with pytest.raises(UnexpectedResponse):
        runner.execute_many(_calls(called.append))
    assert called == []


def test_an_unreadable_outcome_batch_answer_keeps_each_outcome():
    def handler(request):
        if request.url.path.endswith("/operations"):
            return _claiming(request)
        assert request.url.path.endswith("/outcomes"), request.url.path
        return httpx.Response(200, json={"results": [{"status": 200}, "junk"]})

    async def tool(ctx):
        return {"ok": 1}

    async def scenario():
        client = AsyncEffectgateClient(
            "http://eg.test", "egr_x", transport=httpx.MockTransport(handler)
        )
        return await AsyncRunner(client, sleep=asyncio.sleep).execute_many(_calls(tool))

    answers = asyncio.run(scenario())
    assert all(isinstance(answer, OutcomeNotRecorded) for answer in answers)
    assert [answer.outcome for answer in answers] == [
        {"kind": "succeeded", "result": {"ok": 1}}
    ] * 2
    assert answers[0] is not answers[1]


def test_a_refusal_answering_a_repeat_of_the_whole_batch_is_marked_repeated():
    tries = []

    def handler(request):
        tries.append(request)
        if len(tries) == 1:  # recorded, and the answer lost
            raise httpx.ReadError("lost", request=request)
        problem = {"status": 409, "problem": _problem(409, "stale_attempt")}
        return httpx.Response(200, json={"results": [problem]})

    client = EffectgateClient(
        "http://eg.test", "egr_x", transport=httpx.MockTransport(handler), sleep=lambda s: None
    )
    (item,) = client.post_outcomes("run_1", [_outcome(1)])
    assert len(tries) == 2
    assert isinstance(item.error, StaleAttempt)
    assert item.error.repeated


# --- the gateway's coalescing -----------------------------------------------------------


def _coalescing(handler, window_s, **options):
    client = AsyncEffectgateClient(
        "http://eg.test", "egr_x", transport=httpx.MockTransport(handler)
    )
    return CoalescingRunner(client, window_s=window_s, sleep=asyncio.sleep, **options)


def _registered(request):
    """Registrations (one, or a batch) answered ``rejected``, with no claim."""
    body = json.loads(request.content)
    items = body if isinstance(body, list) else [body]
    ops = [{"id": f"op_{b['operation_key']}", "run": "run_1", "status": "rejected"} for b in items]
    if isinstance(body, list):
        return httpx.Response(200, json={"results": [{"status": 201, "operation": o} for o in ops]})
    return httpx.Response(201, json=ops[0])


def test_a_call_cancelled_while_queued_is_not_sent():
    sent = []

    def handler(request):
        sent.append(request)
        return _registered(request)

    async def scenario():
        runner = _coalescing(handler, window_s=0.2)
        task = asyncio.create_task(
            runner.execute(run="run_1", tool="t", operation_key="k1", arguments={}, call=None)
        )
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)
        return runner

    runner = asyncio.run(scenario())
    assert sent == []
    assert runner._queues == {}


def test_one_large_call_does_not_fail_the_calls_it_is_queued_with():
    seen = []

    def handler(request):
        if len(request.content) > 1024 * 1024:
            return httpx.Response(413, json=_problem(413, "payload_too_large"))
        seen.append(request.url.path)
        if request.url.path.endswith("/tool-result"):
            return httpx.Response(200, json={"status": "rejected"})
        return _registered(request)

    async def scenario():
        runner = _coalescing(handler, window_s=0.05)

        async def one(n, size):
            try:
                await runner.execute(
                    run="run_1",
                    tool="t",
                    operation_key=f"k{n}",
                    arguments={"blob": "x" * size},
                    call=None,
                )
                return "ok"
            except Exception as exc:
                return type(exc).__name__

        answers = await asyncio.gather(
            one(1, 600_000), one(2, 600_000), one(3, 10), one(4, 2 << 20)
        )
        return answers, runner

    answers, runner = asyncio.run(scenario())
    # Each as execute alone: the first three registered, the one over 1 MiB refused.
    assert answers == ["ok", "ok", "ok", "PayloadTooLarge"]
    assert runner._queues == {}


@pytest.mark.parametrize(
    "invalid",
    [
        {"key": "", "arguments": {}},  # register refuses it: no operation key
        {"key": "nan", "arguments": {"x": float("nan")}},  # not JSON
    ],
)
def test_an_invalid_call_is_refused_alone_and_a_failed_request_gives_each_its_own_error(
    invalid,
):
    sent = []

    def handler(request):
        sent.append(request)
        return httpx.Response(503, json=_problem(503, "internal_error"))

    async def scenario():
        runner = _coalescing(handler, window_s=0.05)
        client = runner.client
        client.max_retries = 0

        async def one(key, arguments):
            try:
                await runner.execute(
                    run="run_1", tool="t", operation_key=key, arguments=arguments, call=None
                )
            except Exception as exc:
                return exc

        return await asyncio.gather(one("a", {}), one(**invalid), one("b", {}))

    first, refused, second = asyncio.run(scenario())
    assert isinstance(refused, ValueError)
    assert isinstance(first, InternalError)
    assert isinstance(second, InternalError)
    assert first is not second
    # The valid two went in one batch request.
    assert len(sent) == 1
    assert len(json.loads(sent[0].content)) == 2


def test_an_outcome_waiting_in_its_queue_keeps_the_lease():
    sent = []

    async def handler(request):
        path = request.url.path
        sent.append(path)
        if path.endswith("/operations"):
            body = json.loads(request.content)
            attempt = {"attempt": 1, "idempotency_key": "ik", "lease_until": "z"}
            op = {"id": "op_a", "run": "run_1", "status": "executing", "attempt": attempt}
            return httpx.Response(201, json={**op, "operation_key": body["operation_key"]})
        if path.endswith("/heartbeat"):
            return httpx.Response(200, json={"lease_until": "z"})
        if path.endswith("/outcome"):
            done = {"id": "op_a", "run": "run_1", "status": "succeeded"}
            return httpx.Response(200, json={**done, "tool_result": {"status": "succeeded"}})
        raise AssertionError(path)

    async def scenario():
        runner = _coalescing(handler, window_s=0, heartbeat_every_s=0.05)
        outcome_queue = runner._queue("outcome", "run_1")
        outcome_queue.window_s = 0.3  # the outcome's batch waits this long

        async def tool(ctx):
            return {"ok": 1}

        return await runner.execute(
            run="run_1", tool="t", operation_key="a", arguments={}, call=tool
        )

    result = asyncio.run(scenario())
    assert result.status == "succeeded"
    outcome = sent.index("/api/v1/operations/op_a/attempts/1/outcome")
    assert "/api/v1/operations/op_a/attempts/1/heartbeat" in sent[:outcome]


# --- a split batch whose later request fails ------------------------------------------


def _failing_after(first_requests, seen):
    """A handler answering each registration 201 with its inline claim for the first
    ``first_requests`` requests, then refusing the connection."""

    def handler(request):
        seen.append([item["operation_key"] for item in json.loads(request.content)])
        if len(seen) > first_requests:
            raise httpx.ConnectError("refused", request=request)
        return _claiming(request)

    return handler


def _large(key):
    return {"tool": "t", "operation_key": key, "arguments": {"pad": "x" * 4000}}


def _split_client(first_requests, seen):
    """A client sending two ``_large`` registrations per request, without repeats, to
    ``_failing_after(first_requests, seen)``."""
    return EffectgateClient(
        "http://eg.test",
        "egr_x",
        transport=httpx.MockTransport(_failing_after(first_requests, seen)),
        max_batch_bytes=10_000,
        max_retries=0,
    )


def test_a_later_request_of_a_split_batch_that_fails_ends_it_and_is_the_error_of_the_rest():
    seen = []
    client = _split_client(1, seen)
    items = client.register_many("run_1", [_large(key) for key in "abcdef"])
    # Three requests of two; the second's connection was refused, the third never sent.
    assert seen == [["a", "b"], ["c", "d"]]
    assert [item.operation["id"] for item in items[:2]] == ["op_a", "op_b"]
    assert [item.status for item in items] == [201, 201, 0, 0, 0, 0]
    assert all(isinstance(item.error, TransportError) for item in items[2:])
    assert len({id(item.error) for item in items[2:]}) == 4
    with pytest.raises(TransportError):
        items[2].unwrap()
    assert client.stats["batch_requests_failed"] == 1


def test_the_first_request_of_a_split_batch_that_fails_raises():
    seen = []
    client = _split_client(0, seen)
    with pytest.raises(TransportError):
        client.register_many("run_1", [_large(key) for key in "abcd"])
    # Nothing was answered: the rest is not sent.
    assert seen == [["a", "b"]]


def _done(operation_id):
    return {
        "id": operation_id,
        "run": "run_1",
        "status": "succeeded",
        "tool_result": {"status": "succeeded"},
    }


def _outcomes_answered(request):
    """Outcomes answered as recorded, with their tool-result envelopes: the single call
    (``/outcome``) and the batch (``/outcomes``)."""
    if request.url.path.endswith("/outcome"):
        return httpx.Response(200, json=_done(request.url.path.split("/")[-4]))
    ops = [
        {"status": 200, "operation": _done(item["operation"])}
        for item in json.loads(request.content)
    ]
    return httpx.Response(200, json={"results": ops})


def _split_then_failing(seen):
    """Registrations: the first request answered with inline claims, the second's
    connection refused; outcomes answered."""

    def handler(request):
        if request.url.path.endswith(("/outcomes", "/outcome")):
            return _outcomes_answered(request)
        seen.append([item["operation_key"] for item in json.loads(request.content)])
        if len(seen) > 1:
            raise httpx.ConnectError("refused", request=request)
        return _claiming(request)

    return handler


def _large_calls(call):
    return [
        {
            "run": "run_1",
            "tool": "t",
            "operation_key": key,
            "arguments": {"pad": "x" * 4000},
            "call": call,
        }
        for key in "abcd"
    ]


def test_execute_many_runs_the_calls_registered_before_a_later_request_failed():
    seen, called = [], []
    client = EffectgateClient(
        "http://eg.test",
        "egr_x",
        transport=httpx.MockTransport(_split_then_failing(seen)),
        max_batch_bytes=10_000,
        max_retries=0,
    )
    answers = Runner(client, sleep=lambda s: None).execute_many(
        _large_calls(lambda ctx: called.append(ctx.operation_id) or {"ok": True})
    )
    assert seen == [["a", "b"], ["c", "d"]]
    assert sorted(called) == ["op_a", "op_b"]
    assert [answer.status for answer in answers[:2]] == ["succeeded", "succeeded"]
    assert all(isinstance(answer, TransportError) for answer in answers[2:])


def test_async_execute_many_runs_the_calls_registered_before_a_later_request_failed():
    seen, called = [], []

    async def scenario():
        client = AsyncEffectgateClient(
            "http://eg.test",
            "egr_x",
            transport=httpx.MockTransport(_split_then_failing(seen)),
            max_batch_bytes=10_000,
            max_retries=0,
        )

        async def call(ctx):
            called.append(ctx.operation_id)
            return {"ok": True}

        async with client:
            return await AsyncRunner(client).execute_many(_large_calls(call))

    answers = asyncio.run(scenario())
    assert sorted(called) == ["op_a", "op_b"]
    assert [answer.status for answer in answers[:2]] == ["succeeded", "succeeded"]
    assert all(isinstance(answer, TransportError) for answer in answers[2:])


# --- an invalid call among valid ones --------------------------------------------------


def _invalid_among_valid(call):
    good = _calls(call)
    return [
        good[0],
        {**good[0], "operation_key": ""},  # execute refuses it: no operation key
        {**good[0], "operation_key": "nan", "arguments": {"x": float("nan")}},  # not JSON
        {**good[0], "operation_key": "obj", "arguments": {"x": object()}},  # not JSON
        good[1],
    ]


def test_execute_many_refuses_an_invalid_call_alone_and_sends_the_others():
    sent, called = [], []

    def handler(request):
        if request.url.path.endswith(("/outcomes", "/outcome")):
            return _outcomes_answered(request)
        sent.append([item["operation_key"] for item in json.loads(request.content)])
        return _claiming(request)

    runner = Runner(
        EffectgateClient("http://eg.test", "egr_x", transport=httpx.MockTransport(handler)),
        sleep=lambda s: None,
    )
    answers = runner.execute_many(
        _invalid_among_valid(lambda ctx: called.append(ctx.operation_id) or {"ok": True})
    )
    assert sent == [["a", "b"]]
    assert sorted(called) == ["op_a", "op_b"]
    assert answers[0].status == answers[4].status == "succeeded"
    assert isinstance(answers[1], ValueError)
    assert isinstance(answers[2], ValueError)
    assert isinstance(answers[3], TypeError)


def test_async_execute_many_of_invalid_calls_only_sends_nothing():
    def handler(request):
        raise AssertionError(f"sent {request.url}")

    async def scenario():
        client = AsyncEffectgateClient(
            "http://eg.test", "egr_x", transport=httpx.MockTransport(handler)
        )
        async with client:
            return await AsyncRunner(client).execute_many(_invalid_among_valid(None)[1:4])

    answers = asyncio.run(scenario())
    assert [type(answer) for answer in answers] == [ValueError, ValueError, TypeError]


def test_a_failure_while_a_413_is_resent_item_by_item_keeps_the_items_answered():
    seen = []
    answer = _answering(limit=50_000, seen=seen)

    def handler(request):
        if b'"op_1"' in request.content and len(request.content) < 50_000:
            raise httpx.ConnectError("refused", request=request)
        return answer(request)

    client = EffectgateClient(
        "http://eg.test",
        "egr_x",
        transport=httpx.MockTransport(handler),
        max_batch_bytes=10 << 20,
        max_retries=0,
    )
    items = client.post_outcomes(
        "run_1", [_outcome(0, 30_000), _outcome(1, 30_000), _outcome(2, 100)]
    )
    # The 413 of the three sent them one by one; op_1's connection was refused, and
    # op_2 was not sent after it.
    assert seen == [["op_0"]]
    assert [item.status for item in items] == [200, 0, 0]
    assert isinstance(items[1].error, TransportError)
    assert isinstance(items[2].error, TransportError)
    assert items[1].error is not items[2].error
    assert client.stats["batch_split_413"] == 1
    assert client.stats["batch_requests_failed"] == 1


def _partly_5xx_then_refused(answers):
    """Answers each request in turn from ``answers`` (a list per request of 201 or 503
    per item, or None: the connection refused, then and for every request after)."""
    sent = []

    def handler(request):
        keys = [item["operation_key"] for item in json.loads(request.content)]
        sent.append(keys)
        statuses = answers[min(len(sent), len(answers)) - 1]
        if statuses is None:
            raise httpx.ConnectError("refused", request=request)
        results = [
            {"status": 201, "operation": {"id": f"op_{key}", "status": "ready"}}
            if status == 201
            else {"status": 503, "problem": _problem(503, "internal_error")}
            for key, status in zip(keys, statuses, strict=True)
        ]
        return httpx.Response(200, json={"results": results})

    return handler, sent


@pytest.mark.parametrize("split", [False, True])
def test_a_repeat_of_items_answered_5xx_that_fails_keeps_the_items_answered(split):
    """The items answered 201 beside one answered 503 are registered: when the repeat of
    the 503 gets no answer, they keep their operations, in the batch's first request as
    in a later one."""
    if split:  # a, b in the first request; c (201) and d (503) in the second
        answers = [[201, 201], [201, 503], None]
        expected = [201, 201, 201, 0]
    else:
        answers = [[201, 503], None]
        expected = [201, 0]
    handler, sent = _partly_5xx_then_refused(answers)
    client = EffectgateClient(
        "http://eg.test",
        "egr_x",
        transport=httpx.MockTransport(handler),
        max_batch_bytes=10_000 if split else 10 << 20,
        max_retries=1,
        backoff_base_s=0,
    )
    keys = "abcd" if split else "ab"
    items = client.register_many("run_1", [_large(key) for key in keys])
    assert [item.status for item in items] == expected
    assert [item.operation["id"] for item in items if item.ok] == [
        f"op_{key}" for key, status in zip(keys, expected, strict=True) if status == 201
    ]
    assert isinstance(items[-1].error, TransportError)
    assert sent[-1] == [keys[-1]]  # the repeat carried the 503's item alone


def test_a_2xx_answer_that_is_not_json_is_an_unexpected_response():
    client = EffectgateClient(
        "http://eg.test",
        "egr_x",
        transport=httpx.MockTransport(lambda request: httpx.Response(200, text="<html>")),
    )
    with pytest.raises(UnexpectedResponse) as raised:
        client.get_operation("op_1")
    assert raised.value.status == 200
    assert "not JSON" in str(raised.value)


def test_a_failed_repeat_ends_the_batch_and_marks_what_was_sent_before():
    """b answered 503, its repeat refused 401 (the token revoked): the second request
    is not sent; b's error says it was sent before, c's and d's that they were not."""
    handler, sent = _partly_5xx_then_refused([[201, 503]])

    def refusing_repeats(request):
        if len(sent) >= 1:
            sent.append([item["operation_key"] for item in json.loads(request.content)])
            return httpx.Response(401, json=_problem(401, "not_authenticated"))
        return handler(request)

    client = EffectgateClient(
        "http://eg.test",
        "egr_x",
        transport=httpx.MockTransport(refusing_repeats),
        max_batch_bytes=10_000,
        max_retries=1,
        backoff_base_s=0,
    )
    items = client.register_many("run_1", [_large(key) for key in "abcd"])
    assert sent == [["a", "b"], ["b"]]
    assert [item.status for item in items] == [201, 401, 401, 401]
    assert items[0].operation["id"] == "op_a"
    assert [item.error.repeated for item in items[1:]] == [True, False, False]
    assert len({id(item.error) for item in items[1:]}) == 3


def test_a_batch_with_an_item_that_is_not_json_raises_before_sending():
    def handler(request):
        raise AssertionError("sent")

    client = EffectgateClient("http://eg.test", "egr_x", transport=httpx.MockTransport(handler))
    registrations = [_large("a"), {**_large("b"), "arguments": {"x": float("nan")}}]
    with pytest.raises(ValueError, match="not JSON compliant"):
        client.register_many("run_1", registrations)
