"""A value marked ``"x-sensitive": true`` never leaves the request that carried it: not
into the database, events, logs, webhooks, traces, emails, API answers, error messages
or console pages. Only its HMAC digest does."""

import copy
import json
import logging

import pytest
from django.apps import apps
from django.core import mail
from django.test import override_settings
from guardian.shortcuts import assign_perm
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from operations import services, telemetry
from operations.dispatch import webhooks
from operations.models import OutboxMessage, Tool
from tests.approvals.conftest import person
from tests.conftest import REFUND_SCHEMA, contract
from tests.console.conftest import client_for
from tests.support.receiver import Receiver

SECRET = "4111-1111-1111-1111-SECRET-CVV-737"
# Distinct parts too: a value cut, escaped or re-encoded must not leak either.
FRAGMENTS = [SECRET, "4111-1111-1111-1111", "SECRET-CVV-737", json.dumps(SECRET)[1:-1]]


def _schema() -> dict:
    schema = copy.deepcopy(REFUND_SCHEMA)
    schema["properties"]["card"] = {"type": "string", "minLength": 12, "x-sensitive": True}
    schema["properties"]["holders"] = {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"iban": {"type": "string", "x-sensitive": True}},
        },
    }
    return schema


def _leaks(text: str) -> list[str]:
    return [fragment for fragment in FRAGMENTS if fragment in text]


def _database_text() -> str:
    """Every row of every table, as text."""
    parts = []
    for model in apps.get_models():
        for row in model.objects.values():
            parts.append(json.dumps(row, default=str))
    return "\n".join(parts)


@pytest.fixture
def receiver(settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def spans(settings, monkeypatch):
    settings.OTEL_RECORD_ARGUMENTS = True
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(provider)
    monkeypatch.setattr("django.db.transaction.on_commit", lambda fn, **kw: fn())
    yield exporter
    telemetry.configure(None)
    telemetry._state["configured"] = False


@override_settings(SENSITIVE_ARGUMENT_KEY="k" * 32, SENSITIVE_ARGUMENT_KEY_ID="k9")
def test_a_sensitive_value_is_nowhere_but_in_its_digest(api, receiver, spans, caplog):
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []

    def record(response):
        seen.append(response.content.decode())
        return response

    endpoint = api.post(
        "/api/v1/webhook-endpoints", {"url": receiver.url, "events": ["operation.*", "approval.*"]}
    )
    assert endpoint.status_code == 201
    api.tool(
        "charge", contract("irreversible", input_schema=_schema(), approval={"mode": "always"})
    )
    run = api.run(principal="user:customer")
    arguments = {
        "payment_id": "pay_1",
        "amount_cents": 900,
        "card": SECRET,
        "holders": [{"iban": SECRET}, {"iban": "DE00-" + SECRET}],
    }

    # Refusals that quote arguments: schema errors, an intent mismatch.
    bad = api.post(
        "/api/v1/operations",
        {
            "run": run,
            "tool": "charge",
            "operation_key": "k-bad",
            "arguments": {**arguments, "card": 7},
        },
    )
    assert record(bad).status_code == 422
    too_short = api.post(
        "/api/v1/operations",
        {
            "run": run,
            "tool": "charge",
            "operation_key": "k-short",
            "arguments": {**arguments, "card": SECRET[:8]},
        },
    )
    assert record(too_short).status_code == 422
    assert "value not shown: sensitive" in too_short.content.decode()

    created = api.post(
        "/api/v1/operations",
        {"run": run, "tool": "charge", "operation_key": "k1", "arguments": arguments},
    )
    assert record(created).status_code == 201
    op = created.json()
    assert op["arguments"]["card"].startswith("hmac-sha256:k9:")
    assert op["arguments"]["holders"][0]["iban"].startswith("hmac-sha256:k9:")
    mismatch = api.post(
        "/api/v1/operations",
        {
            "run": run,
            "tool": "charge",
            "operation_key": "k1",
            "arguments": {**arguments, "card": SECRET + "-other"},
        },
    )
    assert record(mismatch).status_code == 422

    # A person approves in the console; the operation runs, ends unknown, is reconciled.
    approver = person(decide_on="charge")
    assign_perm("operations.reconcile_tool", approver, Tool.objects.get(pk="charge"))
    console = client_for(approver)
    approval_id = op["approval"]["id"]
    record(console.get("/"))
    record(console.get(f"/approvals/{approval_id}/"))
    record(console.post(f"/approvals/{approval_id}/decide", {"decision": "approve"}, follow=True))
    claim = api.post(f"/api/v1/operations/{op['id']}/attempts", {})
    assert record(claim).status_code == 201
    outcome = api.post(
        f"/api/v1/operations/{op['id']}/attempts/1/outcome",
        {"kind": "unknown", "code": "timeout_unknown", "detail": "no answer"},
    )
    assert record(outcome).status_code == 200
    done = api.post(
        f"/api/v1/operations/{op['id']}/reconciliations",
        {"result": "committed", "downstream_id": "re_1", "evidence": {"seen": "ledger"}},
    )
    assert record(done).json()["status"] == "succeeded"

    for path in (
        f"/api/v1/operations/{op['id']}",
        f"/api/v1/operations/{op['id']}/events",
        f"/api/v1/operations/{op['id']}/tool-result",
        f"/api/v1/approvals/{approval_id}",
        f"/api/v1/operations?run={run}",
    ):
        record(api.get(path))
    for path in (
        f"/operations/{op['id']}/",
        "/operations/",
        f"/runs/{run}/",
        "/audit/",
        "/audit/export.csv",
        "/audit/export.jsonl",
        "/reconciliation/",
        f"/search/?q={op['id']}",
    ):
        response = console.get(path)
        assert response.status_code in (200, 302), path
        body = (
            b"".join(response.streaming_content) if response.streaming else response.content
        ).decode()
        seen.append(body)

    report = webhooks.deliver_due()
    assert report.delivered >= 3
    payloads = [json.dumps(m.payload) for m in OutboxMessage.objects.all()]
    bodies = [request.body.decode() for request in receiver.requests]
    traces = [json.dumps(dict(span.attributes)) for span in spans.get_finished_spans()]
    assert traces, "the operation's span was exported"
    assert op["arguments"]["card"] in traces[0]

    assert not _leaks("\n".join(seen)), "API answers or console pages"
    assert not _leaks("\n".join(payloads + bodies)), "webhooks"
    assert not _leaks("\n".join(traces)), "traces"
    assert not _leaks(caplog.text), "logs"
    assert not _leaks("\n".join(str(m.message()) for m in mail.outbox)), "emails"
    assert not _leaks(_database_text()), "the database"
    # The digest itself is shown where the arguments are: the approver sees what is bound.
    assert op["arguments"]["card"] in "\n".join(seen)


def test_a_crash_while_handling_a_sensitive_value_does_not_log_it(api, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    api.tool("charge", contract("irreversible", input_schema=_schema()))
    run = api.run()

    def boom(**kwargs):
        raise RuntimeError("crashed while registering")

    monkeypatch.setattr(services, "operation_register", boom)
    response = api.post(
        "/api/v1/operations",
        {
            "run": run,
            "tool": "charge",
            "operation_key": "k",
            "arguments": {"payment_id": "p", "amount_cents": 1, "card": SECRET},
        },
    )
    assert response.status_code == 500
    assert not _leaks(response.content.decode())
    assert not _leaks(caplog.text)
