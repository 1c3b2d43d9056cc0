"""The compact envelope a runner hands back to the model."""

from tests.conftest import contract


def test_tool_result_for_success_and_unknown(api):
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    run = api.run()
    ok = api.register(run, "refund")
    api.claim(ok["id"])
    api.outcome(ok["id"], 1, {"kind": "succeeded", "downstream_id": "re_1"})
    body = api.get(f"/api/v1/operations/{ok['id']}/tool-result").json()
    assert body == {
        "status": "succeeded",
        "code": None,
        "logical_operation_id": ok["id"],
        "message": "The call to refund succeeded (reference re_1).",
        "allowed_next_actions": [],
    }
    lost = api.register(run, "refund")
    api.claim(lost["id"])
    api.outcome(lost["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    body = api.get(f"/api/v1/operations/{lost['id']}/tool-result").json()
    assert body["status"] == "outcome_unknown"
    assert body["code"] == "timeout_unknown"
    assert "do not retry" in body["message"]
    assert body["allowed_next_actions"] == ["reconcile"]
