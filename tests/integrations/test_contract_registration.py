"""The contract an async adapter registers on its first call (``OnLoop``): one
registration per loop that every call awaits, retried after a failure, loud when
refused. Against the live Effectgate, through a transport that can hold or fail the
``PUT /tools`` requests."""

import asyncio

import httpx
import pytest

from effectgate_client import AsyncEffectgateClient, AsyncRunner, ProblemError, UnexpectedResponse
from effectgate_client.integrations._common import OnLoop
from operations.models import Tool
from tests.conftest import contract, make_runner

pytestmark = pytest.mark.django_db(transaction=True)


class ToolsGate(httpx.AsyncBaseTransport):
    """Passes requests to the live server; each ``PUT /tools`` waits for ``opened``,
    and the first ``fail`` of them are answered 503 without reaching the server."""

    def __init__(self, fail: int = 0) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.fail = fail
        self.opened = asyncio.Event()
        self.opened.set()
        self.puts = 0
        self.waiting = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "PUT" and request.url.path.startswith("/api/v1/tools/"):
            self.puts += 1
            self.waiting += 1
            await self.opened.wait()
            self.waiting -= 1
            if self.fail:
                self.fail -= 1
                return httpx.Response(503, text="unavailable")
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _on_loop(live_server, gate, body):
    api = make_runner()
    client = AsyncEffectgateClient(live_server.url, api.token, transport=gate, max_retries=0)
    return api, client, OnLoop(AsyncRunner(client), "refund", body)


def test_concurrent_first_calls_both_wait_for_the_one_registration(live_server):
    gate = ToolsGate()
    gate.opened.clear()
    api, client, on_loop = _on_loop(live_server, gate, contract("irreversible"))

    async def main():
        first = asyncio.ensure_future(on_loop.get())
        second = asyncio.ensure_future(on_loop.get())
        while gate.waiting == 0:
            await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)
        # The registration is held: neither call may go on before it is done.
        assert not first.done()
        assert not second.done()
        gate.opened.set()
        runners = await asyncio.gather(first, second)
        third = await on_loop.get()
        await client.aclose()
        return runners, third

    (one, two), three = asyncio.run(main())
    assert one is two is three
    assert gate.puts == 1
    assert (
        Tool.objects.filter(name="refund", owner=api.runner, active_version__isnull=False).count()
        == 1
    )


def test_a_failed_registration_is_tried_again_by_the_next_call(live_server):
    gate = ToolsGate(fail=1)
    api, client, on_loop = _on_loop(live_server, gate, contract("irreversible"))

    async def main():
        with pytest.raises(UnexpectedResponse) as caught:
            await on_loop.get()
        assert caught.value.status == 503
        await on_loop.get()
        await on_loop.get()
        await client.aclose()

    asyncio.run(main())
    assert gate.puts == 2
    assert (
        Tool.objects.filter(name="refund", owner=api.runner, active_version__isnull=False).count()
        == 1
    )


def test_a_refused_contract_fails_every_call_loudly(live_server):
    gate = ToolsGate()
    _, client, on_loop = _on_loop(live_server, gate, contract("no_such_class"))

    async def main():
        for _ in range(2):
            with pytest.raises(ProblemError) as caught:
                await on_loop.get()
            assert caught.value.code == "invalid_contract"
        await client.aclose()

    asyncio.run(main())
    assert gate.puts == 2
    assert not Tool.objects.filter(name="refund").exists()
