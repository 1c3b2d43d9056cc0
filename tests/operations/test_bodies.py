"""Every answer body has exactly the keys the OpenAPI document describes for it.

The operation, approval, grant and attempt bodies are built by ``operations.payloads``
(the webhooks send the same ones) and only described by serializers, so nothing but
these tests keeps the two from drifting apart: a key added to a payload and not to its
serializer would be an undocumented field, a field declared and not built a promise the
server does not keep. Each test drives the real API and compares every object in every
answer, nested ones included, with its schema in the document the server publishes:
no key that the schema does not name, every key it marks required, and, over the whole
world, every key it names at least once.
"""

import json
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook

from approvals.models import ApprovalRequest
from operations import payloads, services
from operations.models import Operation, OutboxMessage
from tests.approvals.conftest import person
from tests.conftest import REFUND_SCHEMA, contract
from tests.support.audit_log import seal_all

METHODS = {"get", "put", "post", "patch", "delete"}
JSON = "application/json"

REFUND = contract(
    "irreversible",
    description="Refund a card payment.",
    input_schema={
        **REFUND_SCHEMA,
        "properties": {**REFUND_SCHEMA["properties"], "note": {"type": "string"}},
    },
    approval={"mode": "always", "editable": ["/amount_cents"]},
    concurrency_key="/payment_id",
    inbound={
        "idempotency_key": "/data/metadata/idempotency_key",
        "type": "/type",
        "succeeded": ["refund.succeeded"],
    },
    display={"summary": "Refund {/amount_cents} to {/payment_id}"},
    breaker={"failure_codes": ["upstream_5xx"], "threshold": 5},
)


class Document:
    """The published document, and what the answers checked against it contained."""

    def __init__(self) -> None:
        response = APIClient().get("/api/schema/", {"format": "json"})
        assert response.status_code == 200
        self.paths = response.json()["paths"]
        self.components = response.json()["components"]["schemas"]
        self.sent: dict[str, set[str]] = {}
        self.answered: set[tuple[str, str, str]] = set()

    @staticmethod
    def component(name: str) -> dict[str, Any]:
        return {"$ref": f"#/components/schemas/{name}"}

    def answer(self, response, method: str, template: str) -> Any:
        """Check ``response`` against the schema of ``method template`` at its status."""
        status = str(response.status_code)
        assert status.startswith("2"), response.content
        described = self.paths[f"/api/v1{template}"][method]["responses"][status]
        self.check(
            response.json(),
            described["content"][JSON]["schema"],
            where=f"{method.upper()} {template} {status}",
        )
        self.answered.add((template, method, status))
        return response.json()

    def check(self, body: Any, schema: dict[str, Any], *, where: str) -> None:
        name = None
        while "$ref" in schema or len(schema.get("allOf", ())) == 1:
            if "$ref" in schema:
                name = schema["$ref"].rsplit("/", 1)[1]
                schema = self.components[name]
            else:
                schema = schema["allOf"][0]
        if body is None:
            return
        if "oneOf" in schema:
            # Exactly one alternative describes the body (a registration or a batch).
            fits = []
            for option in schema["oneOf"]:
                try:
                    self.check(body, option, where=where)
                except AssertionError:
                    continue
                fits.append(option)
            assert len(fits) == 1, f"{where}: {len(fits)} of oneOf describe the body"
            return
        if "enum" in schema:
            assert body in schema["enum"], f"{where}: {body!r} not in {schema['enum']}"
        if schema.get("type") == "array" and "items" in schema:
            assert isinstance(body, list), where
            for index, item in enumerate(body):
                self.check(item, schema["items"], where=f"{where}[{index}]")
            return
        properties = schema.get("properties")
        if properties is None:
            return  # any JSON value: arguments, a result, an event's data
        assert isinstance(body, dict), where
        undescribed = sorted(set(body) - set(properties))
        missing = sorted(set(schema.get("required", [])) - set(body))
        assert not undescribed, f"{where} ({name}) sends keys its schema lacks: {undescribed}"
        assert not missing, f"{where} ({name}) lacks keys its schema requires: {missing}"
        self.sent.setdefault(name or where, set()).update(body)
        for key, value in body.items():
            self.check(value, properties[key], where=f"{where}.{key}")

    def answer_bodies(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        """The schema of every 2xx answer with a JSON body, by (path, method, status)."""
        return {
            (path.removeprefix("/api/v1"), method, status): response["content"][JSON]["schema"]
            for path, item in self.paths.items()
            for method, operation in item.items()
            if method in METHODS
            for status, response in operation["responses"].items()
            if status.startswith("2") and "content" in response
        }

    def reachable(self, schema: Any) -> set[str]:
        """The components ``schema`` names, and the ones they name, transitively."""
        found: set[str] = set()
        pending = [schema]
        while pending:
            node = pending.pop()
            if isinstance(node, list):
                pending.extend(node)
            elif isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str) and (name := ref.rsplit("/", 1)[1]) not in found:
                    found.add(name)
                    pending.append(self.components[name])
                pending.extend(value for key, value in node.items() if key != "$ref")
        return found


def _approve_with_an_edit(document: Document, api, op: dict[str, Any]) -> dict[str, Any]:
    approver = person(decide_on="refund")
    successor = services.approval_decide(
        request_id=op["approval"]["id"],
        user=approver,
        approve=True,
        comment="half, per policy",
        edits={"/amount_cents": 25000},
    )
    body = document.answer(
        api.get(f"/api/v1/operations/{successor.id}"), "get", "/operations/{operation_id}"
    )
    assert body["edits"] == [{"path": "/amount_cents", "from": 50000, "to": 25000}]
    assert body["approval"]["grant"]["decided_by"] == [approver.username]
    return body


def _claim_and_reconcile(document: Document, api, op: dict[str, Any]) -> None:
    base = f"/api/v1/operations/{op['id']}"
    attempt = document.answer(
        api.post(f"{base}/attempts", {"lease_s": 30}), "post", "/operations/{operation_id}/attempts"
    )
    document.answer(
        api.post(f"{base}/attempts/1/heartbeat", {"lease_s": 30}),
        "post",
        "/operations/{operation_id}/attempts/{number}/heartbeat",
    )
    answer = document.answer(
        api.post(f"{base}/attempts/1/outcome", {"kind": "unknown", "code": "timeout_unknown"}),
        "post",
        "/operations/{operation_id}/attempts/{number}/outcome",
    )
    assert (attempt["attempt"], answer["tool_result"]["status"]) == (1, "outcome_unknown")
    reconciled = document.answer(
        api.post(f"{base}/reconciliations", {"result": "committed", "downstream_id": "re_1"}),
        "post",
        "/operations/{operation_id}/reconciliations",
    )
    assert reconciled["status"] == "succeeded"
    document.answer(api.get(f"{base}/events"), "get", "/operations/{operation_id}/events")
    document.answer(api.get(f"{base}/tool-result"), "get", "/operations/{operation_id}/tool-result")


def _batches(document: Document, api, run: str) -> None:
    """A registration batch (one new and claimed, one refused) and an outcome batch."""
    api.tool("batched", contract("irreversible"))
    items = [
        {
            "run": run,
            "tool": "batched",
            "operation_key": "batched-1",
            "arguments": {"payment_id": "pay_b1", "amount_cents": 100},
            "claim": {"lease_s": 30},
        },
        {"run": run, "tool": "batched", "operation_key": "batched-2", "arguments": []},
    ]
    answer = document.answer(api.post("/api/v1/operations", items), "post", "/operations")
    first, refused = answer["results"]
    assert (first["status"], refused["status"]) == (201, 400), answer
    assert refused["problem"]["code"] == "invalid_request"
    outcomes = [
        {"operation": first["operation"]["id"], "attempt": 1, "kind": "succeeded"},
        {"operation": "op_nothing", "attempt": 1, "kind": "succeeded"},
    ]
    done = document.answer(
        api.post(f"/api/v1/runs/{run}/outcomes", outcomes), "post", "/runs/{run_id}/outcomes"
    )
    assert [item["status"] for item in done["results"]] == [200, 404], done


def _compensate_and_refuse_a_claim(document: Document, api, run: str) -> None:
    """A compensation, a registration that claims, and one whose claim the open breaker
    refuses (``claim_error`` with ``retry_after_ms`` and ``breaker``)."""
    body = contract("compensable", breaker={"failure_codes": ["upstream_5xx"], "threshold": 1})
    body["retry"]["max_attempts"] = 1
    api.tool("undo", body)
    registered = []
    for key in ("undo-1", "undo-2", "undo-3"):
        registration = {
            "run": run,
            "tool": "undo",
            "operation_key": key,
            "arguments": {"payment_id": key, "amount_cents": 100},
            "claim": {"lease_s": 30},
        }
        registered.append(
            document.answer(api.post("/api/v1/operations", registration), "post", "/operations")
        )
        if key == "undo-1":
            api.outcome(registered[0]["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
        if key == "undo-2":
            api.outcome(registered[1]["id"], 1, {"kind": "failed", "code": "upstream_5xx"})
    compensated = document.answer(
        api.post(
            f"/api/v1/operations/{registered[0]['id']}/compensations", {"result": "committed"}
        ),
        "post",
        "/operations/{operation_id}/compensations",
    )
    assert compensated["status"] == "compensated"
    refused = registered[2]
    assert refused["attempt"] is None
    assert refused["claim_error"]["breaker"] == "open"
    assert Operation.objects.get(pk=refused["id"]).status == "ready"


def _webhook_endpoints(document: Document, api) -> None:
    created = document.answer(
        api.post(
            "/api/v1/webhook-endpoints",
            {"url": "http://127.0.0.1:9/hook", "events": ["operation.*"]},
        ),
        "post",
        "/webhook-endpoints",
    )
    document.answer(api.get("/api/v1/webhook-endpoints"), "get", "/webhook-endpoints")
    document.answer(
        api.get(f"/api/v1/webhook-endpoints/{created['id']}"),
        "get",
        "/webhook-endpoints/{endpoint_id}",
    )
    document.answer(
        api.post(f"/api/v1/webhook-endpoints/{created['id']}/rotate-secret"),
        "post",
        "/webhook-endpoints/{endpoint_id}/rotate-secret",
    )


def _inbound(document: Document, op: dict[str, Any], capsys) -> None:
    call_command("tool", "inbound-secret", "refund")
    signer = Webhook(capsys.readouterr().out.strip().splitlines()[-1])
    payload = json.dumps(
        {
            "type": "refund.succeeded",
            "data": {"metadata": {"idempotency_key": op["idempotency_key"]}},
        }
    )
    at = timezone.now()
    response = APIClient().post(
        "/api/v1/inbound/refund",
        payload,
        content_type="application/json",
        HTTP_WEBHOOK_ID="evt_1",
        HTTP_WEBHOOK_TIMESTAMP=str(int(at.timestamp())),
        HTTP_WEBHOOK_SIGNATURE=signer.sign("evt_1", at, payload),
    )
    assert document.answer(response, "post", "/inbound/{tool}")["operation"] == op["id"]


def _audit(document: Document, api, op: dict[str, Any]) -> None:
    """The transparency log's answers, once the sealer signed two checkpoints."""
    seal_all()
    first = document.answer(
        api.get("/api/v1/audit/checkpoints/latest"), "get", "/audit/checkpoints/latest"
    )
    api.run()
    seal_all()
    second = document.answer(
        api.get("/api/v1/audit/checkpoints/latest"), "get", "/audit/checkpoints/latest"
    )
    document.answer(
        api.get(f"/api/v1/audit/checkpoints/{first['size']}"), "get", "/audit/checkpoints/{size}"
    )
    event = api.get(f"/api/v1/operations/{op['id']}/events").json()[0]["id"]
    document.answer(
        api.get(f"/api/v1/audit/events/{event}/inclusion"),
        "get",
        "/audit/events/{event_id}/inclusion",
    )
    document.answer(
        api.get("/api/v1/audit/consistency", {"first": first["size"], "second": second["size"]}),
        "get",
        "/audit/consistency",
    )


def test_every_answer_has_exactly_the_keys_its_schema_in_the_document_describes(
    api, other_api, settings, capsys, audit_key
):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    document = Document()

    document.answer(api.put("/api/v1/tools/refund", REFUND), "put", "/tools/{name}")
    document.answer(api.put("/api/v1/tools/refund", REFUND), "put", "/tools/{name}")
    document.answer(api.get("/api/v1/tools/refund"), "get", "/tools/{name}")
    document.answer(api.get("/api/v1/tools"), "get", "/tools")
    invoker = f"/api/v1/tools/refund/invokers/{other_api.runner.name}"
    document.answer(api.put(invoker, None), "put", "/tools/{name}/invokers/{runner_name}")
    document.answer(api.client.delete(invoker), "delete", "/tools/{name}/invokers/{runner_name}")

    run = document.answer(
        api.post("/api/v1/runs", {"principal": "user:alice", "budgets": {"max_spend": 10}}),
        "post",
        "/runs",
    )["id"]
    document.answer(api.get(f"/api/v1/runs/{run}"), "get", "/runs/{run_id}")

    registration = {
        "run": run,
        "tool": "refund",
        "operation_key": "refund-1",
        "arguments": {"payment_id": "pay_1", "amount_cents": 50000},
    }
    op = document.answer(api.post("/api/v1/operations", registration), "post", "/operations")
    document.answer(api.post("/api/v1/operations", registration), "post", "/operations")
    document.answer(
        api.get(f"/api/v1/approvals/{op['approval']['id']}"), "get", "/approvals/{approval_id}"
    )
    successor = _approve_with_an_edit(document, api, op)
    _claim_and_reconcile(document, api, successor)
    _compensate_and_refuse_a_claim(document, api, run)
    _batches(document, api, run)
    _webhook_endpoints(document, api)
    _inbound(document, successor, capsys)
    _audit(document, api, successor)
    document.answer(api.get("/api/v1/operations"), "get", "/operations")
    document.answer(api.post(f"/api/v1/runs/{run}/cancel"), "post", "/runs/{run_id}/cancel")

    # What was sent is what the payloads build from the rows the requests left behind.
    stored = Operation.objects.get(pk=successor["id"])
    assert document.answer(
        api.get(f"/api/v1/operations/{stored.id}"), "get", "/operations/{operation_id}"
    ) == json.loads(json.dumps(payloads.operation(stored)))
    assert stored.status == "succeeded"

    bodies = document.answer_bodies()
    assert set(bodies) - document.answered == set(), "answers this test does not check"
    # A batch item's problem is a Problem, whose keys the problem tests hold to each code.
    for name in sorted(set().union(*map(document.reachable, bodies.values())) - {"Problem"}):
        described = set(document.components[name].get("properties", ()))
        if described:
            never = sorted(described - document.sent.get(name, set()))
            assert not never, f"{name} describes keys no answer sent: {never}"


@pytest.mark.parametrize("event", ["operation.*", "approval.decided"])
def test_a_webhook_carries_the_operation_and_approval_bodies_the_document_describes(
    api, settings, event
):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    document = Document()
    api.post("/api/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/hook", "events": [event]})
    api.tool("refund", REFUND)
    op = api.register(api.run(), "refund", {"payment_id": "pay_1", "amount_cents": 900})
    services.approval_decide(
        request_id=op["approval"]["id"],
        user=person(decide_on="refund"),
        approve=True,
        comment="",
    )

    messages = list(OutboxMessage.objects.filter(operation_id=op["id"]).order_by("created_at"))
    assert messages, "no webhook was written"
    for message in messages:
        data = message.payload["data"]
        document.check(data["operation"], document.component("OperationOut"), where="operation")
        if message.event_type == "approval.decided":
            document.check(data["approval"], document.component("ApprovalOut"), where="approval")
            assert data["approval"]["status"] == ApprovalRequest.RequestStatus.APPROVED
    assert document.sent["OperationOut"] == set(document.components["OperationOut"]["properties"])
