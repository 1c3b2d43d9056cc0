"""Webhook delivery from the transactional outbox, per Standard Webhooks.

Messages are written by ``services`` in the transaction of the change they report.
``deliver_due``:

1. selects pending messages whose ``next_attempt_at`` has come,
2. claims each (``services.delivery_claim``, compare-and-set with a lease),
3. records the attempt (``services.delivery_begin``), then POSTs outside any transaction
   through the egress guard (``WEBHOOK_ALLOWED_HOSTS``; public addresses allowed),
   without following redirects,
4. records the answer (``services.delivery_finish``): 2xx delivered; 410 disables the
   endpoint, with its event; anything else is retried on the specification's schedule,
   honouring ``Retry-After``.

A receiver's answer is read as hostile: nothing of a 2xx body is read, at most
``ANSWER_PREFIX_BYTES`` of any other, and ``Retry-After`` only as plain digits.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.utils import timezone

from .. import services
from ..hosts import webhook_policy
from ..metrics import timed_sweep
from ..models import OutboxMessage
from ..services.deliveries import MAX_RETRY_AFTER
from ..signing import body_of, headers_for
from .egress import guarded_client

logger = logging.getLogger(__name__)

Status = OutboxMessage.MessageStatus

# How much of a refusal's body is read, for the attempt's record (its first 200
# characters): a receiver's body may be endless.
ANSWER_PREFIX_BYTES = 4096
_MAX_RETRY_AFTER_S = int(MAX_RETRY_AFTER.total_seconds())


def _retry_after(response: httpx.Response) -> timedelta | None:
    """The receiver's ``Retry-After`` in seconds, at most ``MAX_RETRY_AFTER``; None for
    anything but ASCII digits (an HTTP date included). ``str.isdigit()`` alone admits
    "²", which ``int()`` refuses, and ``int()`` raises past 4300 digits, so a value with
    more digits than the cap has is read as the cap."""
    value = response.headers.get("retry-after", "").strip()
    if not (value.isascii() and value.isdigit()):
        return None
    digits = value.lstrip("0") or "0"
    if len(digits) > len(str(_MAX_RETRY_AFTER_S)):
        return MAX_RETRY_AFTER
    return timedelta(seconds=min(int(digits), _MAX_RETRY_AFTER_S))


def _answer_start(response: httpx.Response) -> str:
    """The first characters of a refusal's body; only a bounded prefix is read."""
    received = b""
    try:
        for chunk in response.iter_bytes():
            received += chunk
            if len(received) >= ANSWER_PREFIX_BYTES:
                break
    except httpx.HTTPError as exc:
        return f"the answer could not be read: {str(exc) or type(exc).__name__}"
    text = received[:ANSWER_PREFIX_BYTES].decode(response.encoding or "utf-8", errors="replace")
    return text[:200]


@dataclass
class DeliveryReport:
    sent: int = 0
    delivered: int = 0
    failed: int = 0


def deliver(message_id: str, client: httpx.Client) -> str | None:
    """Send one claimed message once and record the attempt. Returns its new status, or
    None when it is gone (its endpoint was deleted meanwhile)."""
    now = timezone.now()
    begun = services.delivery_begin(message_id=message_id, now=now)
    if begun is None:
        return None
    message, attempt = begun
    if not message.endpoint.is_active:
        return services.delivery_finish(
            message=message, attempt=attempt, status_code=None, error="endpoint disabled"
        )
    body = body_of(message)
    try:
        # Streamed, so that the answer's body is read only as far as the record needs.
        with client.stream(
            "POST", message.endpoint.url, content=body, headers=headers_for(message, body, now)
        ) as response:
            status_code = response.status_code
            error = "" if response.is_success else _answer_start(response)
            retry_after = _retry_after(response)
    except httpx.HTTPError as exc:
        return services.delivery_finish(
            message=message,
            attempt=attempt,
            status_code=None,
            error=str(exc) or type(exc).__name__,
        )
    return services.delivery_finish(
        message=message,
        attempt=attempt,
        status_code=status_code,
        error=error,
        retry_after=retry_after,
    )


@timed_sweep("webhook_delivery")
def deliver_due(*, now: datetime | None = None, limit: int = 100) -> DeliveryReport:
    now = now or timezone.now()
    report = DeliveryReport()
    due = list(
        OutboxMessage.objects.filter(status=Status.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("pk", "next_attempt_at")[:limit]
    )
    if not due:
        return report
    with guarded_client(webhook_policy(), timeout=settings.WEBHOOK_TIMEOUT_S) as client:
        for message_id, due_at in due:
            if not services.delivery_claim(message_id=message_id, due_at=due_at, now=now):
                continue
            status = deliver(message_id, client)
            report.sent += 1
            report.delivered += status == Status.DELIVERED
            report.failed += status in (Status.FAILED, Status.DISABLED)
    return report
