"""Approval requests, decisions and grants (docs/api.md, Approvals).

This app knows operations only as the string reference ``"operations.Operation"`` and
the objects it is handed; ``operations.services`` applies the transitions that follow a
decision.
"""

from functools import partial

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from .ids import new_id
from .standing import Family


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
    # Set when a standing grant gave this grant instead of people deciding on the request:
    # the use of it that approved this exact intent.
    standing_grant = models.ForeignKey(
        "StandingGrant", null=True, blank=True, on_delete=models.PROTECT, related_name="grants"
    )

    def __str__(self) -> str:
        return self.id


class StandingGrant(models.Model):
    """People's approval, given in advance, of the next intents of one family (docs/
    policies.md, Standing grants): a tool, a principal or any, a run or any, pins on the
    arguments. Each use approves one exact intent (a ``Grant`` pointing here) and is
    counted by one conditional UPDATE, so concurrent registrations never take more uses,
    or more of the sum, than it holds.

    It is ``proposed`` until ``approvals_required`` distinct people have signed it (the
    issuer first), and covers nothing until then.
    """

    class GrantStatus(models.TextChoices):
        PROPOSED = "proposed"
        ACTIVE = "active"
        REVOKED = "revoked"
        EXHAUSTED = "exhausted"
        EXPIRED = "expired"

    id = models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, "sgr"), editable=False
    )
    # An operations.Tool's name: this app does not name operations' models.
    tool = models.CharField(max_length=100)
    principal = models.CharField(max_length=255, blank=True, default="", help_text='"" is any.')
    run_id = models.CharField(max_length=40, blank=True, default="", help_text='"" is any run.')
    pins = models.JSONField(default=list, help_text='[{"path", "op", "value"}] on the arguments.')
    max_uses = models.PositiveIntegerField()
    uses = models.PositiveIntegerField(default=0)
    sum_path = models.CharField(
        max_length=500, blank=True, default="", help_text='The argument summed; "" is none.'
    )
    max_sum = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    sum_used = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    expires_at = models.DateTimeField()
    approvals_required = models.PositiveSmallIntegerField(
        default=1, help_text="The quorum it was issued with: the most an operation it covers needs."
    )
    status = models.CharField(
        max_length=16, choices=GrantStatus.choices, default=GrantStatus.PROPOSED
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField()
    activated_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(
        null=True, blank=True, help_text="When it was exhausted, expired or revoked."
    )
    revoked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    revoke_reason = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            # The conditional UPDATE that takes a use is the rule; these are its backstop.
            models.CheckConstraint(
                condition=Q(uses__lte=F("max_uses")), name="sgr_uses_within_max"
            ),
            models.CheckConstraint(
                condition=Q(max_sum__isnull=True) | Q(sum_used__lte=F("max_sum")),
                name="sgr_sum_within_max",
            ),
            models.CheckConstraint(condition=Q(max_uses__gte=1), name="sgr_at_least_one_use"),
        ]
        indexes = [
            models.Index(
                fields=["tool", "expires_at"], name="sgr_active_tool", condition=Q(status="active")
            ),
            models.Index(
                fields=["expires_at"],
                name="sgr_open_expiry",
                condition=Q(status__in=["proposed", "active"]),
            ),
            models.Index(fields=["created_at"], name="sgr_created"),
        ]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.id

    @property
    def family(self) -> Family:
        return Family(tool=self.tool, principal=self.principal, run_id=self.run_id, pins=self.pins)

    @property
    def uses_remaining(self) -> int:
        return max(0, self.max_uses - self.uses)


class StandingGrantSignature(models.Model):
    """One person's signature on a standing grant; the quorum counts distinct people."""

    grant = models.ForeignKey(StandingGrant, on_delete=models.PROTECT, related_name="signatures")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    at = models.DateTimeField()
    # Whether the signer's session was verified with a one-time password: a use for an
    # operation whose decision needs a second factor needs every signature to have had one.
    second_factor = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["grant", "user"], name="sgr_signature_one_per_person")
        ]
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return f"{self.user} signed {self.grant_id}"


class ExternalIdentity(models.Model):
    """A person's account at an OpenID provider: the pair (issuer, ``sub``) that the
    provider promises never to give anyone else (OpenID Connect Core, 5.7).

    Single sign-on (console/sso.py) finds the person by this pair alone, never by a name
    or an email address a provider lets people change; the email is kept only to show.
    """

    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="external_identities"
    )
    email = models.CharField(max_length=254, blank=True)
    linked_at = models.DateTimeField(auto_now_add=True)
    last_sign_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="external_identity_unique"),
            # One account per provider and person: a second would be a second key to one door.
            models.UniqueConstraint(
                fields=["issuer", "user"], name="external_identity_one_per_user"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
