"""``effectgate-mcp``: an MCP server that puts every ``tools/call`` through Effectgate.

It fronts one or more upstream MCP servers (spawned over stdio, or reached over
streamable HTTP), exposes the tools its configuration lists under the upstreams' own
names, and runs each call with ``Runner.execute``: register the operation, wait for a
person's approval when the contract asks for one, claim an attempt, call the upstream
with the attempt's idempotency key, post what happened, and answer the model with
Effectgate's envelope. Every call runs on the server's event loop (``AsyncRunner``
over ``AsyncEffectgateClient``), never in a worker thread. Start it with::

    EFFECTGATE_TOKEN=egr_... effectgate-mcp --config gateway.toml            # stdio
    EFFECTGATE_TOKEN=egr_... effectgate-mcp --config gateway.toml --http 127.0.0.1:8765

and point the MCP client at it (stdio: the command above; HTTP: ``http://HOST:PORT/mcp``).

Configuration (TOML; an unknown key is an error)::

    [effectgate]
    url = "http://127.0.0.1:8000"     # Effectgate
    token_env = "EFFECTGATE_TOKEN"     # the variable that holds the runner token (default)
    principal = "user:alice"           # whom the calls act for; or:
    # principal_from = "client_info"   # "client:<the MCP client's clientInfo name>"
    # session = "alice-laptop"         # names the session in derived operation keys
    approval_wait_s = 0                # how long one call may wait (approval, backoff);
                                       # above 0, clients that open links get the page
    upstream_timeout_s = 30            # how long to wait for an upstream's answer
    # console_url = "https://effectgate.internal"   # approval links (default: url)
    # default_effect_class = "idempotent"           # also expose tools not listed below
    # lease_s = 30                                   # each attempt's lease
    # budgets = { max_tool_calls = 200 }             # of each principal's run
    # batch_window_ms = 2                            # see "Parallel calls" below

    [[upstream]]
    name = "payments"
    command = ["python", "payments_server.py"]     # stdio; or url = "http://host/mcp"
    # env = { PAYMENTS_API = "..." }  # added to a minimal environment (never the token)
    # cwd = "/srv/payments"
    # default_effect_class = "read_only"           # expose this upstream's other tools

    [upstream.tools.send_refund]                   # a contract block (api.md, Tools)
    effect_class = "irreversible"
    approval = { mode = "rules", rules = [{ path = "/amount_cents", op = "gt", value = 50000 }] }
    reconcile = { mode = "manual" }

At start-up the gateway connects to every upstream, lists its tools and registers the
contract of each exposed tool (``PUT /tools/{name}``) from the upstream's input schema
(unless the block gives ``input_schema``), its description and the block. A new contract
that weakens the active one is stored inactive by Effectgate: the gateway logs a warning
naming the reasons, and calls keep using the active version until a person activates
the new one. A listed tool the upstream does not have, two upstreams exposing the same
name, a contract Effectgate refuses, a missing token or an unknown key stop the gateway
with a one-line message and a non-zero exit status. The token is never logged.

**Operation keys.** A call is one operation, named by its operation key: the client's
``_meta["effectgate/operation_key"]`` when it gives one, else a key derived from the
session, the tool and the canonical JSON of the arguments. The session is the configured
``session``, else the principal and the client's ``clientInfo`` name; never a transport
session id, so a client that reconnects and retries a call it sent before gets the same
operation back, not a second effect. The flip side: two calls with identical arguments
in one session are one operation (the second answers what the first did). A client that
deliberately makes the same call twice must give each its own
``_meta["effectgate/operation_key"]`` (keys are per gateway token; reuse a key only for
a retry of the same call).

**What the upstream receives.** The arguments (with an approver's edits applied) and
``_meta = {"effectgate/idempotency_key": ..., "effectgate/operation_id": ...}``: the key
is the same for every attempt of one operation, so an upstream that deduplicates by it
makes retries safe for repeatable tools.

**How an attempt ends** (the outcome posted to Effectgate):

- the upstream answers a result: ``succeeded`` (its content and structured content are
  kept as the operation's result, so a replayed call answers them again);
- the upstream answers ``isError: true``: ``failed`` with the code the upstream puts in
  the result's ``_meta["effectgate/error_code"]`` (``[a-z0-9_.:-]``, at most 64; its
  way of saying nothing was committed; ``not_sent`` becomes ``upstream_not_sent``),
  else ``unknown`` (an SDK server reports an exception raised after the commit as
  ``isError`` too); list a code in ``retry.retryable_codes`` only if it means "not
  processed";
- the upstream could not be reached before the request was sent (it cannot be started,
  refuses connections, or does not answer a ping): ``failed`` with ``not_sent``, which
  Effectgate retries whatever the effect class;
- the answer is lost after the request was sent (the upstream timeout passes, the
  upstream crashes or the connection breaks, an unreadable answer or any JSON-RPC error
  but "method not found" and "invalid params"): ``unknown``. It is never retried as if
  nothing happened: for an irreversible tool the operation waits for reconciliation. A
  lost stdio upstream is restarted for the next call.

**What the model sees.** Success: the upstream's content, followed by a text block with
the envelope as JSON (``status``, ``code``, ``logical_operation_id``, ``message``,
``allowed_next_actions``), and the upstream's structured content. Anything else:
``isError: true`` and the envelope as JSON text. While a person has to decide, the
envelope adds ``approval_url`` (``<console url>/approvals/<id>/``) and ``next_step``:
calling again with the same arguments runs the call once it is approved. Every result
also carries the envelope in ``_meta["effectgate/envelope"]``. The upstream tools'
output schemas are not exposed: an answer that is not a success carries no structured
content.

**A client that opens links** (it declared ``capabilities.elicitation.url``, MCP
2025-11-25) is asked to open the approval page while the call waits: with
``approval_wait_s`` above 0, the gateway sends one ``elicitation/create`` in URL mode
(the ``approval_url`` above, a message naming the tool and what it waits for; no token,
key or argument), goes on waiting without waiting for the client's answer, and sends
``notifications/elicitation/complete`` for it when the person decides, before the call
answers as usual (the upstream's result once approved, the rejection envelope). The
client's ``accept``, ``decline`` or ``cancel`` is its user's choice about opening the
page, not a decision: the call waits either way, since an approver may decide from the
inbox. A wait that ends undecided answers as above (the link, no completion); an
elicitation still unanswered when the call answers is cancelled. A client that declared
form mode only, or no elicitation, gets the answer with the link alone (``_mcp_elicit``).

**Parallel calls.** The concurrent ``tools/call`` requests of one model turn are
coalesced (``_mcp_batch.CoalescingRunner``): the first registration of a run waits
``batch_window_ms`` (2 ms) for others, and those arriving while a registration request
is in flight wait for it; together they go as one batch registration (api.md,
Batches), and their outcomes likewise as one batch of outcomes. A call alone goes as the
single request after at most that window. Each call still gets exactly its own answer.

Each principal gets one Effectgate run, created at its first call. The HTTP transport
has no authentication of its own: bind it to a loopback address or put it behind one.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from ..client import AsyncEffectgateClient
from ..errors import (
    ContractNotActive,
    EffectgateError,
    NotAuthenticated,
    OutcomeNotRecorded,
    ProblemError,
)
from ..outcomes import NotSent, Succeeded
from ..runner import AsyncRunner, AttemptContext
from ..waiters import AsyncPollingWaiter
from ._common import derived_key, refusal_envelope
from ._mcp_batch import CoalescingRunner
from ._mcp_config import ConfigError, GatewayConfig, load
from ._mcp_elicit import ApprovalPrompt, PromptingWaiter, approval_url, opens_urls
from ._mcp_upstream import (
    VERSION,
    UpstreamLink,
    _describe,
    _one_line,
    _stored_result,
    _upstream_failure,
)

try:
    import mcp_types as types
    from mcp.server.lowlevel import Server
except ImportError as exc:  # the [mcp] extra is not installed
    _MISSING_MCP: ImportError | None = exc
else:
    _MISSING_MCP = None

logger = logging.getLogger("effectgate_client.mcp_gateway")

OPERATION_KEY_META = "effectgate/operation_key"
IDEMPOTENCY_KEY_META = "effectgate/idempotency_key"
OPERATION_ID_META = "effectgate/operation_id"
ENVELOPE_META = "effectgate/envelope"
INSTRUCTIONS = (
    "Tool calls here go through Effectgate. Every result ends with a JSON envelope "
    "(status, code, message, allowed_next_actions): follow its message. A call waiting "
    "for a person's approval gives a link; calling it again with the same arguments runs "
    "it once approved. Never repeat a call whose outcome is unknown."
)


class StartupError(Exception):
    """The gateway cannot start; the message is one line for the operator."""


# --- routing and answers -------------------------------------------------------------------


@dataclass
class Route:
    """An exposed tool: the upstream that has it and the tool as the upstream lists it."""

    name: str
    link: UpstreamLink
    tool: types.Tool
    contract: dict[str, Any]

    @property
    def exposed(self) -> types.Tool:
        # No output schema: an answer that is not a success has no structured content.
        return self.tool.model_copy(update={"output_schema": None})


def derive_operation_key(session: str, tool: str, arguments: dict[str, Any]) -> str:
    """The key of a call the client gave no key for: the same session, tool and
    arguments always give the same key (a retry is the same operation)."""
    return derived_key("mcp", session, tool, arguments)


def _refusal(code: str, message: str) -> dict[str, Any]:
    return {
        "status": "refused",
        "code": code,
        "logical_operation_id": None,
        "message": message,
        "allowed_next_actions": [],
    }


@dataclass
class _Captured:
    """What the tool function saw in this process, for the answer."""

    result: types.CallToolResult | None = None
    called: bool = False


class Gateway:
    """The MCP server's handlers, the routes to the upstreams and the Effectgate runner."""

    def __init__(
        self, config: GatewayConfig, client: AsyncEffectgateClient, runner: AsyncRunner
    ) -> None:
        self.config = config
        self.client = client
        self.runner = runner
        self.links: list[UpstreamLink] = []
        self.routes: dict[str, Route] = {}
        self._runs: dict[str, str] = {}
        self._runs_lock = anyio.Lock()

    # --- start-up -----------------------------------------------------------------------

    async def start(self, task_group: Any) -> None:
        """Connect to every upstream, choose the exposed tools, register their contracts."""
        for upstream in self.config.upstreams:
            link = UpstreamLink(upstream, task_group, self.config.upstream_timeout_s)
            try:
                await link.connect()
                tools = await link.list_tools()
            except Exception as exc:
                detail = exc.detail if isinstance(exc, NotSent) else _describe(exc)
                raise StartupError(
                    f"upstream {upstream.name!r} ({upstream.target}) could not be started or "
                    f"listed: {detail}"
                ) from None
            self.links.append(link)
            self._route(link, tools)
        for route in self.routes.values():
            await self._register(route)
        if not self.routes:
            logger.warning("no tool is exposed: list tools under [upstream.tools]")

    def _route(self, link: UpstreamLink, tools: list[types.Tool]) -> None:
        upstream = link.config
        by_name = {tool.name: tool for tool in tools}
        missing = sorted(set(upstream.tools) - set(by_name))
        if missing:
            raise StartupError(
                f"upstream {upstream.name!r} has no tool named {missing[0]!r} "
                f"(it lists: {', '.join(sorted(by_name)) or 'nothing'})"
            )
        for tool in tools:
            block = upstream.tools.get(tool.name)
            if block is None:
                if upstream.default_effect_class is None:
                    logger.info(
                        "upstream %s: %s is not listed in the configuration: not exposed",
                        upstream.name,
                        tool.name,
                    )
                    continue
                block = {"effect_class": upstream.default_effect_class}
            other = self.routes.get(tool.name)
            if other is not None:
                raise StartupError(
                    f"tool {tool.name!r} is exposed by both upstream {other.link.name!r} and "
                    f"upstream {upstream.name!r}: exposed names must be unique"
                )
            contract = {"input_schema": tool.input_schema, **block}
            if tool.description and "description" not in contract:
                contract["description"] = tool.description[:2000]
            self.routes[tool.name] = Route(tool.name, link, tool, contract)

    async def _register(self, route: Route) -> None:
        try:
            answer = await self.client.put_tool(route.name, route.contract)
        except ContractNotActive as exc:
            # Stored, not active: the gateway still starts, and says so loudly.
            logger.warning("%s", exc)
            return
        except NotAuthenticated:
            raise StartupError(
                f"Effectgate at {self.config.url} refused the token in ${self.config.token_env} "
                "(not_authenticated)"
            ) from None
        except ProblemError as exc:
            where = "; ".join(
                f"{error.get('path')}: {error.get('message')}" for error in exc.errors[:3]
            )
            raise StartupError(
                f"Effectgate refused the contract of {route.name!r} ({exc.code}): "
                f"{_one_line(exc.detail)}{' — ' + _one_line(where) if where else ''}"
            ) from None
        except EffectgateError as exc:
            raise StartupError(
                f"Effectgate at {self.config.url} could not be reached: {_one_line(str(exc))}"
            ) from None
        logger.info(
            "exposing %s from upstream %s (%s, contract version %s)",
            route.name,
            route.link.name,
            route.contract["effect_class"],
            answer.get("version"),
        )

    # --- MCP handlers ---------------------------------------------------------------------

    def server(self) -> Server:
        return Server(
            "effectgate-mcp",
            version=VERSION,
            instructions=INSTRUCTIONS,
            on_list_tools=self._on_list_tools,
            on_call_tool=self._on_call_tool,
        )

    async def _on_list_tools(
        self, ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[route.exposed for route in self.routes.values()])

    async def _on_call_tool(
        self, ctx: Any, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        route = self.routes.get(params.name)
        if route is None:
            return self._answer(
                _refusal("unknown_tool", f"No tool named {params.name!r} is exposed here."),
                None,
            )
        arguments = dict(params.arguments or {})
        meta = dict(params.meta or {})
        client_params = getattr(ctx.session, "client_params", None)
        client_name = client_params.client_info.name if client_params is not None else None
        if self.config.principal is not None:
            principal = self.config.principal
        elif client_name:
            principal = f"client:{client_name}"
        else:
            return self._answer(
                _refusal(
                    "client_unidentified",
                    "This gateway acts for the MCP client named in its clientInfo, and this "
                    "client sent none.",
                ),
                None,
            )
        key = meta.get(OPERATION_KEY_META)
        if key is None:
            session = self.config.session or f"{principal}|{client_name or '-'}"
            key = derive_operation_key(session, route.name, arguments)
        elif not isinstance(key, str) or not key.strip() or len(key) > 255:
            return self._answer(
                _refusal(
                    "invalid_request",
                    f"_meta[{OPERATION_KEY_META!r}] must be a non-empty string of at most "
                    "255 characters.",
                ),
                None,
            )
        if self.config.approval_wait_s <= 0 or not opens_urls(ctx.session):
            return await self._execute(route, principal, key, arguments)
        async with anyio.create_task_group() as task_group:
            prompt = ApprovalPrompt(
                session=ctx.session,
                request_id=ctx.request_id,
                task_group=task_group,
                console=self.config.console,
                tool=route.name,
                wait_s=self.config.approval_wait_s,
            )
            result = await self._execute(route, principal, key, arguments, prompt)
            # An elicitation the client has not answered yet is withdrawn (the SDK sends
            # notifications/cancelled for it): the call it was about has its answer.
            task_group.cancel_scope.cancel()
        return result

    # --- one call ------------------------------------------------------------------------

    async def _run_for(self, principal: str) -> str:
        async with self._runs_lock:
            run = self._runs.get(principal)
            if run is None:
                answer = await self.client.create_run(
                    principal=principal, budgets=self.config.budgets or None
                )
                run = self._runs[principal] = answer["id"]
            return run

    async def _call_upstream(
        self, route: Route, captured: _Captured, ctx: AttemptContext
    ) -> Succeeded:
        """The tool function of ``AsyncRunner.execute``: the upstream call."""
        meta = {IDEMPOTENCY_KEY_META: ctx.idempotency_key, OPERATION_ID_META: ctx.operation_id}
        captured.called = True
        result = await route.link.call(route.tool.name, ctx.arguments, meta)
        if result.is_error:
            raise _upstream_failure(result)
        captured.result = result
        return Succeeded(result=_stored_result(result))

    async def _execute(
        self,
        route: Route,
        principal: str,
        key: str,
        arguments: dict[str, Any],
        prompt: ApprovalPrompt | None = None,
    ) -> types.CallToolResult:
        captured = _Captured()
        try:
            # A call, once started, is taken to its recorded outcome even if the client
            # cancels its request (or goes away): cancelled in the middle, the upstream
            # call would be left for its lease to expire into an unknown outcome.
            with anyio.CancelScope(shield=True):
                run = await self._run_for(principal)
                outcome = await self.runner.execute(
                    run=run,
                    tool=route.name,
                    operation_key=key,
                    arguments=arguments,
                    call=functools.partial(self._call_upstream, route, captured),
                    waiter=PromptingWaiter(self.runner.waiter, prompt) if prompt else None,
                )
        except OutcomeNotRecorded as exc:
            logger.error(
                "the outcome of %s attempt %d could not be posted (%s); its lease will expire "
                "and Effectgate will treat it as unknown",
                exc.operation_id,
                exc.attempt,
                exc.outcome.get("kind"),
            )
            return self._answer(self._not_recorded(route.name, exc.operation_id), None)
        except Exception as exc:
            if captured.called:
                # The upstream may have acted: never answer as if nothing happened.
                logger.error("the call of %s was made but not recorded: %s", route.name, exc)
                return self._answer(self._not_recorded(route.name, None), None)
            if isinstance(exc, EffectgateError):
                return self._answer(refusal_envelope(exc, tool=route.name), None)
            logger.exception("the call of %s failed in the gateway", route.name)
            return self._answer(
                _refusal(
                    "gateway_error",
                    f"The call to {route.name} was not made: the gateway failed "
                    f"({type(exc).__name__}).",
                ),
                None,
            )
        envelope = dict(outcome.envelope)
        op = outcome.operation
        if envelope.get("status") == "awaiting_approval":
            url = approval_url(self.config.console, op)
            if url is not None:
                envelope["approval_url"] = url
            where = f" at {envelope['approval_url']}" if "approval_url" in envelope else ""
            envelope["next_step"] = (
                f"A person has to approve this call{where}; tell the user. Once it is "
                f"approved, calling {route.name} again with exactly the same arguments runs "
                "it (once); calling it before then only reports that it is still waiting."
            )
        elif envelope.get("status") in ("ready", "executing"):
            envelope["next_step"] = (
                f"This call has not finished yet. Call {route.name} again with exactly the "
                "same arguments in a moment to continue it; it will not run twice."
            )
        if envelope.get("status") != "succeeded":
            return self._answer(envelope, None)
        if captured.result is not None:
            return self._answer(envelope, captured.result)
        # A replay of an operation that succeeded earlier: answer what was kept.
        stored = op.get("result") if isinstance(op.get("result"), dict) else {}
        try:
            kept = types.CallToolResult.model_validate(
                {
                    "content": stored.get("content") or [],
                    "structuredContent": stored.get("structuredContent"),
                }
            )
        except Exception:
            kept = types.CallToolResult(content=[])
        return self._answer(envelope, kept)

    @staticmethod
    def _not_recorded(tool: str, operation_id: str | None) -> dict[str, Any]:
        return {
            "status": "outcome_unknown",
            "code": "outcome_not_recorded",
            "logical_operation_id": operation_id,
            "message": f"The call to {tool} was made but Effectgate could not record how it "
            "ended; it will be reconciled. Do not retry it.",
            "allowed_next_actions": ["reconcile"],
        }

    @staticmethod
    def _answer(
        envelope: dict[str, Any], upstream: types.CallToolResult | None
    ) -> types.CallToolResult:
        text = types.TextContent(type="text", text=json.dumps(envelope, ensure_ascii=False))
        meta = {ENVELOPE_META: envelope}
        if envelope.get("status") == "succeeded" and upstream is not None:
            return types.CallToolResult(
                content=[*upstream.content, text],
                structured_content=upstream.structured_content,
                is_error=False,
                _meta=meta,
            )
        return types.CallToolResult(content=[text], is_error=True, _meta=meta)


# --- serving ---------------------------------------------------------------------------------


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _ignore_signal(signum: int, frame: Any) -> None:
    logger.info("stopping (signal %d)", signum)


async def _serve_http(server: Server, host: str, port: int) -> None:
    import uvicorn

    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    logger.info("serving MCP over streamable HTTP at http://%s:%d/mcp", host, port)
    # uvicorn stops on SIGINT/SIGTERM and then raises the signal again with the handlers
    # it found: let that be a no-op, so the gateway still closes its upstreams.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _ignore_signal) for sig in _STOP_SIGNALS}
    try:
        await uvicorn.Server(config).serve()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _serve_stdio(server: Server) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve(
    config: GatewayConfig,
    token: str,
    listen: tuple[str, int] | None = None,
    *,
    client_factory: Callable[..., AsyncEffectgateClient] = AsyncEffectgateClient,
) -> None:
    """Start the gateway and serve until the client goes away (stdio) or a signal."""
    client = client_factory(config.url, token, user_agent=f"effectgate-mcp/{VERSION}")
    runner = CoalescingRunner(
        client,
        window_s=config.batch_window_ms / 1000,
        lease_s=config.lease_s,
        wait_s=config.approval_wait_s,
        waiter=AsyncPollingWaiter(initial_s=0.25, max_s=2.0),
    )
    gateway = Gateway(config, client, runner)
    failure: StartupError | None = None
    try:
        async with anyio.create_task_group() as task_group:
            try:
                await gateway.start(task_group)
            except StartupError as exc:
                failure = exc
            else:
                server = gateway.server()
                if listen is None:
                    await _serve_stdio(server)
                else:
                    await _serve_http(server, *listen)
            for link in gateway.links:
                await link.close()
            task_group.cancel_scope.cancel()
    finally:
        await client.aclose()
    if failure is not None:
        raise failure


def _parse_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--http takes HOST:PORT (e.g. 127.0.0.1:8765), not {value!r}")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    """``effectgate-mcp --config FILE [--http HOST:PORT]``."""
    parser = argparse.ArgumentParser(
        prog="effectgate-mcp",
        description="An MCP gateway that puts every tool call through Effectgate.",
    )
    parser.add_argument("--config", required=True, help="the TOML configuration file")
    parser.add_argument(
        "--http", metavar="HOST:PORT", help="serve streamable HTTP at /mcp instead of stdio"
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    args = parser.parse_args(argv)
    if _MISSING_MCP is not None:
        print(
            "effectgate-mcp: the mcp package is missing: pip install 'effectgate-client[mcp]' "
            f"({_MISSING_MCP})",
            file=sys.stderr,
        )
        return 2
    try:
        config = load(args.config)
        listen = _parse_listen(args.http) if args.http else None
        token = os.environ.get(config.token_env, "").strip()
        if not token:
            raise ConfigError(
                f"the environment variable {config.token_env} (token_env) is not set: "
                "it must hold the runner token"
            )
    except ConfigError as exc:
        print(f"effectgate-mcp: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level,
        stream=sys.stderr,
        format="effectgate-mcp %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "httpcore", "mcp", "uvicorn"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        anyio.run(serve, config, token, listen)
    except StartupError as exc:
        print(f"effectgate-mcp: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
