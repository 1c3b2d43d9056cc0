from tests.conftest import contract


def test_register_claim_succeed_through_the_api(api):
    api.tool("send_refund", contract("irreversible", approval={"mode": "never"}))
    run = api.run()
    op = api.register(run, "send_refund")
    assert op["status"] == "ready"
    assert op["allowed_next_actions"] == ["claim_attempt"]
    attempt = api.claim(op["id"])
    assert attempt["attempt"] == 1
    assert attempt["idempotency_key"] == op["idempotency_key"]
    done = api.outcome(op["id"], 1, {"kind": "succeeded", "downstream_id": "re_1", "cost": 0.5})
    assert done["status"] == "succeeded"
    assert done["downstream_id"] == "re_1"
    assert done["allowed_next_actions"] == []
    events = api.get(f"/api/v1/operations/{op['id']}/events").json()
    assert [e["kind"] for e in events] == ["registered", "claimed", "outcome"]
    assert api.get(f"/api/v1/runs/{run}").json()["usage"]["spend"] == 0.5
