"""Both clients name themselves to Effectgate with the package's version: the
``User-Agent`` of every request they send is ``effectgate-client/<__version__>``, and
the MCP gateway tells its upstream servers the same version."""

import asyncio

import httpx
import pytest

import effectgate_client
from effectgate_client import AsyncEffectgateClient, EffectgateClient
from effectgate_client.integrations import _mcp_upstream
from tests.conftest import make_runner

pytestmark = pytest.mark.django_db(transaction=True)

EXPECTED = f"effectgate-client/{effectgate_client.__version__}"


class HeaderRecorder(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """Sends each request to the live server and keeps the User-Agent it carried."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.inner_async = httpx.AsyncHTTPTransport()
        self.agents: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.agents.append(request.headers["User-Agent"])
        return self.inner.handle_request(request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.agents.append(request.headers["User-Agent"])
        return await self.inner_async.handle_async_request(request)


def test_the_sync_client_sends_its_version_as_user_agent(live_server):
    recorder = HeaderRecorder()
    with EffectgateClient(live_server.url, make_runner().token, transport=recorder) as client:
        run = client.create_run(principal="user:ua")
        assert client.get_run(run["id"])["id"] == run["id"]
    assert recorder.agents == [EXPECTED, EXPECTED]
    assert effectgate_client.__version__ == "1.0.0"


def test_the_async_client_sends_its_version_as_user_agent(live_server):
    recorder = HeaderRecorder()
    token = make_runner().token

    async def scenario() -> str:
        async with AsyncEffectgateClient(live_server.url, token, transport=recorder) as client:
            run = await client.create_run(principal="user:ua")
            return (await client.get_run(run["id"]))["status"]

    assert asyncio.run(scenario()) == "active"
    assert recorder.agents == [EXPECTED, EXPECTED]


def test_a_caller_named_user_agent_replaces_the_default(live_server):
    recorder = HeaderRecorder()
    with EffectgateClient(
        live_server.url, make_runner().token, transport=recorder, user_agent="billing-agent/3"
    ) as client:
        client.create_run(principal="user:ua")
    assert recorder.agents == ["billing-agent/3"]


def test_the_mcp_gateway_names_the_client_version_to_upstreams():
    assert effectgate_client.__version__ == _mcp_upstream.VERSION
