"""A hostile MCP upstream: the gateway registers each upstream tool's ``inputSchema`` as
its contract's input schema, so an upstream that advertises a remote ``$ref`` or a
backtracking pattern reaches ``PUT /tools`` like a runner would. Effectgate refuses the
contract (422 ``invalid_contract``) and fetches nothing; the gateway does not start."""

import json
import os
import subprocess
import sys

import pytest

from operations.models import Tool
from tests.integrations.conftest import GATEWAY, REFUND_BLOCK, UPSTREAM
from tests.security.test_hostile_schemas import SchemaHost

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _schema(amount: dict) -> dict:
    return {
        "type": "object",
        "required": ["payment_id", "amount_cents"],
        "properties": {"payment_id": {"type": "string"}, "amount_cents": amount},
    }


@pytest.fixture
def schema_host():
    host = SchemaHost()
    yield host
    host.close()


@pytest.mark.parametrize(
    ("amount", "where", "words"),
    [
        (None, "/input_schema/properties/amount_cents/$ref", "refers outside the schema"),
        (
            {"type": "string", "pattern": "^(a)\\1$"},
            "/input_schema/properties/amount_cents/pattern",
            "linear time",
        ),
    ],
    ids=["remote-ref", "back-reference"],
)
def test_a_hostile_upstream_schema_is_refused_and_fetched_from_nowhere(
    mcp_config, mcp_effectgate, mcp_ledger, schema_host, amount, where, words
):
    amount = amount or {"$ref": schema_host.url}
    env = {
        **mcp_ledger.upstream_env(),
        "MCP_UPSTREAM_INPUT_SCHEMAS": json.dumps({"send_refund": _schema(amount)}),
    }
    config = mcp_config(
        upstreams=[
            {
                "name": "payments",
                "command": [sys.executable, str(UPSTREAM)],
                "env": env,
                "tools": {"send_refund": REFUND_BLOCK},
            }
        ]
    )
    completed = subprocess.run(
        [str(GATEWAY), "--config", str(config)],
        env={**os.environ, "EFFECTGATE_TOKEN": mcp_effectgate.token},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 1, completed.stderr
    line = completed.stderr.strip().splitlines()[-1]
    assert line.startswith("effectgate-mcp: Effectgate refused the contract of 'send_refund'")
    assert "invalid_contract" in line
    assert where in line, line
    assert words in line, line
    assert schema_host.requests == []
    assert not Tool.objects.filter(pk="send_refund").exists()
