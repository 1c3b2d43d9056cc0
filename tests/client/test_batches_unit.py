"""Batches without a server: items answered 429/5xx are repeated alone, a lost answer
repeats the whole batch, and the gateway's coalescing sends concurrent calls together
and a lone one at once."""

import asyncio
import json

import httpx

from effectgate_client import EffectgateClient, InternalError, InvalidArguments
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
