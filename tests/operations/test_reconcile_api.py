"""Reconciliation and compensation answers posted by runners (api.md)."""

from operations.models import Attempt, Event, Operation
from tests.conftest import contract


def _unknown(api, cls="irreversible", **retry):
    body = contract(cls, approval={"mode": "never"})
    body["retry"].update(retry)
    api.tool(f"t_{cls}", body)
    op = api.register(api.run(), f"t_{cls}")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    return op


def _reconcile(api, op_id, body, expect=200):
    response = api.post(f"/api/v1/operations/{op_id}/reconciliations", body)
    assert response.status_code == expect, response.json()
    return response.json()


def test_only_a_tool_with_a_lookup_has_a_lookup_due(api, settings):
    manual = _unknown(api)  # the contract's default: people reconcile
    assert api.get(f"/api/v1/operations/{manual['id']}").json()["next_probe_at"] is None

    settings.RECONCILE_ALLOWED_HOSTS = ["127.0.0.1"]
    body = contract("irreversible", approval={"mode": "never"})
    body["reconcile"] = {"mode": "lookup", "url": "http://127.0.0.1:9/{idempotency_key}"}
    api.tool("t_lookup", body)
    op = api.register(api.run(), "t_lookup")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    looked_up = api.get(f"/api/v1/operations/{op['id']}").json()
    assert looked_up["status"] == "outcome_unknown"
    assert looked_up["next_probe_at"] is not None


def test_committed_closes_as_succeeded_with_the_reference(api):
    op = _unknown(api)
    body = _reconcile(
        api,
        op["id"],
        {"result": "committed", "downstream_id": "re_7", "evidence": {"lookup": "found"}},
    )
    assert body["status"] == "succeeded"
    assert body["downstream_id"] == "re_7"
    event = Event.objects.get(stream=op["id"], kind="reconciled")
    assert event.data["evidence"] == {"lookup": "found"}


def test_not_found_on_irreversible_needs_a_new_approval_showing_the_evidence(api):
    op = _unknown(api)
    body = _reconcile(api, op["id"], {"result": "not_found", "evidence": {"checked": "ledger"}})
    assert body["status"] == "awaiting_approval"
    assert body["approval"]["status"] == "pending"
    stored = Operation.objects.get(pk=op["id"])
    assert not stored.unknown_sticky
    assert Attempt.objects.get(operation=stored).not_applied
    request = stored.approval_requests.get()
    assert request.context["reconciliation"]["evidence"] == {"checked": "ledger"}


def test_not_found_with_no_attempt_left_ends_in_budget_exhausted(api):
    op = _unknown(api, "idempotent", max_attempts=1)
    # max_attempts=1: the unknown outcome could not retry and the sticky flag held it.
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"
    body = _reconcile(api, op["id"], {"result": "not_found"})
    assert body["status"] == "budget_exhausted"


def test_not_found_with_attempts_left_is_ready_again(api):
    op = _unknown(api, "idempotent")  # unknown -> ready, same key
    api.claim(op["id"])
    held = api.outcome(op["id"], 2, {"kind": "failed", "code": "forbidden"})
    assert held["status"] == "outcome_unknown"  # unknown is sticky
    body = _reconcile(api, op["id"], {"result": "not_found"})
    assert body["status"] == "ready"
    assert body["allowed_next_actions"] == ["claim_attempt"]
    assert Attempt.objects.filter(operation_id=op["id"], not_applied=True).count() == 1
    assert api.claim(op["id"])["attempt"] == 3


def test_still_unknown_schedules_the_next_probe_until_max_probes(api):
    body = contract(
        "irreversible", approval={"mode": "never"}, reconcile={"mode": "manual", "max_probes": 2}
    )
    api.tool("probed", body)
    op = api.register(api.run(), "probed")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    first = _reconcile(api, op["id"], {"result": "still_unknown"})
    assert first["status"] == "outcome_unknown"
    assert first["next_probe_at"] is not None
    _reconcile(api, op["id"], {"result": "still_unknown"})
    stored = Operation.objects.get(pk=op["id"])
    assert stored.probes == 2
    assert stored.next_probe_at is None
    last = Event.objects.filter(stream=op["id"], kind="probe").last()
    assert last.data["probes_exhausted"] is True


def test_reconciliation_of_an_operation_that_is_not_unknown(api):
    api.tool("t")
    op = api.register(api.run(), "t")
    assert _reconcile(api, op["id"], {"result": "committed"}, expect=409)["code"] == "not_unknown"


def test_compensation_committed_and_failed(api):
    op = _unknown(api, "compensable")
    assert Operation.objects.get(pk=op["id"]).status == "compensating"
    url = f"/api/v1/operations/{op['id']}/compensations"
    failed = api.post(url, {"result": "failed", "evidence": {"error": "refund api down"}})
    assert failed.status_code == 200
    assert failed.json()["status"] == "compensating"
    assert failed.json()["error_code"] == "compensation_failed"
    done = api.post(url, {"result": "committed"})
    assert done.json()["status"] == "compensated"
    assert done.json()["allowed_next_actions"] == []
    again = api.post(url, {"result": "committed"})
    assert again.status_code == 409
    assert again.json()["code"] == "not_compensating"


def test_nobody_cancels_an_unknown_operation(api):
    op = _unknown(api)
    run = Operation.objects.get(pk=op["id"]).run_id
    assert api.post(f"/api/v1/runs/{run}/cancel").json()["status"] == "cancelled"
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"


def test_after_compensation_a_retry_is_a_new_operation_linked_to_the_old(api):
    op = _unknown(api, "compensable")
    api.post(f"/api/v1/operations/{op['id']}/compensations", {"result": "committed"})
    run = Operation.objects.get(pk=op["id"]).run_id
    retry = api.register(run, "t_compensable", retry_of=op["id"])
    assert retry["id"] != op["id"]
    assert retry["previous_operation"] == op["id"]
    assert retry["idempotency_key"] != op["idempotency_key"]


def test_retry_of_must_name_a_compensated_operation(api):
    api.tool("t")
    run = api.run()
    live = api.register(run, "t")
    refusal = api.register(run, "t", retry_of=live["id"], expect=400)
    assert refusal["errors"][0]["path"] == "/retry_of"
    assert api.register(run, "t", retry_of="op_nope", expect=404)["code"] == "not_found"
