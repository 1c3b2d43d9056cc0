"""Webhook delivery from the transactional outbox, per Standard Webhooks.

Messages are written by ``services`` in the transaction of the change they report.
``deliver_due``:

1. selects pending messages whose ``next_attempt_at`` has come,
2. claims each by compare-and-set, moving ``next_attempt_at`` one lease ahead, so two
   dispatchers never send the same message at once, and a dispatcher killed mid-send
   leaves it to be sent again (same ``webhook-id``) when the lease passes,
3. records the attempt, then POSTs outside any transaction through the egress guard
   (``WEBHOOK_ALLOWED_HOSTS``; public addresses allowed), without following redirects,
4. records the answer: 2xx delivered; 410 disables the endpoint; anything else is
   retried on the specification's schedule, honouring ``Retry-After``.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..hosts import webhook_policy
from ..metrics import timed_sweep
from ..models import DeliveryAttempt, OutboxMessage, WebhookEndpoint
from ..signing import body_of, headers_for
from .egress import guarded_client

logger = logging.getLogger(__name__)

Status = OutboxMessage.MessageStatus

# Standard Webhooks' retry schedule: the delay before each attempt after the first.
RETRY_SCHEDULE = [
    timedelta(seconds=5),
    timedelta(minutes=5),
    timedelta(minutes=30),
    timedelta(hours=2),
    timedelta(hours=5),
    timedelta(hours=10),
    timedelta(hours=14),
    timedelta(hours=20),
    timedelta(hours=24),
]
MAX_RETRY_AFTER = timedelta(hours=24)


def _retry_after(response: httpx.Response) -> timedelta | None:
    value = response.headers.get("retry-after", "")
    if value.isdigit():
        return min(timedelta(seconds=int(value)), MAX_RETRY_AFTER)
    return None


@dataclass
class DeliveryReport:
    sent: int = 0
    delivered: int = 0
    failed: int = 0


def _claim(message_id: str, due_at: datetime | None, now: datetime) -> bool:
    lease = timedelta(seconds=settings.WEBHOOK_DELIVERY_LEASE_S)
    return bool(
        OutboxMessage.objects.filter(
            pk=message_id, status=Status.PENDING, next_attempt_at=due_at
        ).update(next_attempt_at=now + lease)
    )


def _begin_attempt(message_id: str, now: datetime) -> tuple[OutboxMessage, DeliveryAttempt]:
    """Record the attempt before sending: a dispatcher killed mid-send leaves it visible."""
    with transaction.atomic():
        message = (
            OutboxMessage.objects.select_for_update(of=("self",))
            .select_related("endpoint")
            .get(pk=message_id)
        )
        message.attempts += 1
        message.save(update_fields=["attempts"])
        attempt = DeliveryAttempt.objects.create(
            message=message, number=message.attempts, started_at=now
        )
    return message, attempt


def _finish(
    message: OutboxMessage,
    attempt: DeliveryAttempt,
    *,
    status_code: int | None,
    error: str,
    retry_after: timedelta | None,
) -> str:
    now = timezone.now()
    with transaction.atomic():
        attempt.finished_at = now
        attempt.status_code = status_code
        attempt.error = error[:500]
        attempt.save(update_fields=["finished_at", "status_code", "error"])
        message = OutboxMessage.objects.select_for_update().get(pk=message.pk)
        if message.status != Status.PENDING:
            return message.status
        if status_code is not None and 200 <= status_code < 300:
            message.status = Status.DELIVERED
            message.delivered_at = now
            message.next_attempt_at = None
        elif status_code == 410:
            # "Gone": the receiver asks us to stop. Disable the endpoint and drop what
            # it still had pending.
            WebhookEndpoint.objects.filter(pk=message.endpoint_id).update(
                is_active=False, disabled_reason="the receiver answered 410 Gone"
            )
            OutboxMessage.objects.filter(
                endpoint_id=message.endpoint_id, status=Status.PENDING
            ).update(status=Status.DISABLED, next_attempt_at=None)
            message.status = Status.DISABLED
            message.next_attempt_at = None
        elif message.attempts > len(RETRY_SCHEDULE):
            message.status = Status.FAILED
            message.next_attempt_at = None
        else:
            delay = RETRY_SCHEDULE[message.attempts - 1]
            if retry_after is not None:
                delay = max(delay, retry_after)
            message.next_attempt_at = now + delay
        message.save(update_fields=["status", "delivered_at", "next_attempt_at"])
        return message.status


def deliver(message_id: str, client: httpx.Client) -> str:
    """Send one claimed message once and record the attempt. Returns its new status."""
    now = timezone.now()
    message, attempt = _begin_attempt(message_id, now)
    if not message.endpoint.is_active:
        return _finish(
            message, attempt, status_code=None, error="endpoint disabled", retry_after=None
        )
    body = body_of(message)
    try:
        response = client.post(
            message.endpoint.url, content=body, headers=headers_for(message, body, now)
        )
    except httpx.HTTPError as exc:
        return _finish(
            message,
            attempt,
            status_code=None,
            error=str(exc) or type(exc).__name__,
            retry_after=None,
        )
    return _finish(
        message,
        attempt,
        status_code=response.status_code,
        error="" if response.is_success else response.text[:200],
        retry_after=_retry_after(response),
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
            if not _claim(message_id, due_at, now):
                continue
            status = deliver(message_id, client)
            report.sent += 1
            report.delivered += status == Status.DELIVERED
            report.failed += status in (Status.FAILED, Status.DISABLED)
    return report


def prune(*, older_than: timedelta, now: datetime | None = None) -> int:
    """Delete delivered, failed and disabled messages (and their attempts) past retention."""
    cutoff = (now or timezone.now()) - older_than
    _, deleted = OutboxMessage.objects.filter(
        created_at__lt=cutoff, status__in=[Status.DELIVERED, Status.FAILED, Status.DISABLED]
    ).delete()
    return deleted.get(OutboxMessage._meta.label, 0)
