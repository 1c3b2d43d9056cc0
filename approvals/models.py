"""Approval requests, decisions and grants (docs/api.md, Approvals).

This app knows operations only as the string reference ``"operations.Operation"`` and
the objects it is handed; ``operations.services`` applies the transitions that follow a
decision.
"""

from functools import partial

from django.conf import settings
from django.db import models
from django.db.models import Q

from .ids import new_id


class ApprovalRequest(models.Model):
    class RequestStatus(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        EXPIRED = "expired"
        REVOKED = "revoked"
        WITHDRAWN = "withdrawn"
        # A person approved with changes: the successor operation has its own request.
        SUPERSEDED = "superseded"

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "apr"), editable=False
    )
    operation = models.ForeignKey(
        "operations.Operation", on_delete=models.CASCADE, related_name="approval_requests"
    )
    intent_hash = models.CharField(max_length=64)
    status = models.CharField(
        max_length=16, choices=RequestStatus.choices, default=RequestStatus.PENDING
    )
    approvals_required = models.PositiveSmallIntegerField(default=1)
    grant_ttl_s = models.PositiveIntegerField(default=900)
    reason = models.TextField(help_text="Why a person is asked, in plain sentences.")
    context = models.JSONField(
        default=dict,
        help_text="What the approver needs beside the operation: matched rules, the "
        "runner's reason, reconciliation evidence, the request this one replaces.",
    )
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_at = models.DateTimeField(null=True, blank=True)
    # Escalation (contract approval.escalate_after_s / escalate_to), set when the request
    # opens: from ``escalate_at`` on (the sweep sets ``escalated_at``) the members of the
    # group ``escalate_to`` may decide it too.
    escalate_at = models.DateTimeField(null=True, blank=True)
    escalate_to = models.CharField(max_length=150, blank=True, default="")
    escalated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["expires_at"], name="apr_pending_expiry", condition=Q(status="pending")
            ),
            models.Index(fields=["operation", "created_at"], name="apr_operation_created"),
            models.Index(fields=["decided_at"], name="apr_decided_at"),
            models.Index(
                fields=["escalate_at"],
                name="apr_escalation_due",
                condition=Q(status="pending", escalated_at__isnull=True),
            ),
        ]
        ordering = ["created_at"]

    def __str__(self) -> str:
        return self.id


class Decision(models.Model):
    class Verdict(models.TextChoices):
        APPROVE = "approve"
        REJECT = "reject"

    request = models.ForeignKey(ApprovalRequest, on_delete=models.PROTECT, related_name="decisions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    decision = models.CharField(max_length=8, choices=Verdict.choices)
    comment = models.TextField(blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        constraints = [
            # Nobody decides twice on one request: a quorum needs distinct people.
            models.UniqueConstraint(fields=["request", "user"], name="decision_one_per_person")
        ]
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.user} {self.decision} {self.request_id}"


class Grant(models.Model):
    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "grt"), editable=False
    )
    request = models.OneToOneField(ApprovalRequest, on_delete=models.PROTECT, related_name="grant")
    intent_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+"
    )
    revoke_reason = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return self.id
