"""OpenTelemetry: one execute_tool span per operation, without argument values."""

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from operations import telemetry
from tests.conftest import contract

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(provider)
    yield exporter
    telemetry.configure(None)
    telemetry._state["configured"] = False


@pytest.fixture
def on_commit_now(monkeypatch):
    # Test transactions never commit; run on_commit callbacks at once.
    monkeypatch.setattr("django.db.transaction.on_commit", lambda fn, **kw: fn())


def test_one_span_per_operation_with_the_semantic_attributes(api, spans, on_commit_now):
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    response = api.post(
        "/api/v1/operations",
        {
            "run": api.run(),
            "tool": "refund",
            "operation_key": "k1",
            "call_id": "call_abc",
            "arguments": {"payment_id": "pay_secret_77", "amount_cents": 4242},
        },
        HTTP_TRACEPARENT=f"00-{TRACE_ID}-00f067aa0ba902b7-01",
    )
    op = response.json()
    api.claim(op["id"])
    assert spans.get_finished_spans() == ()  # nothing until the operation ends
    api.outcome(op["id"], 1, {"kind": "failed", "code": "card_declined"})
    [span] = spans.get_finished_spans()
    assert span.name == "execute_tool refund"
    attributes = dict(span.attributes)
    assert attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "refund",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": "call_abc",
        "effectgate.operation.id": op["id"],
        "effectgate.intent_hash": op["intent_hash"],
        "effectgate.effect_class": "irreversible",
        "effectgate.attempts": 1,
        "effectgate.outcome_class": "failed_permanent",
        "error.type": "card_declined",
    }
    flattened = repr(attributes) + repr([e.attributes for e in span.events])
    assert "pay_secret_77" not in flattened
    assert "4242" not in flattened
    assert [e.name for e in span.events] == ["registered", "claimed", "outcome"]
    assert format(span.context.trace_id, "032x") == TRACE_ID  # joins the runner's trace
    assert span.status.status_code.name == "ERROR"


def test_arguments_are_attributes_only_when_a_setting_opts_in(api, spans, on_commit_now, settings):
    settings.OTEL_RECORD_ARGUMENTS = True
    api.tool("t")
    op = api.register(api.run(), "t", {"payment_id": "p9", "amount_cents": 5})
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "succeeded"})
    [span] = spans.get_finished_spans()
    assert '"payment_id": "p9"' in span.attributes["gen_ai.tool.call.arguments"]


def test_without_configuration_nothing_is_exported(api, settings, on_commit_now, monkeypatch):
    settings.OTEL_EXPORTER_OTLP_ENDPOINT = ""
    telemetry._state["configured"] = False
    calls = []
    monkeypatch.setattr(telemetry, "export_operation", lambda op_id: calls.append(op_id))
    api.tool("t")
    op = api.register(api.run(), "t")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "succeeded"})
    assert not telemetry.enabled()
    assert calls == []
