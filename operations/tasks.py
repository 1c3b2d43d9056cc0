"""Celery tasks: thin wrappers that call one service each. All are idempotent.

Periodic ones are woken by beat (``CELERY_BEAT_SCHEDULE`` in settings); each claims due
rows in the database, so running one twice or on two workers at once does no harm.
"""

from datetime import timedelta
from typing import Any

from celery import shared_task
from django.conf import settings
from django.dispatch import receiver

from . import services
from .dispatch import notifications, probes, webhooks
from .services.core import approval_escalated, approval_requested, resolution_proposed

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


@shared_task(acks_late=True, ignore_result=True)
def notify_approvers(request_id: str) -> int:
    return notifications.approvers_notify(request_id=request_id)


@receiver(approval_requested)
def _notify_after_commit(sender: Any, request_id: str, **kwargs: Any) -> None:
    """The services announce a new request once it is committed; the mail goes out from
    a worker (or in-process without a broker)."""
    notify_approvers.delay(request_id)


@shared_task(acks_late=True, ignore_result=True)
def notify_escalation(request_id: str) -> int:
    return notifications.escalation_notify(request_id=request_id)


@receiver(approval_escalated)
def _notify_escalation_after_commit(sender: Any, request_id: str, **kwargs: Any) -> None:
    notify_escalation.delay(request_id)


@shared_task(acks_late=True, ignore_result=True)
def notify_confirmers(resolution_id: str) -> int:
    return notifications.confirmers_notify(resolution_id=resolution_id)


@receiver(resolution_proposed)
def _notify_confirmers_after_commit(sender: Any, resolution_id: str, **kwargs: Any) -> None:
    notify_confirmers.delay(resolution_id)
