"""Registration: identity by operation_key, frozen arguments, sensitive fields."""

import copy
import re

from django.test import override_settings

from operations import models, services
from operations.audit.state import state_verify
from operations.canonical import intent_hash
from operations.models import Event, Operation
from tests.approvals.conftest import person
from tests.conftest import REFUND_SCHEMA, contract


def test_same_key_same_intent_is_the_same_operation(api):
    api.tool("t")
    run = api.run()
    first = api.register(run, "t", operation_key="order-551:refund")
    again = api.register(run, "t", operation_key="order-551:refund", expect=200)
    assert again["id"] == first["id"]
    assert again["idempotency_key"] == first["idempotency_key"]
    assert Operation.objects.count() == 1


def test_same_key_different_intent_is_refused(api):
    api.tool("t")
    api.tool("u")
    run = api.run()
    api.register(run, "t", {"payment_id": "p", "amount_cents": 1}, operation_key="k")
    for tool, arguments in (
        ("t", {"payment_id": "p", "amount_cents": 2}),
        ("u", {"payment_id": "p", "amount_cents": 1}),
        ("t", {"payment_id": "p"}),
    ):
        refusal = api.register(run, tool, arguments, operation_key="k", expect=422)
        assert refusal["code"] == "intent_mismatch"
    other_principal = api.run(principal="user:bob")
    refusal = api.register(
        other_principal, "t", {"payment_id": "p", "amount_cents": 1}, operation_key="k", expect=422
    )
    assert refusal["code"] == "intent_mismatch"
    assert Operation.objects.count() == 1


def test_operation_key_is_required(api):
    api.tool("t")
    response = api.post("/api/v1/operations", {"run": api.run(), "tool": "t", "arguments": {}})
    assert response.status_code == 400
    assert response.json()["code"] == "operation_key_required"


def test_unknown_tool(api):
    assert api.register(api.run(), "nope", expect=404)["code"] == "unknown_tool"


def test_invalid_arguments_list_json_pointer_paths(api):
    api.tool("t")
    refusal = api.register(api.run(), "t", {"payment_id": 7, "amount_cents": 0, "x": 1}, expect=422)
    assert refusal["code"] == "invalid_arguments"
    paths = sorted(e["path"] for e in refusal["errors"])
    assert paths == ["/arguments", "/arguments/amount_cents", "/arguments/payment_id"]
    assert Operation.objects.count() == 0


def test_intent_hash_is_recomputable_from_the_body(api):
    api.tool("t")
    op = api.register(api.run(principal="user:carol"), "t")
    assert op["intent_hash"] == intent_hash(
        tool="t", arguments=op["arguments"], principal="user:carol"
    )


def _sensitive_tool(api):
    schema = copy.deepcopy(REFUND_SCHEMA)
    schema["properties"]["card"] = {"type": "string", "minLength": 12, "x-sensitive": True}
    api.tool("charge", contract("irreversible", input_schema=schema, approval={"mode": "never"}))


@override_settings(SENSITIVE_ARGUMENT_KEY="k" * 32, SENSITIVE_ARGUMENT_KEY_ID="k7")
def test_sensitive_fields_are_stored_and_shown_only_as_digests(api):
    _sensitive_tool(api)
    secret = "4111111111111111"
    op = api.register(api.run(), "charge", {"payment_id": "p", "amount_cents": 5, "card": secret})
    digest = op["arguments"]["card"]
    assert digest.startswith("hmac-sha256:k7:")
    assert len(digest.split(":")[2]) == 64
    stored = Operation.objects.get(pk=op["id"])
    assert secret not in str(stored.arguments)
    assert all(secret not in str(e.data) for e in Event.objects.all())
    assert op["intent_hash"] == intent_hash(
        tool="charge", arguments=op["arguments"], principal="user:alice"
    )
    # The same secret gives the same digest, so a replay is the same intent.
    again = api.register(
        stored.run_id,
        "charge",
        {"payment_id": "p", "amount_cents": 5, "card": secret},
        operation_key=stored.operation_key,
        expect=200,
    )
    assert again["id"] == op["id"]


def test_validation_messages_never_echo_a_sensitive_value(api):
    _sensitive_tool(api)
    refusal = api.register(
        api.run(), "charge", {"payment_id": "p", "amount_cents": 5, "card": "secret-41"}, expect=422
    )
    assert "secret-41" not in str(refusal)
    assert refusal["errors"][0]["path"] == "/arguments/card"


def _registered(op_id: str) -> dict:
    return Event.objects.get(stream=op_id, seq=1, kind="registered").data


def _iso(value) -> str:
    return value.isoformat().replace("+00:00", "Z")


def test_every_way_in_records_the_same_registered_event(api):
    """A registration on the lean path, one on the general path, a retry of a compensated
    operation and a person's edited copy all open their stream with the same fields:
    what the operation is, its deadline, and where it came from."""
    retry = {"max_attempts": 3, "retryable_codes": [], "base_delay_ms": 0, "max_delay_ms": 0}
    api.tool("lean", contract(retry={**retry, "deadline_s": 600}))
    api.tool(
        "asks",
        contract(
            "irreversible",
            approval={"mode": "always", "editable": ["/amount_cents"]},
            retry={**retry, "deadline_s": 600},
        ),
    )
    api.tool("undoable", contract("compensable", retry=retry))
    run = api.run()

    lean = api.register(run, "lean", call_id="call_1", turn=2, claim={"lease_s": 30})
    asks = api.register(run, "asks", call_id="call_2", turn=3)
    assert (lean["status"], asks["status"]) == ("executing", "awaiting_approval")
    for body, tool, call_id, turn in ((lean, "lean", "call_1", 2), (asks, "asks", "call_2", 3)):
        stored = Operation.objects.get(pk=body["id"])
        assert _registered(body["id"]) == {
            "tool": tool,
            "tool_version": 1,
            "operation_key": body["operation_key"],
            "call_id": call_id,
            "intent_hash": body["intent_hash"],
            "idempotency_key": stored.idempotency_key,
            "turn": turn,
            "retry_of": None,
            "deadline_at": _iso(stored.deadline_at),
        }

    compensated = api.register(run, "undoable", claim={"lease_s": 30})
    api.outcome(compensated["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    response = api.post(
        f"/api/v1/operations/{compensated['id']}/compensations", {"result": "committed"}
    )
    assert response.json()["status"] == "compensated"
    retried = api.register(run, "undoable", retry_of=compensated["id"])
    assert _registered(retried["id"]) == {
        "tool": "undoable",
        "tool_version": 1,
        "operation_key": retried["operation_key"],
        "call_id": "",
        "intent_hash": retried["intent_hash"],
        "idempotency_key": retried["idempotency_key"],
        "turn": None,
        "retry_of": compensated["id"],
        "deadline_at": None,
    }

    approver = person(decide_on="asks")
    successor = services.approval_decide(
        request_id=asks["approval"]["id"],
        user=approver,
        approve=True,
        comment="",
        edits={"/amount_cents": 400},
    )
    changes = [{"path": "/amount_cents", "from": 500, "to": 400}]
    assert _registered(successor.id) == {
        "tool": "asks",
        "tool_version": 1,
        "operation_key": f"{asks['operation_key']}~edit-1",
        "call_id": "call_2",
        "intent_hash": successor.intent_hash,
        "idempotency_key": successor.idempotency_key,
        "turn": 3,
        "edited_from": asks["id"],
        "edits": changes,
        "deadline_at": _iso(Operation.objects.get(pk=asks["id"]).deadline_at),
    }
    stored = Operation.objects.get(pk=successor.id)
    assert (stored.previous_id, stored.edits, stored.effect_class) == (
        asks["id"],
        changes,
        "irreversible",
    )
    assert list(state_verify()) == []


def test_each_operation_gets_its_own_unguessable_idempotency_key(api):
    """Minted by operations (``models.new_idempotency_key``): 192 bits of the OS CSPRNG
    in URL-safe base64 behind ``ik_``, stored once and the same on every read."""
    api.tool("t")
    run = api.run()
    bodies = [api.register(run, "t") for _ in range(3)]
    keys = [body["idempotency_key"] for body in bodies]
    assert all(re.fullmatch(r"ik_[A-Za-z0-9_-]{32}", key) for key in keys)
    assert len(set(keys)) == 3
    stored = dict(Operation.objects.values_list("pk", "idempotency_key"))
    assert stored == {body["id"]: body["idempotency_key"] for body in bodies}
    assert models.new_idempotency_key() not in stored.values()
