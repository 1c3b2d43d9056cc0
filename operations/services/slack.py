"""Slack's writes (docs/notifications.md, Slack): a person's Slack account linked or
unlinked, an interaction recognised when Slack sends it again, a refusal recorded, a
posted message remembered so later changes update it in place.

A decision from Slack is not written here: it is ``decisions.approval_decide``, the
console's, with the button's intent hash checked under the request's lock.
"""

import hashlib
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import ApprovalRequest, ExternalIdentity
from approvals.people import Person

from ..machine import EventKind
from ..models import SlackInteraction, SlackMessage
from ..selectors.notices import SLACK_ISSUER
from .core import Actor, event_append, lock, record
from .rows import insert_unless_conflict

STREAM = "slack"


def slack_link(
    *,
    user: Person,
    slack_user_id: str,
    actor: Actor,
    via: str,
    email: str = "",
    replace: bool = True,
) -> None:
    """Link ``user`` to the Slack account ``slack_user_id`` (replacing their previous
    one unless ``replace`` is off); ValueError when that account is another person's.
    Audited on the person's stream, with how the link was proven (``via``: ``console``,
    ``operator``, ``email``)."""
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
        taken = ExternalIdentity.objects.filter(issuer=SLACK_ISSUER, subject=slack_user_id)
        if taken.exclude(user=user).exists():
            raise ValueError(f"The Slack account {slack_user_id} is linked to another person.")
        if taken.exists():
            return
        before = ExternalIdentity.objects.filter(issuer=SLACK_ISSUER, user=user).first()
        if before is not None and not replace:
            raise ValueError("Another Slack account is linked to you: unlink it first.")
        if before is not None:
            before.delete()
        try:
            with transaction.atomic():
                ExternalIdentity.objects.create(
                    issuer=SLACK_ISSUER, subject=slack_user_id, user=user, email=email[:254]
                )
        except IntegrityError as exc:  # linked to another person a moment ago
            raise ValueError(
                f"The Slack account {slack_user_id} is linked to another person."
            ) from exc
        event_append(
            stream=f"user:{user.pk}",
            kind=EventKind.IDENTITY_LINKED,
            actor=actor,
            data={
                "issuer": SLACK_ISSUER,
                "subject": slack_user_id,
                "via": via,
                "replaced": before.subject if before is not None else None,
            },
        )


def slack_unlink(*, user: Person, actor: Actor) -> bool:
    """Remove ``user``'s Slack link; False when there was none."""
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
        link = ExternalIdentity.objects.filter(issuer=SLACK_ISSUER, user=user).first()
        if link is None:
            return False
        link.delete()
        event_append(
            stream=f"user:{user.pk}",
            kind=EventKind.IDENTITY_UNLINKED,
            actor=actor,
            data={"issuer": SLACK_ISSUER, "subject": link.subject},
        )
    return True


def slack_interaction_key(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def slack_interaction_first(*, key: str, now: datetime) -> bool:
    """Whether this is the first time Slack sent this interaction (a retry is not)."""
    with transaction.atomic():
        return insert_unless_conflict(SlackInteraction(key=key, received_at=now))


def slack_interaction_answered(*, key: str, answer: dict[str, Any]) -> None:
    """Remember what an interaction was answered, for Slack's retry of it."""
    SlackInteraction.objects.filter(pk=key).update(answer=answer)


def slack_decision_refused(
    *, request_id: str, slack_user_id: str, user: Person | None, refusal: str, detail: str
) -> bool:
    """Record a Slack button or form that decided nothing, on the request's operation:
    the only write a refusal makes. False when there is no such request."""
    request = ApprovalRequest.objects.filter(pk=request_id).only("operation_id").first()
    if request is None:
        return False
    with transaction.atomic():
        op = lock(request.operation_id)
        record(
            op,
            kind=EventKind.SLACK_DECISION_REFUSED,
            actor=Actor.of_user(user) if user is not None else Actor.system("slack"),
            now=timezone.now(),
            data={
                "approval": request_id,
                "slack_user": slack_user_id,
                "refusal": refusal,
                "detail": detail[:500],
            },
        )
    return True


def slack_request_refused(*, refusal: str, data: dict[str, Any]) -> None:
    """Record a request to the interactivity URL that could not be trusted, on the
    ``slack`` stream. The stream has no row to lock: two at one moment meet on the
    stream's (stream, seq) uniqueness, and the second tries again."""
    for _ in range(3):
        try:
            with transaction.atomic():
                event_append(
                    stream=STREAM,
                    kind=EventKind.SLACK_REQUEST_REFUSED,
                    actor=Actor.system("slack"),
                    data={"refusal": refusal, **data},
                )
            return
        except IntegrityError:
            continue


def slack_message_record(*, request: ApprovalRequest, address: str, channel: str, ts: str) -> bool:
    """Remember a message posted for ``request``; False when one was (the post was
    sent twice: the later is not kept)."""
    with transaction.atomic():
        return insert_unless_conflict(
            SlackMessage(
                request=request,
                address=address[:80],
                channel=channel[:40],
                ts=ts[:40],
                posted_at=timezone.now(),
            )
        )


def slack_message_updated(*, message_id: int) -> None:
    SlackMessage.objects.filter(pk=message_id).update(updated_at=timezone.now())
