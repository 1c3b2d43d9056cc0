"""Celery tasks: thin wrappers that call one service each. All are idempotent.

Periodic ones are woken by beat (``CELERY_BEAT_SCHEDULE`` in settings); each claims due
rows in the database, so running one twice or on two workers at once does no harm.
"""

from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.dispatch import receiver
from django.utils import timezone

from . import services
from .dispatch import notices, probes, webhooks
from .services.notices import notices_written

IDEMPOTENT = {"acks_late": True, "reject_on_worker_lost": True, "ignore_result": True}


@shared_task(**IDEMPOTENT)
def expire_leases() -> int:
    return services.lease_expire_due()


@shared_task(**IDEMPOTENT)
def expire_approvals() -> int:
    """Expire undecided requests, then escalate those still pending past their time, and
    expire standing grants past theirs."""
    return (
        services.approval_expire_due()
        + services.approval_escalate_due()
        + services.standing_grants_expire_due()
    )


@shared_task(**IDEMPOTENT)
def enforce_deadlines() -> int:
    return services.operation_deadline_due() + services.run_expire_due()


@shared_task(**IDEMPOTENT)
def run_probes() -> int:
    return probes.probe_due().probed


@shared_task(**IDEMPOTENT)
def deliver_webhooks() -> int:
    return webhooks.deliver_due().sent


@shared_task(**IDEMPOTENT)
def apply_inbound() -> int:
    return services.inbound_apply_pending()


@shared_task(**IDEMPOTENT)
def prune_deliveries() -> int:
    return services.delivery_prune(older_than=timedelta(days=settings.WEBHOOK_RETENTION_DAYS))


@shared_task(**IDEMPOTENT)
def deliver_notices() -> int:
    """Fan new notices out and send the deliveries that are due (mail, Slack, the
    people-facing webhook): dispatch/notices.py."""
    return notices.deliver_due().sent


@receiver(notices_written)
def _deliver_notices_after_commit(sender: Any, **kwargs: Any) -> None:
    """The services wrote notices and committed: send them now from a worker (or
    in-process without a broker) rather than at beat's next second."""
    deliver_notices.delay()


@shared_task(**IDEMPOTENT)
def remind_approvers() -> int:
    return services.reminders_due(now=timezone.now())


@shared_task(**IDEMPOTENT)
def seal_audit_log() -> int:
    """Append committed events to the transparency log and sign checkpoints, until it
    has caught up or the interval to the next run has passed."""
    return services.log_seal_due(budget_s=settings.AUDIT_SEAL_EVERY_S or 10.0)


@shared_task(**IDEMPOTENT)
def prune_notices() -> int:
    return services.notices_prune(older_than=timedelta(days=settings.NOTICE_RETENTION_DAYS))
