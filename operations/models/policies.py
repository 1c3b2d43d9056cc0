"""The tables of people's policies (docs/policies.md): the policies and their texts, the
shadow tallies and the window entries. Written only by ``services.policies``,
``services.shadow`` and ``services.windows``."""

from django.conf import settings
from django.db import models


class Policy(models.Model):
    """A policy people own, in Cedar (docs/policies.md), named by its ``@id``.

    Its versions are append-only; which one is enforced (``active_version``) and which
    one is watched without enforcing (``shadow_version``) change only through
    ``services.policies``, each change an event on the stream ``policy:<id>``, which
    ``audit verify`` replays. A PostgreSQL trigger (migration 0014) moves the policy
    generation on any change of this table, so every process drops the policies it
    remembered at its next registration.
    """

    class State(models.TextChoices):
        DRAFT = "draft"
        SHADOW = "shadow"
        ACTIVE = "active"
        RETIRED = "retired"

    id = models.CharField(primary_key=True, max_length=80)
    state = models.CharField(max_length=10, choices=State.choices, default=State.DRAFT)
    active_version = models.ForeignKey(
        "PolicyVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    shadow_version = models.ForeignKey(
        "PolicyVersion", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        permissions = [("manage_policies", "Can write, shadow, activate and retire policies")]
        indexes = [models.Index(fields=["state"], name="policy_state")]
        ordering = ["id"]

    def __str__(self) -> str:
        return self.id


class PolicyVersion(models.Model):
    """One text of a policy, as a person wrote it; never changed once written."""

    policy = models.ForeignKey(Policy, on_delete=models.PROTECT, related_name="versions")
    number = models.PositiveIntegerField()
    text = models.TextField()
    text_hash = models.CharField(max_length=64)
    kind = models.CharField(max_length=10)  # forbid, require or permit
    message = models.CharField(max_length=500, blank=True, default="")
    written_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    written_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["policy", "number"], name="policyversion_unique_number")
        ]
        ordering = ["policy", "number"]

    def __str__(self) -> str:
        return f"{self.policy_id} v{self.number}"


class PolicyShadowTally(models.Model):
    """What a policy version watched in shadow would have done, per hour: how many
    registrations it would have forbidden, asked a person for, permitted, or (``none``)
    no longer asked for where its active version did; how many of those diverged from
    the policies in force; the last few examples (operation id and tool only).

    A counter, not a ledger row: ``services.shadow`` adds to it with one upsert per
    registration after the registration committed; the divergences it counts past the
    hour's cap of events are known only here.
    """

    class Would(models.TextChoices):
        FORBID = "forbid"
        REQUIRE = "require"
        PERMIT = "permit"
        NONE = "none"

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="+")
    version = models.PositiveIntegerField()
    hour = models.DateTimeField()
    would = models.CharField(max_length=10, choices=Would.choices)
    count = models.PositiveIntegerField(default=0)
    diverged = models.PositiveIntegerField(default=0)
    examples = models.JSONField(default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["policy", "version", "hour", "would"], name="policyshadow_unique_bucket"
            )
        ]

    def __str__(self) -> str:
        return f"{self.policy_id} v{self.version} {self.hour:%Y-%m-%d %H}h {self.would}"


class PolicyWindowEntry(models.Model):
    """One registration a policy with a ``@window`` matched (docs/policies.md, Limits over
    time): counted, and its ``@sum_of`` amount summed, under its group's key.

    Written in the registration's transaction, whatever the registration became: one
    that a person was asked about, or that a person later rejected, still counts (a
    runner cannot reset a limit by getting refused). ``key`` is ``<group_by>:<value>``,
    a digest when longer than the column. The operation is referenced without a
    database constraint: archiving an operation must not give its count back, and the
    sweep deletes entries older than the longest window in force (``services.windows``).
    """

    id = models.BigAutoField(primary_key=True)
    policy_id = models.CharField(max_length=80)
    key = models.CharField(max_length=200)
    at = models.DateTimeField()
    amount = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    operation = models.ForeignKey(
        "operations.Operation", on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )

    class Meta:
        indexes = [
            # The window's one read: count and sum of one (policy, key) since a moment,
            # from the index alone on PostgreSQL (the amount is in it).
            models.Index(
                fields=["policy_id", "key", "at"],
                include=["amount"],
                name="policywindow_group_at",
            ),
            # The sweep's delete of entries past every window.
            models.Index(fields=["at"], name="policywindow_at"),
        ]

    def __str__(self) -> str:
        return f"{self.policy_id} {self.key} {self.at:%Y-%m-%d %H:%M:%S}"
