"""The tables of people-facing notifications (docs/notifications.md): what happened that
people are told of (``Notice``, written in the transaction of the change), each telling
on one channel to one address (``NoticeDelivery``, sent from the dispatcher and
retried), the Slack messages kept up to date, the channels routed per tool and group,
people's preferences, and the Slack interactions already answered. Written only by
``services.notices`` and ``services.slack``."""

from functools import partial

from django.conf import settings
from django.db import models
from django.db.models import Q

from approvals.ids import new_id


class Notice(models.Model):
    """One thing people are told of, written with the change it tells (an approval
    request opened, escalated, decided; a reminder; a "did not happen" waiting for a
    second person), so it is never told without happening nor lost. The dispatcher
    turns it into deliveries (``fanned_out_at``) outside any transaction."""

    class Kind(models.TextChoices):
        REQUEST_OPENED = "request_opened"
        REQUEST_ESCALATED = "request_escalated"
        # Any change the request's Slack messages must show: a decision, an expiry, a
        # withdrawal, a supersession, a revocation.
        REQUEST_CHANGED = "request_changed"
        REQUEST_REMINDER = "request_reminder"
        CONFIRMATION_NEEDED = "confirmation_needed"

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "ntc"), editable=False
    )
    kind = models.CharField(max_length=32, choices=Kind.choices)
    request = models.ForeignKey(
        "approvals.ApprovalRequest", null=True, on_delete=models.CASCADE, related_name="+"
    )
    resolution = models.ForeignKey(
        "operations.Resolution", null=True, on_delete=models.CASCADE, related_name="+"
    )
    data = models.JSONField(default=dict)
    # A notice told once whatever writes it twice (a reminder per request).
    dedupe_key = models.CharField(max_length=120, null=True, unique=True)  # noqa: DJ001 (NULL: not deduplicated; "" would collide)
    created_at = models.DateTimeField()
    fanned_out_at = models.DateTimeField(null=True)
    # Fan-out is claimed like a delivery: compare-and-set moves this one lease ahead.
    next_attempt_at = models.DateTimeField(null=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="notice_unfanned_due",
                condition=Q(fanned_out_at=None),
            ),
            models.Index(fields=["created_at"], name="notice_created"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.kind}"


class NoticeDelivery(models.Model):
    """A notice told on one channel to one address: a person's mail, a Slack channel
    (or a person's direct messages), a Slack message to update, the people-facing
    webhook. Claimed by compare-and-set, retried on a schedule, never inside the
    transaction of the change it tells."""

    class DeliveryStatus(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"
        # Nothing to tell any more (the request was decided before its mail went out).
        SKIPPED = "skipped"

    notice = models.ForeignKey(Notice, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=16)
    address = models.CharField(max_length=200)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.CASCADE, related_name="+"
    )
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True)
    last_error = models.CharField(max_length=300, blank=True, default="")
    delivered_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["notice", "channel", "address"], name="notice_delivery_once"
            )
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="notice_delivery_due",
                condition=Q(status="pending"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.notice_id} {self.channel}:{self.address}"


class SlackMessage(models.Model):
    """A Slack message that shows an approval request, kept up to date in place."""

    request = models.ForeignKey(
        "approvals.ApprovalRequest", on_delete=models.CASCADE, related_name="+"
    )
    # Where it was asked to go (a channel's name or id, a person's Slack id) and where
    # Slack says it went (the conversation's id): chat.update takes the latter.
    address = models.CharField(max_length=80)
    channel = models.CharField(max_length=40)
    ts = models.CharField(max_length=40)
    posted_at = models.DateTimeField()
    updated_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["request", "address"], name="slack_message_once"),
            models.UniqueConstraint(fields=["channel", "ts"], name="slack_message_ts"),
        ]

    def __str__(self) -> str:
        return f"{self.channel}/{self.ts}"


class SlackInteraction(models.Model):
    """An interaction Slack sent and Effectgate answered: Slack retries one it thinks
    went unanswered, and the retry is recognised here and does nothing twice."""

    key = models.CharField(primary_key=True, max_length=64)
    received_at = models.DateTimeField()
    # What was answered (a modal's errors): a retry gets the same answer.
    answer = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["received_at"], name="slack_interaction_received")]

    def __str__(self) -> str:
        return self.key


class NotificationRoute(models.Model):
    """Where a tool's or a group's approval requests are posted in Slack."""

    tool = models.OneToOneField(
        "operations.Tool", null=True, on_delete=models.CASCADE, related_name="notification_route"
    )
    group = models.OneToOneField(
        "auth.Group", null=True, on_delete=models.CASCADE, related_name="notification_route"
    )
    # A channel's name or id; ``-`` keeps the tool's requests out of Slack.
    slack_channel = models.CharField(max_length=80)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(tool__isnull=False, group__isnull=True)
                | Q(tool__isnull=True, group__isnull=False),
                name="notification_route_one_owner",
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool_id or self.group_id} → {self.slack_channel}"


class NotificationPreference(models.Model):
    """What a person wants to be told, on which channels: ``channels`` maps a notice kind
    to the channels chosen for it (``notify.PERSONAL_KINDS``, ``notify.CHANNELS``). A
    person without a row gets the defaults (mail)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preference"
    )
    channels = models.JSONField(default=dict)
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.user_id}: {self.channels}"
