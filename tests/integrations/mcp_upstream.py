"""A payments MCP server for the gateway tests, built with the SDK's ``MCPServer``.

``send_refund(payment_id, amount_cents, fault="")`` commits a refund by appending one
line to the ledger file named by ``MCP_UPSTREAM_LEDGER``: the ledger counts the effects
really committed, so a test can count duplicates. It never deduplicates by itself (it
records the idempotency key it was given, if any, but does not act on it): whatever
protects against duplicates must sit in front of it.

Faults, from the ``fault`` argument or, when that is empty, ``MCP_UPSTREAM_FAULT``:

- ``timeout_after_commit``: commits, then sleeps ``MCP_UPSTREAM_SLEEP_S`` (default 5)
  seconds, longer than the caller waits: the answer is lost.
- ``crash_after_commit``: commits, then the process dies (``os._exit(1)``).
- ``refused``: answers an error without committing anything.

``MCP_UPSTREAM_INPUT_SCHEMAS``, when set, is a JSON object of tool name to the
``inputSchema`` the server advertises for it instead of the one its signature gives: a
hostile upstream, for the tests of what the gateway registers.

Run it over stdio (``python mcp_upstream.py``) or streamable HTTP
(``python mcp_upstream.py --http PORT``).
"""

from __future__ import annotations

import json
import os
import sys
import time

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent

LEDGER_ENV = "MCP_UPSTREAM_LEDGER"
SCHEMAS_ENV = "MCP_UPSTREAM_INPUT_SCHEMAS"
FAULT_ENV = "MCP_UPSTREAM_FAULT"
SLEEP_ENV = "MCP_UPSTREAM_SLEEP_S"
FAULTS = ("timeout_after_commit", "crash_after_commit", "refused")

server = MCPServer("payments")


def _commit(payment_id: str, amount_cents: int, idempotency_key: str | None) -> str:
    """Append one committed refund to the ledger; the refund's id."""
    refund_id = f"re_{time.monotonic_ns()}_{os.getpid()}"
    line = json.dumps(
        {
            "refund": refund_id,
            "payment_id": payment_id,
            "amount_cents": amount_cents,
            "idempotency_key": idempotency_key,
        }
    )
    with open(os.environ[LEDGER_ENV], "a", encoding="utf-8") as ledger:
        ledger.write(line + "\n")
        ledger.flush()
        os.fsync(ledger.fileno())
    return refund_id


@server.tool()
async def send_refund(payment_id: str, amount_cents: int, ctx: Context, fault: str = "") -> str:
    """Refund part of a payment. Irreversible: the money leaves."""
    fault = fault or os.environ.get(FAULT_ENV, "")
    if fault and fault not in FAULTS:
        raise ToolError(f"unknown fault {fault!r}")
    if fault == "refused":
        # A refusal that says so: nothing was committed (an error without this code
        # could have come after the commit, and the gateway posts it as unknown).
        return CallToolResult(
            content=[
                TextContent(
                    type="text",
                    text=f"payment {payment_id} cannot be refunded: it is already fully refunded",
                )
            ],
            is_error=True,
            _meta={"effectgate/error_code": "already_refunded"},
        )
    meta = ctx.request_context.meta or {}
    key = meta.get("effectgate/idempotency_key")
    refund_id = _commit(payment_id, amount_cents, key if isinstance(key, str) else None)
    if fault == "crash_after_commit":
        os._exit(1)
    if fault == "timeout_after_commit":
        await anyio.sleep(float(os.environ.get(SLEEP_ENV, "5")))
    return f"refunded {amount_cents} cents of {payment_id} as {refund_id}"


@server.tool()
def lookup_payment(payment_id: str) -> str:
    """Read a payment (not listed in the gateway's configuration in most tests)."""
    return f"payment {payment_id}: captured"


def _advertise(schemas: dict) -> None:
    for name, schema in schemas.items():
        server._tool_manager.get_tool(name).parameters = schema


if __name__ == "__main__":
    _advertise(json.loads(os.environ.get(SCHEMAS_ENV, "{}")))
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
