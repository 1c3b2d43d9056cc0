"""The one notification layer (docs/notifications.md): every people-facing message, by
mail, Slack or the people-facing webhook, goes out from here.

The services write a ``Notice`` in the transaction of the change it tells
(``services.notices.notice_write``). ``deliver_due``, woken after that commit and every
second by beat, outside any transaction:

1. fans each new notice out into deliveries: for a request opened, escalated or due to
   expire, the people who may decide it (not barred, not decided yet), each on the
   channels they chose (``selectors.notices.preference_channels``: mail by default, their
   Slack direct messages once linked), and for an opened or escalated request its Slack
   channel (``slack_channels_for``); for a request that changed, each of its Slack
   messages to update; for a "did not happen", who may confirm it; and the people-facing
   webhook (``NOTIFY_WEBHOOK_URL``) for every notice when one is set;
2. sends each due delivery through its channel, and records what came of it through
   ``services.notices``: delivered; skipped when nothing is left to tell (a request
   decided before its mail went out); retried on the schedule (Slack's ``Retry-After``
   honoured); failed when a retry cannot mend it (a channel that does not exist).

A channel is one entry of ``CHANNELS``: a function that sends one delivery and says what
came of it. Teams or another chat is one more entry, and one more choice in
``selectors.notices.PERSONAL_CHANNELS``.
"""

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.core.mail import send_mail
from django.utils import timezone
from slack_sdk.errors import SlackApiError

from .. import services
from ..metrics import timed_sweep
from ..models import Notice, NoticeDelivery, Resolution, SlackMessage
from ..payloads import iso
from ..selectors import notices as read
from ..services.notices import Target
from ..signing import sign
from . import slack

logger = logging.getLogger(__name__)

Kind = Notice.Kind
DeliveryStatus = NoticeDelivery.DeliveryStatus
PERSONAL = frozenset(read.PERSONAL_KINDS)


@dataclass(frozen=True)
class Sent:
    """What sending one delivery came to."""

    outcome: str  # delivered, skipped, retry, failed
    error: str = ""
    retry_after: timedelta | None = None


DELIVERED = Sent("delivered")


# --- fan-out ------------------------------------------------------------------------------


def targets(notice: Notice) -> list[Target]:
    """Where ``notice`` is told."""
    out: list[Target] = []
    if notice.kind in PERSONAL:
        people = read.people_told(notice)
        slack_ids = read.slack_accounts([user.pk for user in people]) if slack.configured() else {}
        for user in people:
            chosen = read.preference_channels(user).get(notice.kind, [])
            if "mail" in chosen and user.email:
                out.append(Target("mail", user.email, user.pk))
            if "slack" in chosen and user.pk in slack_ids:
                out.append(Target("slack", slack_ids[user.pk], user.pk))
    if slack.configured() and notice.request is not None:
        if notice.kind in (Kind.REQUEST_OPENED, Kind.REQUEST_ESCALATED):
            request = notice.request
            for channel in read.slack_channels_for(
                request, escalated=notice.kind == Kind.REQUEST_ESCALATED
            ):
                out.append(Target("slack", channel))
        if notice.kind in (Kind.REQUEST_CHANGED, Kind.REQUEST_ESCALATED):
            for message_id in SlackMessage.objects.filter(request_id=notice.request_id).values_list(
                "pk", flat=True
            ):
                out.append(Target("slack_update", str(message_id)))
    if settings.NOTIFY_WEBHOOK_URL:
        out.append(Target("webhook", "people"))
    return out


# --- the channels -------------------------------------------------------------------------


def _request_mail(notice: Notice, view: read.RequestView) -> tuple[str, str]:
    why = "; ".join(view.reasons) or view.runner_reason
    facts = (
        f"{view.summary}\n\n"
        + (f"Amount: {view.amount}\n" if view.amount else "")
        + f"For: {view.principal}\n"
        + (f"Agent's reason: {view.runner_reason}\n" if view.runner_reason else "")
        + (f"Why you are asked: {why}\n" if why else "")
        + f"Approvals: {view.approvals} of {view.approvals_required}\n"
        + f"Expires: {view.expires_at:%Y-%m-%d %H:%M} UTC\n\n"
        + f"Review it here: {view.link}\n"
    )
    if notice.kind == Kind.REQUEST_ESCALATED:
        subject = f"[Effectgate] Escalated to {view.escalated_to}: {view.tool} {view.operation_id}"
        lead = (
            f"{view.tool} ({view.effect_class}) for {view.principal} has waited for a decision "
            f"since {view.created_at:%Y-%m-%d %H:%M} UTC and is now offered to "
            f"{view.escalated_to}.\n\n"
        )
    elif notice.kind == Kind.REQUEST_REMINDER:
        subject = f"[Effectgate] Expires soon: {view.tool} {view.operation_id}"
        lead = (
            f"{view.tool} ({view.effect_class}) for {view.principal} still waits for your "
            f"decision and expires at {view.expires_at:%H:%M} UTC.\n\n"
        )
    else:
        subject = f"[Effectgate] Approval needed: {view.tool} {view.operation_id}"
        lead = f"{view.tool} ({view.effect_class}) for {view.principal} needs your decision.\n\n"
    return subject, lead + facts


def _confirmation_text(resolution: Resolution) -> tuple[str, str]:
    op = resolution.operation
    link = read.console_link(f"/operations/{op.id}/")
    subject = f"[Effectgate] A second person is needed: {op.tool_id} {op.id}"
    body = (
        f"{resolution.declared_by.get_username()} says {op.tool_id} {op.id} for "
        f"{op.principal} did not happen, and waits for a second person to confirm it.\n\n"
        f"Their evidence: {resolution.note}\n\n"
        f"Confirm or dispute it here: {link}\n"
    )
    return subject, body


def _still_for(delivery: NoticeDelivery) -> bool:
    """A personal delivery goes only to someone who is still to be told: a retry hours
    later does not reach a person who lost the permission meanwhile, or decided."""
    if delivery.user_id is None:
        return True
    return any(user.pk == delivery.user_id for user in read.people_told(delivery.notice))


def _still_to_tell(notice: Notice) -> bool:
    """A personal notice is told only while there is something to do about it."""
    if notice.kind == Kind.CONFIRMATION_NEEDED:
        return Resolution.objects.filter(pk=notice.resolution_id, review__isnull=True).exists()
    view = read.request_view(notice.request_id) if notice.request_id else None
    return view is not None and view.pending


def _words(notice: Notice) -> tuple[str, str] | None:
    if notice.kind == Kind.CONFIRMATION_NEEDED:
        resolution = (
            Resolution.objects.select_related("operation", "declared_by")
            .filter(pk=notice.resolution_id)
            .first()
        )
        return _confirmation_text(resolution) if resolution else None
    view = read.request_view(notice.request_id) if notice.request_id else None
    return _request_mail(notice, view) if view else None


def send_mail_delivery(delivery: NoticeDelivery) -> Sent:
    notice = delivery.notice
    if not _still_to_tell(notice) or not _still_for(delivery):
        return Sent("skipped")
    words = _words(notice)
    if words is None:
        return Sent("skipped")
    subject, body = words
    try:
        send_mail(subject=subject, message=body, from_email=None, recipient_list=[delivery.address])
    except OSError as exc:  # smtplib's errors are OSErrors
        return Sent("retry", str(exc) or type(exc).__name__)
    return DELIVERED


def _slack_failure(exc: SlackApiError) -> Sent:
    error, retryable, retry_after = slack.error_of(exc)
    wait = timedelta(seconds=retry_after) if retry_after is not None else None
    return Sent("retry" if retryable else "failed", f"Slack: {error}", wait)


def send_slack(delivery: NoticeDelivery) -> Sent:
    """A request's message to a channel or a person's direct messages (remembered, to be
    updated); for a reminder or a four-eyes request, a plain message."""
    notice = delivery.notice
    if not _still_to_tell(notice) or not _still_for(delivery):
        return Sent("skipped")
    try:
        if notice.kind in (Kind.REQUEST_OPENED, Kind.REQUEST_ESCALATED):
            request = notice.request
            view = read.request_view(request.pk) if request is not None else None
            if request is None or view is None or not view.pending:
                return Sent("skipped")
            if SlackMessage.objects.filter(request=request, address=delivery.address).exists():
                return Sent("skipped")  # already shown there (the escalation's channel)
            channel, ts = slack.post(delivery.address, view)
            services.slack_message_record(
                request=request, address=delivery.address, channel=channel, ts=ts
            )
        else:
            words = _words(notice)
            if words is None:
                return Sent("skipped")
            slack.post_text(delivery.address, words[1])
    except SlackApiError as exc:
        return _slack_failure(exc)
    except OSError as exc:
        return Sent("retry", f"Slack: {exc or type(exc).__name__}")
    return DELIVERED


def send_slack_update(delivery: NoticeDelivery) -> Sent:
    """A request's message shown as the request is now."""
    message = SlackMessage.objects.filter(pk=int(delivery.address)).first()
    if message is None:
        return Sent("skipped")
    view = read.request_view(message.request_id)
    if view is None:
        return Sent("skipped")
    try:
        slack.update(message.channel, message.ts, view)
    except SlackApiError as exc:
        return _slack_failure(exc)
    except OSError as exc:
        return Sent("retry", f"Slack: {exc or type(exc).__name__}")
    services.slack_message_updated(message_id=message.pk)
    return DELIVERED


def webhook_body(notice: Notice) -> dict:
    data: dict = {"notice": notice.id, "kind": notice.kind}
    view = read.request_view(notice.request_id) if notice.request_id else None
    if view is not None:
        data["approval"] = {
            "id": view.request_id,
            "operation": view.operation_id,
            "tool": view.tool,
            "principal": view.principal,
            "summary": view.summary,
            "amount": view.amount,
            "status": view.status,
            "approvals": view.approvals,
            "approvals_required": view.approvals_required,
            "expires_at": iso(view.expires_at),
            "link": view.link,
        }
    if notice.resolution_id:
        data["resolution"] = {"id": notice.resolution_id}
    return {"type": f"people.{notice.kind}", "timestamp": iso(notice.created_at), "data": data}


def send_webhook(delivery: NoticeDelivery) -> Sent:
    """The people-facing webhook: Standard Webhooks headers, signed with
    ``NOTIFY_WEBHOOK_SECRET``; an operator's URL (a chat's incoming webhook behind a
    relay), not a runner's."""
    notice = delivery.notice
    body = json.dumps(webhook_body(notice), separators=(",", ":")).encode()
    stamp = int(time.time())
    msg_id = f"{notice.id}"
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(stamp),
    }
    if settings.NOTIFY_WEBHOOK_SECRET:
        headers["webhook-signature"] = sign(settings.NOTIFY_WEBHOOK_SECRET, msg_id, stamp, body)
    try:
        answer = httpx.post(
            settings.NOTIFY_WEBHOOK_URL,
            content=body,
            headers=headers,
            timeout=settings.WEBHOOK_TIMEOUT_S,
            follow_redirects=False,
        )
    except httpx.HTTPError as exc:
        return Sent("retry", str(exc) or type(exc).__name__)
    if answer.is_success:
        return DELIVERED
    return Sent("retry", f"the webhook answered {answer.status_code}")


CHANNELS: dict[str, Callable[[NoticeDelivery], Sent]] = {
    "mail": send_mail_delivery,
    "slack": send_slack,
    "slack_update": send_slack_update,
    "webhook": send_webhook,
}


# --- the loop -----------------------------------------------------------------------------


@dataclass
class NoticeReport:
    fanned_out: int = 0
    sent: int = 0
    delivered: int = 0
    failed: int = 0


def fan_out_due(*, now: datetime, limit: int) -> int:
    due = list(
        Notice.objects.filter(fanned_out_at=None, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("pk", "next_attempt_at")[:limit]
    )
    written = 0
    for notice_id, due_at in due:
        if not services.notice_claim(notice_id=notice_id, due_at=due_at, now=now):
            continue
        notice = Notice.objects.select_related("request", "request__operation").get(pk=notice_id)
        written += services.notice_fan_out(notice_id=notice_id, targets=targets(notice), now=now)
    return written


def deliver_one(delivery_id: int, claim: datetime) -> str:
    delivery = NoticeDelivery.objects.select_related("notice").get(pk=delivery_id)
    send = CHANNELS.get(delivery.channel)
    try:
        sent = send(delivery) if send else Sent("failed", f"no channel {delivery.channel!r}")
    except Exception as exc:  # one channel's failure never stops the others
        logger.exception("Notice delivery %s failed", delivery_id)
        sent = Sent("retry", type(exc).__name__)
    return services.notice_delivery_finish(
        delivery_id=delivery_id,
        claim=claim,
        outcome=sent.outcome,
        error=sent.error,
        retry_after=sent.retry_after,
        now=timezone.now(),
    )


@timed_sweep("notices")
def deliver_due(*, now: datetime | None = None, limit: int = 100) -> NoticeReport:
    now = now or timezone.now()
    report = NoticeReport(fanned_out=fan_out_due(now=now, limit=limit))
    due = list(
        NoticeDelivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
        .order_by("next_attempt_at")
        .values_list("pk", "next_attempt_at")[:limit]
    )
    for delivery_id, due_at in due:
        claim = services.notice_delivery_claim(delivery_id=delivery_id, due_at=due_at, now=now)
        if claim is None:
            continue
        status = deliver_one(delivery_id, claim)
        report.sent += 1
        report.delivered += status == DeliveryStatus.DELIVERED
        report.failed += status == DeliveryStatus.FAILED
    return report
