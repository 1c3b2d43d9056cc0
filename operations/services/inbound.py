"""Inbound provider events (contract block ``inbound``): evidence of what happened."""

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.policy import is_missing, resolve_pointer

from .. import errors
from ..crypto import decrypt, encrypt
from ..machine import EventKind, Status
from ..models import (
    InboundEvent,
    Operation,
    Tool,
)
from ..params import parse_count
from ..signing import verify as webhooks_verify
from ..strictjson import MAX_SAFE_INTEGER, loads_strict
from .core import (
    Actor,
    attempt_supersede,
    event_append,
    lock,
    record,
    succeed,
)
from .reconciliation import reconcile_locked

logger = logging.getLogger(__name__)
INBOUND_TOLERANCE = timedelta(minutes=5)


def tool_inbound_secret_set(*, tool: Tool, secret: str, actor: Actor) -> Tool:
    """Set the secret that signs a provider's events for this tool (never logged)."""
    if not secret.startswith("whsec_"):
        raise errors.InvalidRequest("Inbound secrets are whsec_... strings (Standard Webhooks).")
    with transaction.atomic():
        tool = Tool.objects.select_for_update().get(pk=tool.pk)
        tool.inbound_secret_encrypted = encrypt(secret)
        tool.save(update_fields=["inbound_secret_encrypted"])
        event_append(
            stream=f"tool:{tool.name}",
            kind=EventKind.INBOUND_SECRET_SET,
            actor=actor,
            tool_name=tool.name,
        )
    return tool


@dataclass(frozen=True)
class InboundReceipt:
    event: InboundEvent
    duplicate: bool


def inbound_receive(*, tool_name: str, headers: dict[str, str], body: bytes) -> InboundReceipt:
    """Verify and record a provider's event, then apply it as evidence.

    1. The tool must have an inbound mapping and a secret; the Standard Webhooks
       signature must verify and the timestamp lie within five minutes of now.
    2. The event is recorded under a unique (tool, event id) and committed before any
       other work: a duplicate delivery answers as such and changes nothing.
    3. It is then matched and applied (``inbound_apply``); if that fails, the event stays
       ``received`` and the sweep applies it later.
    """

    tool = Tool.objects.select_related("active_version").filter(pk=tool_name).first()
    config = tool.active_version.contract.get("inbound") if tool and tool.active_version else None
    if tool is None or config is None or not tool.inbound_secret_encrypted:
        raise errors.NotFound(f"No inbound events are configured for {tool_name!r}.")
    msg_id = headers.get("webhook-id", "")
    stamp = parse_count(headers.get("webhook-timestamp", ""), maximum=MAX_SAFE_INTEGER)
    signature = headers.get("webhook-signature", "")
    if not (msg_id and stamp is not None and signature):
        raise errors.InvalidSignature("webhook-id, webhook-timestamp and webhook-signature needed.")
    secret = decrypt(tool.inbound_secret_encrypted)
    if not webhooks_verify(secret, msg_id, stamp, body, signature):
        raise errors.InvalidSignature("No signature matches the tool's inbound secret.")
    now = timezone.now()
    # Compared as numbers first: a timestamp centuries away is no date Python can hold.
    if abs(now.timestamp() - stamp) > INBOUND_TOLERANCE.total_seconds():
        raise errors.StaleEvent(
            f"The event was signed at {stamp} (Unix seconds), more than "
            f"{INBOUND_TOLERANCE.total_seconds() / 60:.0f} minutes from now; replays are refused."
        )
    sent_at = datetime.fromtimestamp(stamp, tz=UTC)
    payload = loads_strict(body)
    try:
        with transaction.atomic():
            event = InboundEvent.objects.create(
                tool=tool,
                event_id=msg_id[:255],
                sent_at=sent_at,
                received_at=now,
                payload=payload if isinstance(payload, dict) else {"payload": payload},
            )
    except IntegrityError:
        return InboundReceipt(InboundEvent.objects.get(tool=tool, event_id=msg_id[:255]), True)
    try:
        event = inbound_apply(event_id=event.pk)
    except Exception:
        logger.exception("Inbound event %s recorded but not applied; the sweep retries.", event.pk)
    return InboundReceipt(event, False)


def inbound_apply(*, event_id: str) -> InboundEvent:
    """Match a recorded event to an operation and apply it as reconciliation evidence.

    A success closes an ``outcome_unknown`` or ``executing`` operation as succeeded (an
    executing attempt becomes stale); a definitive failure takes the ``not_found`` path
    of an ``outcome_unknown`` operation. Anything else is kept as evidence on the trace.
    """
    Inbound = InboundEvent.InboundStatus
    with transaction.atomic():
        event = (
            InboundEvent.objects.select_for_update(of=("self",))
            .select_related("tool__active_version")
            .get(pk=event_id)
        )
        if event.status != Inbound.RECEIVED:
            return event
        now = timezone.now()
        active = event.tool.active_version
        config = (active.contract.get("inbound") if active is not None else None) or {}
        event_type = resolve_pointer(event.payload, config.get("type", "/type"))
        event.event_type = str(event_type)[:255] if not is_missing(event_type) else ""
        if event.event_type in config.get("succeeded", []):
            event.outcome = "succeeded"
        elif event.event_type in config.get("failed", []):
            event.outcome = "failed"
        reference = _inbound_value(event.payload, config.get("downstream_id"))
        candidates = Operation.objects.filter(tool=event.tool)
        match = None
        key = _inbound_value(event.payload, config.get("idempotency_key"))
        if key:
            match = candidates.filter(idempotency_key=key).values_list("pk", flat=True).first()
        if match is None and reference:
            match = candidates.filter(downstream_id=reference).values_list("pk", flat=True).first()
        event.processed_at = now
        if match is None:
            event.status = Inbound.UNMATCHED
            event.save()
            return event
        op = lock(match)
        event.operation = op
        actor = Actor.system("inbound")
        data = {
            "inbound_event": event.id,
            "event_id": event.event_id,
            "event_type": event.event_type,
            "outcome": event.outcome or None,
            "downstream_id": reference or None,
            "source": "inbound",
        }
        if event.outcome == "succeeded" and op.status in (
            Status.OUTCOME_UNKNOWN,
            Status.EXECUTING,
        ):
            if op.status == Status.EXECUTING:
                attempt_supersede(op, now=now)
            succeed(
                op,
                kind=EventKind.RECONCILED,
                actor=actor,
                now=now,
                data={**data, "result": "committed"},
                downstream_id=reference,
            )
            event.status = Inbound.APPLIED
        elif event.outcome == "failed" and op.status == Status.OUTCOME_UNKNOWN:
            reconcile_locked(
                op, result="not_found", actor=actor, now=now, data={**data, "result": "not_found"}
            )
            event.status = Inbound.APPLIED
        else:
            record(op, kind=EventKind.INBOUND_EVIDENCE, actor=actor, now=now, data=data)
            event.status = Inbound.MATCHED
        event.save()
    return event


def _inbound_value(payload: Any, pointer: str | None) -> str:
    if not pointer:
        return ""
    value = resolve_pointer(payload, pointer)
    return str(value)[:255] if not is_missing(value) and value is not None else ""
