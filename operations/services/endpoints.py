"""Webhook endpoints of a runner: registration, secret rotation, disabling, deletion,
redelivery."""

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals.errors import PermissionRefused
from approvals.people import Person

from .. import access, errors
from ..crypto import encrypt
from ..hosts import webhook_policy
from ..machine import EventKind
from ..models import (
    OutboxMessage,
    Runner,
    WebhookEndpoint,
)
from ..signing import new_secret as webhooks_new_secret
from .core import (
    Actor,
    event_append,
    lock,
    record,
)

_REASON_LENGTH = WebhookEndpoint._meta.get_field("disabled_reason").max_length


def runner_webhook_events_refresh(sender: Any, instance: WebhookEndpoint, **kwargs: Any) -> None:
    """Keep ``Runner.webhook_events`` the union of the runner's active endpoints'
    patterns, in the transaction of the endpoint's save or delete (``apps.ready``
    connects it to both), so ``core.subscribes`` never misses a subscriber.

    The runner's row is locked before the endpoints are read: two changes to one
    runner's endpoints (a rotation racing a registration) then read one after the
    other, and the second sees the first's endpoint, instead of both reading before
    either committed and the last writer dropping the other's patterns.
    """
    update_fields = kwargs.get("update_fields")
    if update_fields is not None and not {"events", "is_active", "runner"} & set(update_fields):
        return  # a secret rotated: the patterns did not change
    with transaction.atomic():
        if not Runner.objects.select_for_update().filter(pk=instance.runner_id).exists():
            return  # the runner itself is being deleted
        patterns = sorted(
            {
                pattern
                for events in WebhookEndpoint.objects.filter(
                    runner_id=instance.runner_id, is_active=True
                ).values_list("events", flat=True)
                for pattern in events
            }
        )
        Runner.objects.filter(pk=instance.runner_id).update(webhook_events=patterns)
    if WebhookEndpoint.runner.is_cached(instance):
        instance.runner.webhook_events = patterns


def _require_webhook_url_allowed(url: str) -> None:
    """Refuse a URL whose host resolves to an address deliveries may not connect to
    (``hosts.webhook_policy``), or does not resolve. The connection itself is checked
    again at every delivery (``dispatch.egress``)."""
    allowed, why = webhook_policy().url_allowed(url)
    if not allowed:
        raise errors.UrlNotAllowed(
            f"{why}. Targets must be public addresses or listed in WEBHOOK_ALLOWED_HOSTS."
        )


def webhook_endpoint_create(
    *, runner: Runner, url: str, events: list[str]
) -> tuple[WebhookEndpoint, str]:
    """Register an endpoint; its signing secret is returned only here.

    The URL is checked first, outside the transaction: the check asks DNS, and no row
    may stay locked while it answers."""
    _require_webhook_url_allowed(url)
    secret = webhooks_new_secret()
    with transaction.atomic():
        Runner.objects.select_for_update().get(pk=runner.pk)
        endpoint = WebhookEndpoint.objects.create(
            runner=runner, url=url, events=sorted(set(events)), secret_encrypted=encrypt(secret)
        )
        event_append(
            stream=f"runner:{runner.id}",
            kind=EventKind.WEBHOOK_ENDPOINT_CREATED,
            actor=Actor.of_runner(runner),
            data={"endpoint": endpoint.id, "url": url, "events": endpoint.events},
        )
    return endpoint, secret


def webhook_endpoint_rotate(
    *, endpoint: WebhookEndpoint, actor: Actor, overlap: timedelta = timedelta(hours=24)
) -> str:
    """A new secret; the old one keeps signing (as a second signature) during ``overlap``."""
    secret = webhooks_new_secret()
    with transaction.atomic():
        # The runner's row first, as registering and deleting an endpoint take it.
        Runner.objects.select_for_update().get(pk=endpoint.runner_id)
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        endpoint.previous_secret_encrypted = endpoint.secret_encrypted
        endpoint.previous_secret_until = timezone.now() + overlap
        endpoint.secret_encrypted = encrypt(secret)
        endpoint.save(
            update_fields=[
                "previous_secret_encrypted",
                "previous_secret_until",
                "secret_encrypted",
            ]
        )
        event_append(
            stream=f"runner:{endpoint.runner_id}",
            kind=EventKind.WEBHOOK_SECRET_ROTATED,
            actor=actor,
            data={"endpoint": endpoint.id, "overlap_until": endpoint.previous_secret_until},
        )
    return secret


def webhook_endpoint_delete(*, endpoint: WebhookEndpoint, actor: Actor) -> None:
    with transaction.atomic():
        Runner.objects.select_for_update().get(pk=endpoint.runner_id)
        event_append(
            stream=f"runner:{endpoint.runner_id}",
            kind=EventKind.WEBHOOK_ENDPOINT_DELETED,
            actor=actor,
            data={"endpoint": endpoint.id, "url": endpoint.url},
        )
        endpoint.delete()


def webhook_endpoint_disable(*, endpoint: WebhookEndpoint, actor: Actor, reason: str) -> bool:
    """Stop delivering to an endpoint: it stays listed, inactive, with ``reason``, and the
    messages still waiting for it are dropped (``disabled``). The event goes on the
    runner's stream, as the endpoint's registration and deletion do. Returns whether this
    call disabled it: an endpoint already disabled (or deleted) is left as it is,
    without a second event."""
    with transaction.atomic():
        Runner.objects.select_for_update().get(pk=endpoint.runner_id)
        current = WebhookEndpoint.objects.select_for_update().filter(pk=endpoint.pk).first()
        if current is None or not current.is_active:
            return False
        current.is_active = False
        current.disabled_reason = reason[:_REASON_LENGTH]
        # Saved with ``is_active`` named, so the runner's summary of its active
        # endpoints' patterns is refreshed (``runner_webhook_events_refresh``).
        current.save(update_fields=["is_active", "disabled_reason"])
        dropped = OutboxMessage.objects.filter(
            endpoint=current, status=OutboxMessage.MessageStatus.PENDING
        ).update(status=OutboxMessage.MessageStatus.DISABLED, next_attempt_at=None)
        event_append(
            stream=f"runner:{current.runner_id}",
            kind=EventKind.WEBHOOK_ENDPOINT_DISABLED,
            actor=actor,
            data={
                "endpoint": current.id,
                "url": current.url,
                "reason": current.disabled_reason,
                "dropped_messages": dropped,
            },
        )
    return True


def webhook_redeliver(*, message: OutboxMessage, user: Person) -> OutboxMessage:
    """A person asks for one more delivery of a message, whatever its state."""
    with transaction.atomic():
        op = lock(message.operation_id) if message.operation_id else None
        if op is not None and not access.may_redeliver(user, op):
            raise PermissionRefused("You may not redeliver webhooks of this operation.")
        message = OutboxMessage.objects.select_for_update().get(pk=message.pk)
        now = timezone.now()
        message.status = OutboxMessage.MessageStatus.PENDING
        message.next_attempt_at = now
        message.save(update_fields=["status", "next_attempt_at"])
        if op is not None:
            record(
                op,
                kind=EventKind.WEBHOOK_REDELIVERY,
                actor=Actor.of_user(user),
                now=now,
                data={"message": message.id, "event_type": message.event_type},
            )
    return message
