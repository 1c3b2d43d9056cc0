"""What people are told, and how the telling is recorded (docs/notifications.md).

A change people should hear of writes a ``Notice`` in its own transaction
(``notice_write``): an approval request opened, escalated or changed, a reminder, a
"did not happen" waiting for a second person. Nothing is sent there. The dispatcher
(``dispatch.notices``) turns each notice into deliveries, one per channel and address,
and sends them outside any transaction; every row it changes goes through the functions
here, each in its own transaction:

1. ``notice_claim`` takes a notice for its fan-out by compare-and-set (one lease ahead),
   ``notice_fan_out`` writes its deliveries (each at most once: a unique constraint) and
   marks it fanned out;
2. ``notice_delivery_claim`` takes a due delivery the same way, so two dispatchers never
   send one at once and a dispatcher killed mid-send leaves it to be sent again;
3. ``notice_delivery_finish`` records the answer: delivered, skipped (nothing left to
   tell), retried on ``RETRY_SCHEDULE`` (later when the channel asked for it), or failed;
4. ``notices_prune`` deletes what is past retention.

People's preferences and the Slack channels routed per tool and group are written by
``services.preferences``.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.dispatch import Signal
from django.utils import timezone

from approvals.models import ApprovalRequest

from ..models import Notice, NoticeDelivery, Resolution, SlackInteraction
from .rows import insert_unless_conflict

# Sent after the commit of a transaction that wrote notices: tasks.py wakes the
# dispatcher, so the services never import the tasks.
notices_written = Signal()

Kind = Notice.Kind
DeliveryStatus = NoticeDelivery.DeliveryStatus

# The delay before each attempt after the first; then the delivery fails.
RETRY_SCHEDULE = [
    timedelta(seconds=5),
    timedelta(seconds=30),
    timedelta(minutes=2),
    timedelta(minutes=10),
    timedelta(minutes=30),
    timedelta(hours=1),
]
# The longest a channel's own "retry after" may hold a delivery back.
MAX_RETRY_AFTER = timedelta(hours=1)
LEASE = timedelta(seconds=60)
ERROR_LENGTH = NoticeDelivery._meta.get_field("last_error").max_length or 300


def _wake_after_commit() -> None:
    transaction.on_commit(lambda: notices_written.send(sender=Notice))


def notice_write(
    *,
    kind: str,
    now: datetime,
    request: ApprovalRequest | None = None,
    resolution: Resolution | None = None,
    data: dict[str, Any] | None = None,
    dedupe_key: str | None = None,
) -> bool:
    """Write one notice in the caller's transaction (it commits with the change it
    tells); False when ``dedupe_key`` was written before."""
    notice = Notice(
        kind=kind,
        request=request,
        resolution=resolution,
        data=data or {},
        dedupe_key=dedupe_key,
        created_at=now,
        next_attempt_at=now,
    )
    if dedupe_key is None:
        notice.save(force_insert=True)
    elif not insert_unless_conflict(notice):
        return False
    _wake_after_commit()
    return True


def shows_in_slack() -> bool:
    """Whether a request's changes must be told: its Slack messages show its state, and
    the people-facing webhook hears of each change."""
    return bool(settings.SLACK_BOT_TOKEN or settings.NOTIFY_WEBHOOK_URL)


def request_changed(request: ApprovalRequest, *, now: datetime) -> None:
    """A request was decided on, expired, withdrawn, superseded or revoked: its Slack
    messages are updated (in the caller's transaction, like every notice)."""
    if shows_in_slack():
        notice_write(kind=Kind.REQUEST_CHANGED, request=request, now=now)


def reminders_due(*, now: datetime, limit: int = 200) -> int:
    """A reminder for each pending request that expires within
    ``NOTIFY_REMINDER_BEFORE_S`` and has had none: one notice per request, whichever
    sweeper writes it first (``dedupe_key``)."""
    before = settings.NOTIFY_REMINDER_BEFORE_S
    if before <= 0:
        return 0
    due = (
        ApprovalRequest.objects.filter(
            status=ApprovalRequest.RequestStatus.PENDING,
            expires_at__gt=now,
            expires_at__lte=now + timedelta(seconds=before),
        )
        .order_by("expires_at")
        .only("id")[:limit]
    )
    written = 0
    for request in due:
        with transaction.atomic():
            written += notice_write(
                kind=Kind.REQUEST_REMINDER,
                request=request,
                now=now,
                dedupe_key=f"reminder:{request.id}",
            )
    return written


# --- the dispatcher's records ---------------------------------------------------------


def notice_claim(*, notice_id: str, due_at: datetime | None, now: datetime) -> bool:
    """Take a notice for its fan-out; False when another dispatcher took it."""
    return bool(
        Notice.objects.filter(pk=notice_id, fanned_out_at=None, next_attempt_at=due_at).update(
            next_attempt_at=now + LEASE
        )
    )


@dataclass(frozen=True)
class Target:
    """One delivery a notice fans out to."""

    channel: str
    address: str
    user_id: int | None = None


def notice_fan_out(*, notice_id: str, targets: list[Target], now: datetime) -> int:
    """Write the deliveries of a claimed notice and mark it fanned out, in one
    transaction; a delivery written before (a fan-out cut short) is not written twice."""
    with transaction.atomic():
        written = 0
        for target in targets:
            written += insert_unless_conflict(
                NoticeDelivery(
                    notice_id=notice_id,
                    channel=target.channel,
                    address=target.address[:200],
                    user_id=target.user_id,
                    next_attempt_at=now,
                )
            )
        Notice.objects.filter(pk=notice_id).update(fanned_out_at=now, next_attempt_at=None)
    return written


def notice_delivery_claim(
    *, delivery_id: int, due_at: datetime | None, now: datetime
) -> datetime | None:
    """Take a due delivery; answers the claim (the lease's end, which the finish must
    name), or None when another dispatcher took it."""
    lease = now + LEASE
    taken = NoticeDelivery.objects.filter(
        pk=delivery_id, status=DeliveryStatus.PENDING, next_attempt_at=due_at
    ).update(next_attempt_at=lease, attempts=F("attempts") + 1)
    return lease if taken else None


def _recordable(text: str) -> str:
    """An error as a text column holds it: no U+0000, no lone surrogate, bounded."""
    return "".join(
        "\ufffd" if char == "\x00" or "\ud800" <= char <= "\udfff" else char
        for char in text[:ERROR_LENGTH]
    )


def notice_delivery_finish(
    *,
    delivery_id: int,
    claim: datetime,
    outcome: str,
    now: datetime,
    error: str = "",
    retry_after: timedelta | None = None,
) -> str:
    """Record what sending a claimed delivery came to: ``delivered``, ``skipped``,
    ``retry`` (on the schedule, or after ``retry_after``, until the schedule runs out)
    or ``failed``. Answers the delivery's status. A claim whose lease passed and was
    taken again by another dispatcher records nothing: that one's answer counts."""
    with transaction.atomic():
        delivery = NoticeDelivery.objects.select_for_update().filter(pk=delivery_id).first()
        if delivery is None or delivery.status != DeliveryStatus.PENDING:
            return delivery.status if delivery else DeliveryStatus.FAILED
        if delivery.next_attempt_at != claim:
            return delivery.status
        delivery.last_error = _recordable(error)
        if outcome == "delivered":
            delivery.status, delivery.delivered_at = DeliveryStatus.DELIVERED, now
            delivery.next_attempt_at = None
        elif outcome == "skipped":
            delivery.status, delivery.next_attempt_at = DeliveryStatus.SKIPPED, None
        elif outcome == "retry" and delivery.attempts <= len(RETRY_SCHEDULE):
            delay = (
                RETRY_SCHEDULE[delivery.attempts - 1] if delivery.attempts else RETRY_SCHEDULE[0]
            )
            if retry_after is not None:
                delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
            delivery.next_attempt_at = now + delay
        else:
            delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
        delivery.save(update_fields=["status", "delivered_at", "next_attempt_at", "last_error"])
        return delivery.status


def notices_prune(*, older_than: timedelta) -> int:
    """Delete notices (and their deliveries) and answered Slack interactions past
    retention; a notice with a delivery still pending is kept."""
    cutoff = timezone.now() - older_than
    pending = NoticeDelivery.objects.filter(status=DeliveryStatus.PENDING).values("notice_id")
    deleted, _ = (
        Notice.objects.filter(created_at__lt=cutoff)
        .exclude(fanned_out_at=None)
        .exclude(pk__in=pending)
        .delete()
    )
    seen, _ = SlackInteraction.objects.filter(received_at__lt=cutoff).delete()
    return deleted + seen
