"""How the MCP gateway classifies an upstream's error answer (no process needed)."""

from effectgate_client import Failed, Unknown


def _upstream_failure(answer):
    # The gateway and mcp_types load the MCP SDK: only when a test of this module runs.
    from effectgate_client.integrations.mcp_gateway import _upstream_failure

    return _upstream_failure(answer)


def _error(meta=None):
    from mcp_types import CallToolResult, TextContent

    return CallToolResult(
        content=[TextContent(type="text", text="it went wrong")], is_error=True, _meta=meta
    )


def test_an_error_without_a_code_may_have_committed_and_is_unknown():
    outcome = _upstream_failure(_error())
    assert isinstance(outcome, Unknown)
    assert outcome.body()["code"] == "upstream_error_unknown"


def test_an_error_with_a_code_is_a_failure_with_that_code():
    outcome = _upstream_failure(_error({"effectgate/error_code": "card_declined"}))
    assert isinstance(outcome, Failed)
    assert outcome.body()["code"] == "card_declined"


def test_an_upstream_cannot_claim_not_sent():
    outcome = _upstream_failure(_error({"effectgate/error_code": "not_sent"}))
    assert isinstance(outcome, Failed)
    assert outcome.body()["code"] == "upstream_not_sent"


def test_an_error_code_with_a_final_newline_is_no_code_and_the_error_is_unknown():
    """A malformed code is not the upstream saying nothing was committed."""
    outcome = _upstream_failure(_error({"effectgate/error_code": "rate_limited\n"}))
    assert isinstance(outcome, Unknown)
    assert outcome.body()["code"] == "upstream_error_unknown"
