"""The MCP gateway (``effectgate-mcp``) end to end: real MCP clients and servers (the
SDK's ``ClientSession`` and ``MCPServer``), a real gateway process, a live Effectgate.

The upstream (``mcp_upstream.py``) counts the refunds it commits in a ledger file and
fails on demand: ``timeout_after_commit``, ``crash_after_commit``, ``refused``. A naive
client retries every failed call three times. Straight to the upstream that client
commits duplicates; through the gateway it commits none, because a retry of the same
call is the same Effectgate operation and an unknown outcome is never run again.

The MCP SDK is imported where it is used, not at the top: every parallel worker collects
this module, and only the one that runs a test needs the SDK.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import AsyncExitStack, asynccontextmanager, suppress

import anyio
import anyio.to_thread
import pytest
from django.db import connections
from guardian.shortcuts import assign_perm

from operations import services
from operations.canonical import intent_hash
from operations.models import Operation, Tool
from tests.approvals.conftest import person
from tests.integrations.conftest import (
    GATEWAY,
    REFUND_BLOCK,
    UPSTREAM,
    wait_for_port,
    write_config,
)
from tests.support.event_loop import run_in_thread

# Nearly every test starts processes (the gateway, upstreams): all are marked slow.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# One call per payment; each fault is injected by argument.
FAULT_PLAN = [
    "",
    "timeout_after_commit",
    "crash_after_commit",
    "refused",
    "",
    "timeout_after_commit",
    "crash_after_commit",
]
TRIES = 3
CLIENT_INFO = {"name": "refund-agent", "version": "1.0"}


def envelope_of(result) -> dict:
    """The gateway's envelope: the last text block of the result."""
    return json.loads(result.content[-1].text)


# --- connections ---------------------------------------------------------------------------


@asynccontextmanager
async def session_over(transport, session_class=None, **session_kwargs):
    """An initialized client session over ``transport``; ``session_kwargs`` go to the
    ``ClientSession`` (an elicitation callback, a message handler)."""
    from mcp import ClientSession
    from mcp_types import Implementation

    async with AsyncExitStack() as stack:
        read, write = await stack.enter_async_context(transport)
        session = await stack.enter_async_context(
            (session_class or ClientSession)(
                read, write, client_info=Implementation(**CLIENT_INFO), **session_kwargs
            )
        )
        await session.initialize()
        yield session


def gateway_stdio(config, token, errlog, **session_kwargs):
    """A session with a gateway process spawned over stdio (the installed script)."""
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=str(GATEWAY), args=["--config", str(config)], env={"EFFECTGATE_TOKEN": token}
    )
    return session_over(stdio_client(params, errlog=errlog), **session_kwargs)


def upstream_stdio(ledger, errlog):
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(
        command=sys.executable, args=[str(UPSTREAM)], env=ledger.upstream_env()
    )
    return session_over(stdio_client(params, errlog=errlog))


class GatewayHTTP:
    """``effectgate-mcp --config FILE --http 127.0.0.1:PORT`` as a process."""

    def __init__(self, config, token, port, log_path):
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.port = port
        self.log_path = log_path
        self.log = open(log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [str(GATEWAY), "--config", str(config), "--http", f"127.0.0.1:{port}"],
            env={**os.environ, "EFFECTGATE_TOKEN": token},
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
        )

    def __enter__(self):
        wait_for_port(self.port, timeout_s=30, process=self.process)
        return self

    def __exit__(self, *exc_info):
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        self.returncode = self.process.returncode


class RetryingClient:
    """A naive agent harness: a call that fails (an error result, a timeout, a broken
    connection) is sent again, up to ``tries`` times. It reconnects when the connection
    broke, and waits for the server to be back before it counts another try."""

    def __init__(self, connect, *, tries=TRIES, read_timeout_s=None):
        self.connect = connect
        self.tries = tries
        self.read_timeout_s = read_timeout_s
        self.session = None
        self._stack = None
        self.sent = 0

    async def _session(self):
        if self.session is None:
            deadline = anyio.current_time() + 20
            while True:
                context = self.connect()
                try:
                    self.session = await context.__aenter__()
                    self._stack = context
                    break
                except Exception:
                    if anyio.current_time() > deadline:
                        raise
                    await anyio.sleep(0.2)
        return self.session

    async def _drop(self):
        context, self._stack, self.session = self._stack, None, None
        if context is not None:
            # No cancel scope around this: the connection's own scopes are outer ones. A
            # dead connection may fail to close; either way it is gone.
            with suppress(Exception):
                await context.__aexit__(None, None, None)

    async def call(self, name, arguments):
        from mcp.shared.exceptions import MCPError
        from mcp_types import REQUEST_TIMEOUT

        answers = []
        for _ in range(self.tries):
            session = await self._session()
            self.sent += 1
            try:
                result = await session.call_tool(
                    name, arguments, read_timeout_seconds=self.read_timeout_s
                )
            except MCPError as exc:
                answers.append(exc)
                if exc.code != REQUEST_TIMEOUT:
                    await self._drop()  # the connection is gone: open a new one
                continue
            except Exception as exc:
                answers.append(exc)
                await self._drop()
                continue
            answers.append(result)
            if not result.is_error:
                break
        return answers

    async def close(self):
        await self._drop()


async def run_plan(client: RetryingClient) -> list[list]:
    try:
        return [
            await client.call("send_refund", _arguments(index, fault))
            for index, fault in enumerate(FAULT_PLAN)
        ]
    finally:
        await client.close()


def _arguments(index, fault, amount=100):
    arguments = {"payment_id": f"pay_{index}", "amount_cents": amount + index}
    if fault:
        arguments["fault"] = fault
    return arguments


def _expected_effects():
    """What committing once per intent gives: every call but the refused ones."""
    return sum(1 for fault in FAULT_PLAN if fault != "refused")


def _check_gateway_operations(ledger):
    """Effectgate holds one operation per call; the lost answers are outcome_unknown
    after a single attempt, and every committed effect carries its operation's key."""
    ops = {op.arguments["payment_id"]: op for op in Operation.objects.all()}
    assert len(ops) == len(FAULT_PLAN)
    expected = {
        "": "succeeded",
        "timeout_after_commit": "outcome_unknown",
        "crash_after_commit": "outcome_unknown",
        "refused": "failed_permanent",
    }
    for index, fault in enumerate(FAULT_PLAN):
        op = ops[f"pay_{index}"]
        assert op.status == expected[fault], (index, fault, op.status, op.error_code)
        assert op.attempts == 1, (index, fault, op.attempts)
    for line in ledger.lines():
        assert line["idempotency_key"] == ops[line["payment_id"]].idempotency_key
    return {payment: f"{op.status}/{op.error_code or '-'}" for payment, op in sorted(ops.items())}


def _report(record_property, label, ledger, client):
    counts = {
        "calls": len(FAULT_PLAN),
        "sent": client.sent,
        "effects": ledger.effects,
        "duplicates": ledger.duplicates,
    }
    print(f"\n[mcp-gateway] {label}: {json.dumps(counts)}")
    record_property(label, json.dumps(counts))
    return counts


# --- 1 and 2: duplicates, gateway vs direct --------------------------------------------------


def test_stdio_gateway_commits_no_duplicates_where_a_direct_connection_does(
    mcp_config, mcp_effectgate, mcp_ledger, tmp_path, record_property
):
    config = mcp_config()
    errlog_path = tmp_path / "gateway-stderr.log"

    async def through_gateway():
        with errlog_path.open("w") as errlog:
            client = RetryingClient(
                lambda: gateway_stdio(config, mcp_effectgate.token, errlog), read_timeout_s=30
            )
            return await run_plan(client), client

    answers, client = run_in_thread(anyio.run, through_gateway)
    gateway = _report(record_property, "stdio gateway", mcp_ledger, client)
    assert gateway["effects"] == _expected_effects()
    assert gateway["duplicates"] == 0
    print(f"[mcp-gateway] stdio gateway operations: {_check_gateway_operations(mcp_ledger)}")
    # Every failed call was retried, and every retry answered the same operation.
    for fault, tries in zip(FAULT_PLAN, answers, strict=True):
        assert all(not isinstance(answer, Exception) for answer in tries), tries
        ids = {envelope_of(answer)["logical_operation_id"] for answer in tries}
        assert len(ids) == 1
        assert len(tries) == (1 if fault == "" else TRIES)
    stderr = errlog_path.read_text()
    assert mcp_effectgate.token not in stderr
    assert "Traceback" not in stderr

    mcp_ledger.path.write_text("")

    async def direct():
        with (tmp_path / "upstream-stderr.log").open("w") as errlog:
            client = RetryingClient(lambda: upstream_stdio(mcp_ledger, errlog), read_timeout_s=1)
            return await run_plan(client), client

    _, client = run_in_thread(anyio.run, direct)
    direct_counts = _report(record_property, "stdio direct", mcp_ledger, client)
    assert direct_counts["duplicates"] > 0
    assert direct_counts["effects"] > _expected_effects()


def test_http_gateway_commits_no_duplicates_where_a_direct_connection_does(
    mcp_config, mcp_effectgate, mcp_ledger, mcp_http_upstream, mcp_free_port, tmp_path,
    record_property,
):  # fmt: skip
    from mcp.client.streamable_http import streamable_http_client

    config = mcp_config(
        upstreams=[
            {
                "name": "payments",
                "url": mcp_http_upstream.url,
                "tools": {"send_refund": REFUND_BLOCK},
            }
        ]
    )
    log_path = tmp_path / "gateway-http.log"
    with GatewayHTTP(config, mcp_effectgate.token, mcp_free_port(), log_path) as gateway:

        async def through_gateway():
            client = RetryingClient(
                lambda: session_over(streamable_http_client(gateway.url)), read_timeout_s=30
            )
            return await run_plan(client), client

        answers, client = run_in_thread(anyio.run, through_gateway)
    counts = _report(record_property, "http gateway", mcp_ledger, client)
    assert counts["effects"] == _expected_effects()
    assert counts["duplicates"] == 0
    print(f"[mcp-gateway] http gateway operations: {_check_gateway_operations(mcp_ledger)}")
    for tries in answers:
        assert len({envelope_of(answer)["logical_operation_id"] for answer in tries}) == 1
    assert gateway.returncode == 0  # SIGTERM stops it cleanly
    log = log_path.read_text()
    assert mcp_effectgate.token not in log
    assert "Traceback" not in log

    mcp_ledger.path.write_text("")

    async def direct():
        client = RetryingClient(
            lambda: session_over(streamable_http_client(mcp_http_upstream.url)), read_timeout_s=1
        )
        return await run_plan(client), client

    _, client = run_in_thread(anyio.run, direct)
    direct_counts = _report(record_property, "http direct", mcp_ledger, client)
    assert direct_counts["duplicates"] > 0
    assert direct_counts["effects"] > _expected_effects()


# --- 3 and 4: approvals, and what the model sees ----------------------------------------------


def _decide(*, approve, comment="", after_s=0.0, payment_id):
    """Have a person decide the pending request of the refund of ``payment_id``, once it
    is pending and ``after_s`` seconds have passed since it was registered."""
    op = None
    for _ in range(400):
        op = Operation.objects.filter(
            status="awaiting_approval", arguments__payment_id=payment_id
        ).first()
        if op is not None:
            break
        time.sleep(0.05)
    assert op is not None, "no operation awaits approval"
    user = person()
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk="send_refund"))
    time.sleep(after_s)
    request = op.approval_requests.get(status="pending")
    services.approval_decide(request_id=request.id, user=user, approve=approve, comment=comment)


def _in_thread(function, **kwargs):
    """Run ``function`` in a thread that closes its database connection."""
    errors = []

    def body():
        try:
            function(**kwargs)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    return thread, errors


def test_a_pending_approval_blocks_the_call_until_a_person_approves(
    mcp_config, mcp_effectgate, mcp_ledger, tmp_path
):
    config = mcp_config(approval_wait_s=20)
    arguments = {"payment_id": "pay_big", "amount_cents": 75_000}  # over the rule's 50000

    async def call():
        with (tmp_path / "stderr.log").open("w") as errlog:
            async with gateway_stdio(config, mcp_effectgate.token, errlog) as session:
                thread, errors = _in_thread(
                    _decide, approve=True, comment="ok", after_s=1.0, payment_id="pay_big"
                )
                started = time.monotonic()
                result = await session.call_tool("send_refund", arguments)
                elapsed = time.monotonic() - started
                await anyio.to_thread.run_sync(thread.join)
                assert not errors, errors
                return result, elapsed

    result, elapsed = run_in_thread(anyio.run, call)
    assert not result.is_error, result
    assert elapsed >= 1.0
    envelope = envelope_of(result)
    assert envelope["status"] == "succeeded"
    assert result.content[0].text.startswith("refunded 75000 cents of pay_big")
    assert mcp_ledger.effects == 1
    op = Operation.objects.get()
    assert mcp_ledger.lines()[0]["idempotency_key"] == op.idempotency_key


def test_what_the_model_sees(mcp_config, mcp_effectgate, mcp_ledger, tmp_path, record_property):
    """Each case answers one envelope a model can act on; recorded for the report."""
    config = mcp_config(approval_wait_s=0)
    seen = {}

    async def scenario():
        with (tmp_path / "stderr.log").open("w") as errlog:
            async with gateway_stdio(config, mcp_effectgate.token, errlog) as session:
                listed = await session.list_tools()
                seen["tools"] = [tool.name for tool in listed.tools]

                async def call(case, arguments, **kwargs):
                    result = await session.call_tool("send_refund", arguments, **kwargs)
                    seen[case] = result
                    return result

                await call("succeeded", {"payment_id": "pay_ok", "amount_cents": 500})
                big = {"payment_id": "pay_big", "amount_cents": 75_000}
                await call("approval_pending", big)
                thread, errors = _in_thread(_decide, approve=True, payment_id="pay_big")
                await anyio.to_thread.run_sync(thread.join)
                assert not errors, errors
                await call("approved_then_called_again", big)

                bad = {"payment_id": "pay_dup", "amount_cents": 80_000}
                await call("rejected_pending", bad)
                thread, errors = _in_thread(
                    _decide,
                    approve=False,
                    comment="Duplicate: the bank already returned this payment.",
                    payment_id="pay_dup",
                )
                await anyio.to_thread.run_sync(thread.join)
                assert not errors, errors
                await call("rejected", bad)

                await call(
                    "unknown",
                    {
                        "payment_id": "pay_slow",
                        "amount_cents": 700,
                        "fault": "timeout_after_commit",
                    },
                )
                await call(
                    "unknown_retried",
                    {
                        "payment_id": "pay_slow",
                        "amount_cents": 700,
                        "fault": "timeout_after_commit",
                    },
                )
                await call(
                    "failed",
                    {"payment_id": "pay_refused", "amount_cents": 800, "fault": "refused"},
                )
                await call("invalid_arguments", {"payment_id": "pay_x", "amount_cents": "lots"})
                seen["unlisted_tool"] = await session.call_tool(
                    "lookup_payment", {"payment_id": "pay_ok"}
                )
                # A client that means a second, identical refund names it.
                await call(
                    "second_identical_with_own_key",
                    {"payment_id": "pay_ok", "amount_cents": 500},
                    meta={"effectgate/operation_key": "refund-agent:pay_ok:second"},
                )

    run_in_thread(anyio.run, scenario)
    envelopes = {case: envelope_of(result) for case, result in seen.items() if case != "tools"}
    for case, envelope in envelopes.items():
        print(f"\n[mcp-gateway] model sees ({case}): {json.dumps(envelope)}")
        record_property(f"envelope {case}", json.dumps(envelope))

    # Only the listed tool is exposed.
    assert seen["tools"] == ["send_refund"]

    ok = seen["succeeded"]
    assert not ok.is_error
    assert ok.content[0].text.startswith("refunded 500 cents of pay_ok")
    assert ok.structured_content == {"result": ok.content[0].text}
    assert envelopes["succeeded"]["status"] == "succeeded"
    assert envelopes["succeeded"]["code"] is None
    assert envelopes["succeeded"]["message"] == "The call to send_refund succeeded."
    assert ok.meta["effectgate/envelope"] == envelopes["succeeded"]

    pending = envelopes["approval_pending"]
    assert seen["approval_pending"].is_error
    assert pending["status"] == "awaiting_approval"
    assert pending["allowed_next_actions"] == ["wait_for_approval"]
    approval_id = Operation.objects.get(arguments__payment_id="pay_big").approval_requests.get().id
    assert pending["approval_url"] == f"{mcp_effectgate.url}/approvals/{approval_id}/"
    assert pending["approval_url"] in pending["next_step"]
    assert pending["approval_url"] in seen["approval_pending"].content[0].text
    assert "same arguments" in pending["next_step"]
    assert "waiting for a person to approve" in pending["message"]

    # Calling again once approved runs it, once, as the same operation.
    again = envelopes["approved_then_called_again"]
    assert not seen["approved_then_called_again"].is_error
    assert again["status"] == "succeeded"
    assert again["logical_operation_id"] == pending["logical_operation_id"]

    rejected = envelopes["rejected"]
    assert seen["rejected"].is_error
    assert rejected["status"] == "rejected"
    assert rejected["code"] == "approval_rejected"
    assert "Duplicate: the bank already returned this payment." in rejected["message"]
    assert "do not retry" in rejected["message"]
    assert rejected["allowed_next_actions"] == []

    unknown = envelopes["unknown"]
    assert seen["unknown"].is_error
    assert unknown["status"] == "outcome_unknown"
    assert unknown["code"] == "timeout_unknown"
    assert "do not retry" in unknown["message"]
    assert unknown["allowed_next_actions"] == ["reconcile"]
    assert envelopes["unknown_retried"] == unknown  # the retry ran nothing

    failed = envelopes["failed"]
    assert seen["failed"].is_error
    assert failed["status"] == "failed_permanent"
    assert failed["code"] == "already_refunded"
    assert "already fully refunded" in failed["message"]
    assert "will not be retried" in failed["message"]

    invalid = envelopes["invalid_arguments"]
    assert seen["invalid_arguments"].is_error
    assert invalid["status"] == "refused"
    assert invalid["code"] == "invalid_arguments"
    assert [error["path"] for error in invalid["errors"]] == ["/arguments/amount_cents"]

    unlisted = envelopes["unlisted_tool"]
    assert seen["unlisted_tool"].is_error
    assert (unlisted["status"], unlisted["code"]) == ("refused", "unknown_tool")

    second = envelopes["second_identical_with_own_key"]
    assert second["status"] == "succeeded"
    assert second["logical_operation_id"] != envelopes["succeeded"]["logical_operation_id"]

    # Committed: pay_ok twice (two keys), pay_big and pay_slow once each; nothing else.
    assert mcp_ledger.per_payment() == {"pay_ok": 2, "pay_big": 1, "pay_slow": 1}


def test_the_derived_key_survives_a_reconnect(mcp_config, mcp_effectgate, mcp_ledger, tmp_path):
    """A client that reconnects (a new gateway process, even) and retries the same call
    gets the same operation back: the key comes from the principal, the client's name,
    the tool and the arguments, not from the transport's session."""
    config = mcp_config()
    arguments = {"payment_id": "pay_1", "amount_cents": 300}

    async def once():
        with (tmp_path / "stderr.log").open("a") as errlog:
            async with gateway_stdio(config, mcp_effectgate.token, errlog) as session:
                return await session.call_tool("send_refund", arguments)

    first = run_in_thread(anyio.run, once)
    second = run_in_thread(anyio.run, once)
    assert envelope_of(first)["status"] == envelope_of(second)["status"] == "succeeded"
    assert envelope_of(first) == envelope_of(second)
    # The replay answers the upstream's content as Effectgate kept it.
    assert second.content == first.content
    assert second.structured_content == first.structured_content
    assert mcp_ledger.effects == 1


def test_derived_keys_name_the_session_tool_and_canonical_arguments():
    from effectgate_client.integrations.mcp_gateway import derive_operation_key

    key = derive_operation_key("user:alice|refund-agent", "send_refund", {"a": 1, "b": [2]})
    assert key == derive_operation_key("user:alice|refund-agent", "send_refund", {"b": [2], "a": 1})
    assert len(key) <= 255
    assert key != derive_operation_key("user:alice|other", "send_refund", {"a": 1, "b": [2]})
    assert key != derive_operation_key("user:alice|refund-agent", "send_refund", {"a": 2})


def test_one_intent_written_as_500_or_500_0_or_in_another_key_order_derives_one_key():
    """The key follows the RFC 8785 canonical form, as the intent hash does: arguments
    that are one intent to Effectgate are one operation, however their JSON was written."""
    from effectgate_client.integrations.mcp_gateway import derive_operation_key

    session, tool = "user:alice|refund-agent", "send_refund"
    first = json.loads('{"payment_id": "pay_\u00e9", "amount_cents": 500}')
    key = derive_operation_key(session, tool, first)
    for text in (
        '{"payment_id": "pay_\u00e9", "amount_cents": 500.0}',
        '{"amount_cents": 5e2, "payment_id": "pay_\\u00e9"}',
        '{"amount_cents": 500.000, "payment_id": "pay_\\u00E9"}',
    ):
        again = json.loads(text)
        assert intent_hash(tool=tool, arguments=again, principal="user:alice") == intent_hash(
            tool=tool, arguments=first, principal="user:alice"
        )
        assert derive_operation_key(session, tool, again) == key, text
    assert derive_operation_key(session, tool, {**first, "amount_cents": 500.5}) != key


def test_keys_of_integer_and_string_arguments_are_those_earlier_releases_derived():
    """For integers and strings the canonical form is the text earlier gateways hashed,
    so a call retried across an upgrade keeps its key (and its operation)."""
    from effectgate_client.integrations.mcp_gateway import derive_operation_key

    arguments = {"payment_id": "pay_1", "amount_cents": 500}
    key = derive_operation_key("user:alice|refund-agent", "send_refund", arguments)
    assert key == "eg:fb4bc2df0e50d8f565dcb0065dc07bd46c38652c"


def test_arguments_without_a_canonical_form_still_derive_a_stable_key():
    """An integer beyond ±(2^53-1) or a NaN has no RFC 8785 form; Effectgate refuses such
    arguments itself, so the gateway only needs a key to send them with, not an error."""
    from effectgate_client.integrations.mcp_gateway import derive_operation_key

    for arguments in ({"amount_cents": 2**60}, {"amount_cents": float("nan")}):
        key = derive_operation_key("s", "send_refund", arguments)
        assert key == derive_operation_key("s", "send_refund", dict(arguments))
        assert key.startswith("eg:")


def test_a_call_repeated_with_500_0_for_500_is_one_operation_and_one_refund(
    mcp_config, mcp_effectgate, mcp_ledger, tmp_path
):
    """A client that sends the amount again as a float (a different JSON library, a
    round trip through JavaScript) makes the same call: one operation, one refund."""
    config = mcp_config()

    async def twice():
        with (tmp_path / "stderr.log").open("w") as errlog:
            async with gateway_stdio(config, mcp_effectgate.token, errlog) as session:
                first = await session.call_tool(
                    "send_refund", {"payment_id": "pay_1", "amount_cents": 500}
                )
                second = await session.call_tool(
                    "send_refund", {"amount_cents": 500.0, "payment_id": "pay_1"}
                )
                return first, second

    first, second = run_in_thread(anyio.run, twice)
    assert envelope_of(first)["status"] == envelope_of(second)["status"] == "succeeded"
    operation = Operation.objects.get()
    assert envelope_of(second)["logical_operation_id"] == operation.id
    assert operation.attempts == 1
    assert mcp_ledger.effects == 1


def test_principal_from_client_info(mcp_config, mcp_effectgate, tmp_path):
    config = mcp_config(principal=None, principal_from="client_info")

    async def once():
        with (tmp_path / "stderr.log").open("a") as errlog:
            async with gateway_stdio(config, mcp_effectgate.token, errlog) as session:
                return await session.call_tool(
                    "send_refund", {"payment_id": "pay_1", "amount_cents": 300}
                )

    result = run_in_thread(anyio.run, once)
    assert envelope_of(result)["status"] == "succeeded"
    assert Operation.objects.get().principal == "client:refund-agent"


# --- 6: URL-mode elicitation of the approval page --------------------------------------------


class ElicitingClient:
    """A client that declares URL-mode elicitation (the SDK's ``ClientSession`` with an
    elicitation callback declares ``elicitation: {form: {}, url: {}}``). It records the
    elicitations it is sent and answers each with ``action``, or with nothing when
    ``action`` is None (its user never answers: the request stays open until the gateway
    withdraws it); it records the completion notifications it receives."""

    def __init__(self, action="accept"):
        self.action = action
        self.elicitations = []
        self.completed = []
        self.withdrawn = 0
        self.asked = threading.Event()

    async def elicitation_callback(self, context, params):
        from mcp_types import ElicitResult

        self.elicitations.append(params)
        self.asked.set()
        if self.action is None:
            try:
                await anyio.sleep(120)
            except anyio.get_cancelled_exc_class():
                self.withdrawn += 1
                raise
        return ElicitResult(action=self.action)

    async def message_handler(self, message):
        from mcp_types import ElicitCompleteNotification

        if isinstance(message, ElicitCompleteNotification):
            self.completed.append(message.params.elicitation_id)

    def session_kwargs(self):
        return {
            "elicitation_callback": self.elicitation_callback,
            "message_handler": self.message_handler,
        }


def form_only_session():
    """A ``ClientSession`` that declares form-mode elicitation only."""
    import mcp_types as types
    from mcp import ClientSession

    class FormOnlySession(ClientSession):
        def _build_capabilities(self, version):
            declared = super()._build_capabilities(version)
            form = types.ElicitationCapability(form=types.FormElicitationCapability())
            return declared.model_copy(update={"elicitation": form})

    return FormOnlySession


def _through_gateway(transport, config, token, log_path, free_port, scenario, **session_kwargs):
    """``scenario(session)`` against a gateway process over stdio or streamable HTTP."""
    if transport == "stdio":

        async def over_stdio():
            with log_path.open("w") as errlog:
                async with gateway_stdio(config, token, errlog, **session_kwargs) as session:
                    return await scenario(session)

        return run_in_thread(anyio.run, over_stdio)
    from mcp.client.streamable_http import streamable_http_client

    with GatewayHTTP(config, token, free_port(), log_path) as gateway:

        async def over_http():
            transport = streamable_http_client(gateway.url)
            async with session_over(transport, **session_kwargs) as session:
                return await scenario(session)

        return run_in_thread(anyio.run, over_http)


def _decide_once_asked(asked, **decision):
    """A person decides, once the client has been asked to open the approval page."""
    assert asked.wait(timeout=20), "the client was never asked to open the approval page"
    _decide(**decision)


async def _until(condition, timeout_s=5.0):
    with anyio.fail_after(timeout_s):
        while not condition():
            await anyio.sleep(0.05)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_elicit_a_client_that_opens_urls_is_sent_the_approval_page_and_answered_once_approved(
    transport, mcp_config, mcp_effectgate, mcp_ledger, mcp_free_port, tmp_path
):
    config = mcp_config(approval_wait_s=20)
    arguments = {"payment_id": "pay_big", "amount_cents": 75_000}  # over the rule's 50000
    client = ElicitingClient(action="accept")

    async def scenario(session):
        thread, errors = _in_thread(
            _decide_once_asked, asked=client.asked, approve=True, payment_id="pay_big"
        )
        started = time.monotonic()
        result = await session.call_tool("send_refund", arguments)
        elapsed = time.monotonic() - started
        await anyio.to_thread.run_sync(thread.join)
        assert not errors, errors
        await _until(lambda: client.completed)
        return result, elapsed

    log_path = tmp_path / "gateway.log"
    result, elapsed = _through_gateway(
        transport,
        config,
        mcp_effectgate.token,
        log_path,
        mcp_free_port,
        scenario,
        **client.session_kwargs(),
    )

    # The call waited for the decision and answered with the upstream's result.
    assert not result.is_error, result
    assert elapsed < 20
    assert result.content[0].text.startswith("refunded 75000 cents of pay_big")
    assert envelope_of(result)["status"] == "succeeded"
    operation = Operation.objects.get()
    assert operation.status == "succeeded"
    assert mcp_ledger.effects == 1
    # One elicitation, in URL mode, with the approval page the error answer links to.
    [asked] = client.elicitations
    request = operation.approval_requests.get()
    assert asked.mode == "url"
    assert asked.url == f"{mcp_effectgate.url}/approvals/{request.id}/"
    assert "send_refund" in asked.message
    assert "approve" in asked.message
    assert asked.elicitation_id
    # The decision came: the elicitation is complete.
    assert client.completed == [asked.elicitation_id]
    # Nothing secret travels in it: no token, no idempotency key, no argument.
    sent = json.dumps(asked.model_dump(mode="json", by_alias=True))
    assert mcp_effectgate.token not in sent
    assert operation.idempotency_key not in sent
    assert "75000" not in sent
    assert "pay_big" not in sent
    log = log_path.read_text()
    assert mcp_effectgate.token not in log
    assert "Traceback" not in log


def test_elicit_a_rejection_answers_the_rejection_envelope_without_waiting_for_the_client(
    mcp_config, mcp_effectgate, mcp_ledger, mcp_free_port, tmp_path
):
    """The client's user never answers the prompt: the wait goes on regardless, the
    person's rejection answers the call at once, and the open elicitation is withdrawn."""
    config = mcp_config(approval_wait_s=20)
    arguments = {"payment_id": "pay_dup", "amount_cents": 80_000}
    client = ElicitingClient(action=None)
    reason = "Duplicate: the bank already returned this payment."

    async def scenario(session):
        thread, errors = _in_thread(
            _decide_once_asked,
            asked=client.asked,
            approve=False,
            comment=reason,
            payment_id="pay_dup",
        )
        started = time.monotonic()
        result = await session.call_tool("send_refund", arguments)
        elapsed = time.monotonic() - started
        await anyio.to_thread.run_sync(thread.join)
        assert not errors, errors
        await _until(lambda: client.completed and client.withdrawn)
        return result, elapsed

    result, elapsed = _through_gateway(
        "stdio",
        config,
        mcp_effectgate.token,
        tmp_path / "gateway.log",
        mcp_free_port,
        scenario,
        **client.session_kwargs(),
    )

    assert result.is_error
    assert elapsed < 15
    envelope = envelope_of(result)
    assert envelope["status"] == "rejected"
    assert envelope["code"] == "approval_rejected"
    assert reason in envelope["message"]
    assert envelope["allowed_next_actions"] == []
    [asked] = client.elicitations
    assert client.completed == [asked.elicitation_id]
    assert client.withdrawn == 1
    assert Operation.objects.get().status == "rejected"
    assert mcp_ledger.effects == 0


def test_elicit_a_declined_prompt_keeps_waiting_and_an_undecided_wait_answers_the_link(
    mcp_config, mcp_effectgate, mcp_ledger, mcp_free_port, tmp_path
):
    config = mcp_config(approval_wait_s=2)
    client = ElicitingClient(action="decline")

    async def scenario(session):
        started = time.monotonic()
        result = await session.call_tool(
            "send_refund", {"payment_id": "pay_big", "amount_cents": 75_000}
        )
        elapsed = time.monotonic() - started
        await anyio.sleep(0.5)  # a completion would have arrived by now
        return result, elapsed

    result, elapsed = _through_gateway(
        "stdio",
        config,
        mcp_effectgate.token,
        tmp_path / "gateway.log",
        mcp_free_port,
        scenario,
        **client.session_kwargs(),
    )

    # Declining did not end the wait: the call waited approval_wait_s, then answered
    # today's answer, with the link it had sent.
    assert elapsed >= 2
    assert result.is_error
    envelope = envelope_of(result)
    assert envelope["status"] == "awaiting_approval"
    [asked] = client.elicitations
    assert envelope["approval_url"] == asked.url
    assert asked.url in envelope["next_step"]
    # Nobody decided: nothing is complete.
    assert client.completed == []
    assert Operation.objects.get().status == "awaiting_approval"
    assert mcp_ledger.effects == 0


@pytest.mark.parametrize("declared", ["nothing", "form_only"])
def test_elicit_a_client_without_url_mode_gets_todays_answer_and_no_elicitation(
    declared, mcp_config, mcp_effectgate, mcp_ledger, mcp_free_port, tmp_path
):
    config = mcp_config(approval_wait_s=2)
    client = ElicitingClient(action="accept")
    if declared == "form_only":
        session_kwargs = {"session_class": form_only_session(), **client.session_kwargs()}
    else:
        session_kwargs = {"message_handler": client.message_handler}

    async def scenario(session):
        started = time.monotonic()
        result = await session.call_tool(
            "send_refund", {"payment_id": "pay_big", "amount_cents": 75_000}
        )
        return result, time.monotonic() - started

    log_path = tmp_path / "gateway.log"
    result, elapsed = _through_gateway(
        "stdio",
        config,
        mcp_effectgate.token,
        log_path,
        mcp_free_port,
        scenario,
        **session_kwargs,
    )

    assert elapsed >= 2
    assert result.is_error
    envelope = envelope_of(result)
    assert envelope["status"] == "awaiting_approval"
    request = Operation.objects.get().approval_requests.get()
    assert envelope["approval_url"] == f"{mcp_effectgate.url}/approvals/{request.id}/"
    assert envelope["approval_url"] in envelope["next_step"]
    assert client.elicitations == []
    assert client.completed == []
    assert "asking the client to open" not in log_path.read_text()


# --- 5: configuration ------------------------------------------------------------------------


def _start(config, env=None, timeout=60):
    """Run the gateway over stdio with no client (stdin closed): it starts, registers
    its contracts, and ends when it reads EOF."""
    return subprocess.run(
        [str(GATEWAY), "--config", str(config)],
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _one_line_error(completed):
    assert completed.returncode != 0
    assert "Traceback" not in completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert lines, completed
    return lines[-1]


def test_missing_token_variable_exits_with_one_line(tmp_path, mcp_ledger):
    config = write_config(
        tmp_path / "gateway.toml",
        url="http://127.0.0.1:9",
        token_env="EG_TOKEN_FOR_THIS_TEST",
        upstreams=[{"name": "payments", "command": [sys.executable, str(UPSTREAM)]}],
    )
    env = {key: value for key, value in os.environ.items() if key != "EG_TOKEN_FOR_THIS_TEST"}
    completed = subprocess.run(
        [str(GATEWAY), "--config", str(config)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip() == (
        "effectgate-mcp: the environment variable EG_TOKEN_FOR_THIS_TEST (token_env) is not "
        "set: it must hold the runner token"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[effectgate]\nurl = "http://x"\nprincipal = "user:a"\n',
            "effectgate-mcp: no upstream: add at least one [[upstream]] table",
        ),
        (
            '[effectgate]\nurl = "http://x"\nprincipal = "user:a"\napproval_wait = 5\n'
            '[[upstream]]\nname = "p"\ncommand = ["x"]\n',
            "effectgate-mcp: [effectgate]: unknown key 'approval_wait'",
        ),
        (
            '[effectgate]\nurl = "http://x"\nprincipal = "user:a"\n'
            '[[upstream]]\nname = "p"\ncommand = ["x"]\n'
            '[upstream.tools.send_refund]\neffect_class = "irreversible"\n'
            'aproval = { mode = "never" }\n',
            "effectgate-mcp: upstream 'p' tool 'send_refund': unknown key 'aproval'",
        ),
        (
            '[effectgate]\nurl = "http://x"\nprincipal = "user:a"\n'
            '[[upstream]]\nname = "p"\ncommand = ["x"]\n[upstream.tools.t]\n',
            "effectgate-mcp: upstream 'p' tool 't': effect_class is required",
        ),
        (
            '[effectgate]\nurl = "http://x"\n[[upstream]]\nname = "p"\ncommand = ["x"]\n',
            "effectgate-mcp: [effectgate]: give exactly one of principal or principal_from",
        ),
        ("[effectgate\n", "effectgate-mcp: "),
    ],
)
def test_bad_configuration_exits_with_one_line(tmp_path, text, message):
    config = tmp_path / "gateway.toml"
    config.write_text(text)
    completed = _start(config, env={"EFFECTGATE_TOKEN": "egr_not_used"}, timeout=30)
    assert completed.returncode == 2
    assert len(completed.stderr.strip().splitlines()) == 1, completed.stderr
    assert completed.stderr.startswith(message), completed.stderr
    assert "egr_not_used" not in completed.stderr + completed.stdout


def test_two_upstreams_exposing_one_name_refuse_to_start(tmp_path, mcp_ledger):
    upstream = {
        "command": [sys.executable, str(UPSTREAM)],
        "env": mcp_ledger.upstream_env(),
        "tools": {"send_refund": REFUND_BLOCK},
    }
    config = write_config(
        tmp_path / "gateway.toml",
        url="http://127.0.0.1:9",
        upstreams=[{"name": "payments", **upstream}, {"name": "payments-eu", **upstream}],
    )
    completed = _start(config, env={"EFFECTGATE_TOKEN": "egr_secret_value"})
    assert completed.returncode == 1
    assert _one_line_error(completed) == (
        "effectgate-mcp: tool 'send_refund' is exposed by both upstream 'payments' and "
        "upstream 'payments-eu': exposed names must be unique"
    )
    assert "egr_secret_value" not in completed.stderr


def test_a_tool_the_upstream_lacks_refuses_to_start(mcp_config):
    config = mcp_config(tools={"send_refunds": REFUND_BLOCK})
    completed = _start(config, env={"EFFECTGATE_TOKEN": "egr_x"})
    assert completed.returncode == 1
    assert _one_line_error(completed).startswith(
        "effectgate-mcp: upstream 'payments' has no tool named 'send_refunds'"
    )


def test_a_contract_effectgate_refuses_stops_the_gateway(mcp_config, mcp_effectgate):
    block = {**REFUND_BLOCK, "approval": {"mode": "rules", "rules": [
        {"path": "/amount", "op": "gt", "value": 1}]}}  # fmt: skip
    config = mcp_config(tools={"send_refund": block})
    completed = _start(config, env={"EFFECTGATE_TOKEN": mcp_effectgate.token})
    assert completed.returncode == 1
    line = _one_line_error(completed)
    assert line.startswith("effectgate-mcp: Effectgate refused the contract of 'send_refund'")
    assert "invalid_contract" in line
    assert mcp_effectgate.token not in completed.stderr


def test_a_weaker_contract_is_stored_inactive_with_a_warning(mcp_config, mcp_effectgate):
    env = {"EFFECTGATE_TOKEN": mcp_effectgate.token}
    strict = {**REFUND_BLOCK, "approval": {"mode": "always"}}
    first = _start(mcp_config(tools={"send_refund": strict}), env=env)
    assert first.returncode == 0, first.stderr
    weaker = _start(mcp_config(), env=env)  # rules instead of always
    assert weaker.returncode == 0, weaker.stderr
    warning = [line for line in weaker.stderr.splitlines() if "did not activate" in line]
    assert len(warning) == 1, weaker.stderr
    print(f"\n[mcp-gateway] weaker contract: {warning[0]}")
    assert "version 2 of send_refund" in warning[0]
    assert "approval mode" in warning[0]
    assert "operations run under version 1" in warning[0]
    assert Tool.objects.get(pk="send_refund").active_version.number == 1
    assert mcp_effectgate.token not in first.stderr + weaker.stderr


def test_unlisted_tools_are_exposed_only_with_a_default_effect_class(
    mcp_config, mcp_effectgate, mcp_ledger, tmp_path
):
    upstream = {
        "name": "payments",
        "command": [sys.executable, str(UPSTREAM)],
        "env": mcp_ledger.upstream_env(),
        "default_effect_class": "read_only",
        "tools": {"send_refund": REFUND_BLOCK},
    }
    config = mcp_config(upstreams=[upstream])

    async def scenario():
        with (tmp_path / "stderr.log").open("w") as errlog:
            async with gateway_stdio(config, mcp_effectgate.token, errlog) as session:
                names = sorted(tool.name for tool in (await session.list_tools()).tools)
                result = await session.call_tool("lookup_payment", {"payment_id": "pay_1"})
                return names, result

    names, result = run_in_thread(anyio.run, scenario)
    assert names == ["lookup_payment", "send_refund"]
    assert not result.is_error
    assert result.content[0].text == "payment pay_1: captured"
    assert envelope_of(result)["status"] == "succeeded"
    assert Tool.objects.get(pk="lookup_payment").active_version.contract["effect_class"] == (
        "read_only"
    )


# --- the gateway's calls run on its event loop ------------------------------------------------


def test_a_call_runs_on_the_gateways_loop_with_no_thread_hop(
    mcp_config, mcp_effectgate, mcp_ledger, monkeypatch
):
    # The gateway in this process, over an in-memory MCP connection, with every way of
    # hopping to a thread made to fail: the registration, the run, the claim, the
    # upstream call, the heartbeat and the outcome all happen on the loop.
    import asyncio

    import anyio.from_thread
    from mcp.client._memory import InMemoryTransport

    from effectgate_client import AsyncEffectgateClient, AsyncRunner
    from effectgate_client.integrations._mcp_config import load
    from effectgate_client.integrations.mcp_gateway import Gateway

    config = load(mcp_config())

    def hop(*args, **kwargs):
        raise AssertionError("the gateway hopped to a thread")

    for module, name in (
        (asyncio, "to_thread"),
        (asyncio, "run_coroutine_threadsafe"),
        (anyio.to_thread, "run_sync"),
        (anyio.from_thread, "run"),
        (anyio.from_thread, "run_sync"),
    ):
        monkeypatch.setattr(module, name, hop)
    upstream_calls = []
    call_upstream = Gateway._call_upstream

    async def recording(self, route, captured, ctx):
        heartbeats = [t.name for t in threading.enumerate() if t.name.startswith("heartbeat-")]
        upstream_calls.append((threading.get_ident(), heartbeats))
        return await call_upstream(self, route, captured, ctx)

    monkeypatch.setattr(Gateway, "_call_upstream", recording)

    async def scenario():
        async with AsyncEffectgateClient(config.url, mcp_effectgate.token) as client:
            runner = AsyncRunner(client, lease_s=config.lease_s, wait_s=config.approval_wait_s)
            gateway = Gateway(config, client, runner)
            async with anyio.create_task_group() as task_group:
                await gateway.start(task_group)
                async with session_over(InMemoryTransport(gateway.server())) as session:
                    result = await session.call_tool(
                        "send_refund", {"payment_id": "pay_1", "amount_cents": 300}
                    )
                for link in gateway.links:
                    await link.close()
                task_group.cancel_scope.cancel()
        return threading.get_ident(), result

    loop_thread, result = run_in_thread(anyio.run, scenario)
    assert envelope_of(result)["status"] == "succeeded"
    assert upstream_calls == [(loop_thread, [])]
    operation = Operation.objects.get()
    assert (operation.status, operation.attempts) == ("succeeded", 1)
    assert mcp_ledger.effects == 1


def test_concurrent_calls_of_one_turn_share_one_batch_registration_and_one_of_outcomes(
    mcp_config, mcp_effectgate, mcp_ledger
):
    # The gateway in this process, over an in-memory MCP connection, its Effectgate
    # client on a transport that records every request: five concurrent tools/call
    # requests (one model turn's parallel calls) are one registration request and one
    # outcome request, and each refund is committed once.
    from mcp.client._memory import InMemoryTransport

    from effectgate_client import AsyncEffectgateClient
    from effectgate_client.integrations._mcp_batch import CoalescingRunner
    from effectgate_client.integrations._mcp_config import load
    from effectgate_client.integrations.mcp_gateway import Gateway
    from tests.client.support import LosingTransport

    config = load(mcp_config(batch_window_ms=200))
    transport = LosingTransport()
    payments = [f"pay_{n}" for n in range(5)]

    async def scenario():
        client = AsyncEffectgateClient(config.url, mcp_effectgate.token, transport=transport)
        async with client:
            runner = CoalescingRunner(
                client,
                window_s=config.batch_window_ms / 1000,
                lease_s=config.lease_s,
                wait_s=config.approval_wait_s,
            )
            gateway = Gateway(config, client, runner)
            results = {}
            async with anyio.create_task_group() as task_group:
                await gateway.start(task_group)
                async with session_over(InMemoryTransport(gateway.server())) as session:

                    async def call(payment):
                        results[payment] = await session.call_tool(
                            "send_refund", {"payment_id": payment, "amount_cents": 300}
                        )

                    async with anyio.create_task_group() as calls:
                        for payment in payments:
                            calls.start_soon(call, payment)
                for link in gateway.links:
                    await link.close()
                task_group.cancel_scope.cancel()
        return results

    results = run_in_thread(anyio.run, scenario)
    assert {payment: envelope_of(results[payment])["status"] for payment in payments} == {
        payment: "succeeded" for payment in payments
    }
    run = Operation.objects.values_list("run_id", flat=True).distinct().get()
    operation_requests = [line for line in transport.sent if "/operations" in line]
    assert operation_requests == ["POST /api/v1/operations"]
    assert [line for line in transport.sent if "outcome" in line] == [
        f"POST /api/v1/runs/{run}/outcomes"
    ]
    assert Operation.objects.filter(status="succeeded", attempts=1).count() == 5
    assert mcp_ledger.per_payment() == {payment: 1 for payment in payments}


def test_the_batch_window_defaults_to_2_ms(mcp_config):
    from effectgate_client.integrations._mcp_config import load

    assert load(mcp_config()).batch_window_ms == 2.0
