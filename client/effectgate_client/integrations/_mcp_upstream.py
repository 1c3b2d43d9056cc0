"""The MCP gateway's side towards its upstream servers: one link per upstream (kept
open, pinged before each call, reopened when lost) and how an upstream's answer becomes
an outcome for Effectgate (``mcp_gateway`` documents the rules)."""

from __future__ import annotations

import functools
import json
import logging
import re
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, cast

import anyio

from .._version import __version__
from ..outcomes import Failed, NotSent, Unknown
from ._mcp_config import UpstreamConfig

try:
    import mcp_types as types
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
    from mcp_types import (
        CONNECTION_CLOSED,
        INVALID_PARAMS,
        METHOD_NOT_FOUND,
        REQUEST_TIMEOUT,
    )
except ImportError as exc:  # the [mcp] extra is not installed
    _MISSING_MCP: ImportError | None = exc
else:
    _MISSING_MCP = None

logger = logging.getLogger("effectgate_client.mcp_gateway")

VERSION = __version__
ERROR_CODE_META = "effectgate/error_code"
# Matched in full: with match(), a "$" would also admit a final newline.
OUTCOME_CODE = re.compile(r"[a-z0-9_.:-]{1,64}")
# How long a liveness ping before each call may take; a slow answer is not a dead link.
PING_TIMEOUT_S = 5.0
# How long to keep trying to reopen a lost link before answering not_sent.
RECONNECT_WINDOW_S = 10.0
# How long starting an upstream and its MCP handshake may take (at least).
CONNECT_TIMEOUT_S = 15.0
# The result kept in Effectgate for replays; a larger answer keeps only a note.
MAX_STORED_RESULT_BYTES = 256 * 1024


def _one_line(text: str, limit: int = 500) -> str:
    return " ".join(str(text).split())[:limit]


def _describe(exc: BaseException) -> str:
    """One line naming the innermost first failure (task groups wrap it in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return _one_line(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


# --- upstream connections ----------------------------------------------------------------


class UpstreamLink:
    """One upstream MCP server: a client session held open by a task of the gateway's
    task group, opened again when it is found lost (a stdio upstream is restarted)."""

    def __init__(self, config: UpstreamConfig, task_group: Any, timeout_s: float) -> None:
        self.config = config
        self.timeout_s = timeout_s
        self._task_group = task_group
        self._session: ClientSession | None = None
        self._stop: anyio.Event | None = None
        self._lock = anyio.Lock()

    @property
    def name(self) -> str:
        return self.config.name

    def _transport(self) -> AbstractAsyncContextManager[Any]:
        if self.config.command:
            command = self.config.command
            return stdio_client(
                StdioServerParameters(
                    command=command[0],
                    args=list(command[1:]),
                    env=dict(self.config.env) or None,
                    cwd=self.config.cwd,
                )
            )
        assert self.config.url is not None
        return streamable_http_client(self.config.url)

    async def _hold(self, stop: anyio.Event, *, task_status: Any) -> None:
        """Open the connection, hand its session to ``_open``, keep it until ``stop``."""
        started = False
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(
                    ClientSession(
                        read,
                        write,
                        client_info=types.Implementation(name="effectgate-mcp", version=VERSION),
                    )
                )
                with anyio.fail_after(max(self.timeout_s, CONNECT_TIMEOUT_S)):
                    await session.initialize()
                started = True
                task_status.started(session)
                await stop.wait()
        except Exception as exc:
            if not started:
                raise
            logger.info("upstream %s: connection closed (%s)", self.name, _describe(exc))

    async def _open(self) -> ClientSession:
        if self._stop is not None:
            self._stop.set()
        self._session = None
        stop = anyio.Event()
        session = await self._task_group.start(functools.partial(self._hold, stop))
        self._stop, self._session = stop, session
        return session

    async def connect(self) -> None:
        """Open the first connection (start-up: failures are the operator's to see)."""
        async with self._lock:
            await self._open()

    async def close(self) -> None:
        if self._stop is not None:
            self._stop.set()
        self._session = None

    async def list_tools(self) -> list[types.Tool]:
        session = await self.ready_session()
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            with anyio.fail_after(self.timeout_s):
                page = await session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def ready_session(self) -> ClientSession:
        """A session that answered a ping just now, reconnecting once when the link is
        lost. Raises ``NotSent``: when it cannot, nothing of the call has left."""
        async with self._lock:
            if self._session is not None:
                try:
                    with anyio.fail_after(min(self.timeout_s, PING_TIMEOUT_S)):
                        await self._session.send_ping()
                    return self._session
                except TimeoutError:
                    # Alive but slow (busy): reconnecting would cut its calls in flight.
                    raise NotSent(
                        f"upstream {self.name} did not answer a ping in time; not called"
                    ) from None
                except MCPError as exc:
                    if exc.code == REQUEST_TIMEOUT:
                        raise NotSent(
                            f"upstream {self.name} did not answer a ping in time; not called"
                        ) from None
                    if exc.code != CONNECTION_CLOSED:
                        # It answered (an error to a ping is still an answer): the link
                        # is alive; reconnecting would cut other calls in flight.
                        return self._session
                    logger.warning("upstream %s: link lost (%s); reconnecting", self.name, exc)
                except Exception as exc:
                    logger.warning(
                        "upstream %s: link lost (%s); reconnecting", self.name, _describe(exc)
                    )
            # A restarting upstream (a supervisor bringing it back) gets a few seconds.
            deadline = anyio.current_time() + RECONNECT_WINDOW_S
            delay = 0.2
            while True:
                try:
                    return await self._open()
                except Exception as exc:
                    self._session = None
                    if anyio.current_time() + delay > deadline:
                        raise NotSent(
                            f"upstream {self.name} could not be reached: {_describe(exc)}"
                        ) from exc
                await anyio.sleep(delay)
                delay = min(2.0, delay * 2)

    async def call(
        self, tool: str, arguments: dict[str, Any], meta: dict[str, Any]
    ) -> types.CallToolResult:
        """One ``tools/call``; raises the outcome when it did not answer a result.

        ``send_request`` rather than ``ClientSession.call_tool``: the gateway relays the
        answer as it came, without a second request to revalidate it.
        """
        try:
            session = await self.ready_session()
        except anyio.get_cancelled_exc_class():
            # The client gave up before anything was sent: the tool never ran.
            raise NotSent(f"the call was cancelled before it was sent to {self.name}") from None
        # ``_meta`` is an open map (RequestParamsMeta: any key, any value).
        params_meta = cast("types.RequestParamsMeta", meta)
        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name=tool, arguments=arguments, _meta=params_meta)
        )
        try:
            # The read timeout starts once the request is written; the outer bound also
            # covers a write that never completes (it may have started: unknown).
            with anyio.fail_after(self.timeout_s + PING_TIMEOUT_S):
                return await session.send_request(
                    request, types.CallToolResult, request_read_timeout_seconds=self.timeout_s
                )
        except MCPError as exc:
            if exc.code in (METHOD_NOT_FOUND, INVALID_PARAMS):
                # The upstream refused the request itself: the tool never ran.
                raise Failed("upstream_refused", f"upstream {self.name}: {exc.message}") from exc
            if exc.code == REQUEST_TIMEOUT:
                raise Unknown(
                    "timeout_unknown",
                    f"upstream {self.name} did not answer within {self.timeout_s:g} s "
                    "after the request was sent",
                ) from exc
            if exc.code == CONNECTION_CLOSED:
                raise Unknown(
                    "connection_lost",
                    f"the connection to upstream {self.name} was lost after the request was sent",
                ) from exc
            raise Unknown(
                "upstream_error_unknown",
                f"upstream {self.name} answered JSON-RPC error {exc.code} after the request "
                f"was sent: {exc.message}",
            ) from exc
        except TimeoutError as exc:
            raise Unknown(
                "timeout_unknown", f"upstream {self.name} did not answer in time"
            ) from exc
        except Exception as exc:
            raise Unknown(
                "upstream_unreadable",
                f"upstream {self.name}: {type(exc).__name__} after the request was sent",
            ) from exc


# --- answers ------------------------------------------------------------------------------


def _stored_result(result: types.CallToolResult) -> dict[str, Any]:
    """What Effectgate keeps of a successful answer, for a replay to answer again."""
    stored = {
        "content": [
            block.model_dump(mode="json", by_alias=True, exclude_none=True)
            for block in result.content
        ],
        "structuredContent": result.structured_content,
    }
    size = len(json.dumps(stored))  # as sent: non-ASCII characters escaped
    if size > MAX_STORED_RESULT_BYTES:
        return {
            "content": [
                {
                    "type": "text",
                    "text": f"(the upstream's answer, {size} bytes of JSON, was too large to keep)",
                }
            ],
            "structuredContent": None,
            "truncated": True,
        }
    return stored


def _upstream_failure(result: types.CallToolResult) -> Failed | Unknown:
    """An ``isError`` answer. Failed only when the upstream says which error with
    ``_meta["effectgate/error_code"]`` (its way of saying nothing was committed): an SDK
    server turns any exception into ``isError``, also one raised after the effect, so an
    error without a code is ``unknown``. ``not_sent`` is Effectgate's to say, not an
    upstream's (Effectgate retries it whatever the tool)."""
    meta = result.meta or {}
    code = meta.get(ERROR_CODE_META)
    text = " ".join(block.text for block in result.content if isinstance(block, types.TextContent))
    detail = text[:4000] or "the upstream answered an error"
    if not isinstance(code, str) or not OUTCOME_CODE.fullmatch(code):
        return Unknown("upstream_error_unknown", detail)
    if code == "not_sent":
        code = "upstream_not_sent"
    return Failed(code, detail)
