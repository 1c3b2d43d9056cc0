"""Webhook deliveries: what the dispatcher records around each POST, and retention.

``dispatch.webhooks`` selects due messages and calls receivers outside any transaction;
every row it changes goes through these functions, each in its own transaction:

1. ``delivery_claim`` takes a due message by compare-and-set, moving ``next_attempt_at``
   one lease (``WEBHOOK_DELIVERY_LEASE_S``) ahead: two dispatchers never send one message
   at once, and a dispatcher killed mid-send leaves it to be sent again (same
   ``webhook-id``) when the lease passes.
2. ``delivery_begin`` records the attempt before the POST, so a dispatcher killed
   mid-send leaves it visible.
3. ``delivery_finish`` records the answer: 2xx delivers the message; 410 Gone disables
   the endpoint (``webhook_endpoint_disable``, with its event on the runner's stream);
   anything else is retried on Standard Webhooks' schedule (``RETRY_SCHEDULE``), later
   when the receiver asked for it (``Retry-After``), until the schedule runs out.
4. ``delivery_prune`` deletes delivered, failed and disabled messages past retention.

A message's delivery attempts are its record, rows beside it: only a change to the
endpoint itself (disabling it) is an event.
"""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..models import DeliveryAttempt, OutboxMessage, Runner
from .core import Actor
from .endpoints import webhook_endpoint_disable

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
# The longest a receiver's Retry-After may hold a message back.
MAX_RETRY_AFTER = timedelta(hours=24)
GONE = "the receiver answered 410 Gone"
ERROR_LENGTH = DeliveryAttempt._meta.get_field("error").max_length or 500


def _recordable(text: str) -> str:
    """What a receiver said, as a text column can hold it: PostgreSQL refuses U+0000 and
    no encoding takes a lone surrogate, so each becomes U+FFFD; the record would
    otherwise fail, and the message be sent again every lease instead of on the
    schedule."""
    return "".join(
        "\ufffd" if char == "\x00" or "\ud800" <= char <= "\udfff" else char
        for char in text[:ERROR_LENGTH]
    )


def delivery_claim(*, message_id: str, due_at: datetime | None, now: datetime) -> bool:
    """Take a due message for one delivery; False when another dispatcher took it."""
    lease = timedelta(seconds=settings.WEBHOOK_DELIVERY_LEASE_S)
    return bool(
        OutboxMessage.objects.filter(
            pk=message_id, status=Status.PENDING, next_attempt_at=due_at
        ).update(next_attempt_at=now + lease)
    )


def delivery_begin(
    *, message_id: str, now: datetime
) -> tuple[OutboxMessage, DeliveryAttempt] | None:
    """Record the attempt of a claimed message before it is sent; None when the message
    is gone (its endpoint was deleted since the claim)."""
    with transaction.atomic():
        message = (
            OutboxMessage.objects.select_for_update(of=("self",))
            .select_related("endpoint")
            .filter(pk=message_id)
            .first()
        )
        if message is None:
            return None
        message.attempts += 1
        message.save(update_fields=["attempts"])
        attempt = DeliveryAttempt.objects.create(
            message=message, number=message.attempts, started_at=now
        )
    return message, attempt


def delivery_finish(
    *,
    message: OutboxMessage,
    attempt: DeliveryAttempt,
    status_code: int | None,
    error: str,
    retry_after: timedelta | None = None,
) -> str | None:
    """Record the receiver's answer (``status_code`` None: none came) and what it means
    for the message. Returns the message's new status, or None when it is gone (its
    endpoint was deleted while it was being sent)."""
    now = timezone.now()
    gone = status_code == 410
    with transaction.atomic():
        if gone:
            # The runner's row first, as registering, disabling and deleting an endpoint
            # take it: taken after the message's, it could deadlock with a deletion.
            Runner.objects.select_for_update().filter(pk=message.endpoint.runner_id).exists()
        DeliveryAttempt.objects.filter(pk=attempt.pk).update(
            finished_at=now, status_code=status_code, error=_recordable(error)
        )
        locked = OutboxMessage.objects.select_for_update().filter(pk=message.pk).first()
        if locked is None:
            return None
        if locked.status != Status.PENDING:
            return locked.status
        if status_code is not None and 200 <= status_code < 300:
            locked.status = Status.DELIVERED
            locked.delivered_at = now
            locked.next_attempt_at = None
        elif gone:
            # The receiver asks us to stop: the endpoint is disabled and what it still
            # had pending, this message included, is dropped.
            webhook_endpoint_disable(
                endpoint=message.endpoint, actor=Actor.system("webhooks"), reason=GONE
            )
            locked.status = Status.DISABLED
            locked.next_attempt_at = None
        elif locked.attempts > len(RETRY_SCHEDULE):
            locked.status = Status.FAILED
            locked.next_attempt_at = None
        else:
            delay = RETRY_SCHEDULE[locked.attempts - 1]
            if retry_after is not None:
                delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
            locked.next_attempt_at = now + delay
        locked.save(update_fields=["status", "delivered_at", "next_attempt_at"])
        return locked.status


def delivery_prune(*, older_than: timedelta, now: datetime | None = None) -> int:
    """Delete delivered, failed and disabled messages (and their attempts) past retention."""
    cutoff = (now or timezone.now()) - older_than
    _, deleted = OutboxMessage.objects.filter(
        created_at__lt=cutoff, status__in=[Status.DELIVERED, Status.FAILED, Status.DISABLED]
    ).delete()
    return deleted.get(OutboxMessage._meta.label, 0)
