"""OpenTelemetry traces: one span per operation, each transition an event on it.

An operation outlives the requests and workers that move it, so its span is written
once, when the operation reaches a terminal state: it starts at registration (joining
the runner's trace when the runner sent a W3C ``traceparent``), carries every event of
the operation's trace with its own timestamp, and ends with the final transition. The
span follows the GenAI semantic conventions for tool execution (``execute_tool``).
Arguments and results are attributes only when ``OTEL_RECORD_ARGUMENTS`` is on.

Without ``OTEL_EXPORTER_OTLP_ENDPOINT`` nothing is configured: ``enabled()`` is a
cached boolean and no span is built.
"""

import json
from datetime import datetime

from django.conf import settings
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.status import Status as SpanStatus
from opentelemetry.trace.status import StatusCode

_state: dict = {"configured": False, "provider": None}
FAILED = {"rejected", "failed_permanent", "budget_exhausted", "cancelled"}


def configure(provider=None) -> None:
    """Use ``provider`` (tests pass one with an in-memory exporter), or build one for the
    OTLP endpoint in the settings, or none."""
    if provider is None and settings.OTEL_EXPORTER_OTLP_ENDPOINT:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": "effectgate"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _state.update(configured=True, provider=provider)


def enabled() -> bool:
    if not _state["configured"]:
        configure()
    return _state["provider"] is not None


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def export_operation(operation_id: str) -> None:
    """Write the span of an operation that has just reached a terminal state."""
    if not enabled():
        return
    from .models import Event, Operation

    op = Operation.objects.select_related("tool_version").get(pk=operation_id)
    events = list(Event.objects.filter(stream=op.id).order_by("seq"))
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": op.tool_id,
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": op.call_id,
        "effectgate.operation.id": op.id,
        "effectgate.intent_hash": op.intent_hash,
        "effectgate.effect_class": op.effect_class,
        "effectgate.attempts": op.attempts,
        "effectgate.outcome_class": op.status,
    }
    if op.status in FAILED and op.error_code:
        attributes["error.type"] = op.error_code
    if settings.OTEL_RECORD_ARGUMENTS:
        attributes["gen_ai.tool.call.arguments"] = json.dumps(op.arguments, sort_keys=True)
        if op.result is not None:
            attributes["gen_ai.tool.call.result"] = json.dumps(op.result, sort_keys=True)
    parent = (
        TraceContextTextMapPropagator().extract({"traceparent": op.traceparent})
        if op.traceparent
        else None
    )
    tracer = _state["provider"].get_tracer("effectgate")
    span = tracer.start_span(
        f"execute_tool {op.tool_id}",
        context=parent,
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        start_time=_ns(op.created_at),
    )
    for event in events:
        span.add_event(
            event.kind,
            attributes={
                "effectgate.from": event.from_status,
                "effectgate.to": event.to_status,
                "effectgate.actor": event.actor,
            },
            timestamp=_ns(event.at),
        )
    if op.status in FAILED:
        span.set_status(SpanStatus(StatusCode.ERROR, op.error_code or op.status))
    span.end(end_time=_ns(events[-1].at if events else op.updated_at))
