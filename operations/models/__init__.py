"""The operation ledger: runners, tool contracts, runs, operations, attempts, events.

Rows here are written only by ``operations.services``. The status columns use the
values of ``operations.machine``; the allowed moves between them live there too.
"""

import secrets
from functools import partial

from django.conf import settings
from django.db import models
from django.db.models import JSONField, Q, Value

from approvals.ids import new_id

from ..machine import BLOCKING, EffectClass, Status


def _id_field(prefix: str) -> models.CharField:
    return models.CharField(
        primary_key=True, max_length=40, default=partial(new_id, prefix), editable=False
    )


def new_idempotency_key() -> str:
    """The key a runner passes to downstream APIs on every attempt of one operation
    (``Operation.idempotency_key``): 192 bits from the OS CSPRNG, URL-safe. Only
    operations have one; the ids both apps mint are ``approvals.ids.new_id``'s."""
    return f"ik_{secrets.token_urlsafe(24)}"


class Runner(models.Model):
    """An agent runner account. API requests authenticate as one of these.

    Each runner has a service user so that django-guardian can hold "may invoke this
    tool" permissions for it like for people; the service user cannot log in.
    """

    id = _id_field("rnr")
    name = models.CharField(max_length=100, unique=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="owned_runners",
        help_text="The person responsible for this runner; they cannot decide on its operations.",
    )
    service_user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="runner_account"
    )
    restrict_tools = models.BooleanField(
        default=False,
        help_text="When set, the runner may invoke only tools on which its service user "
        "holds the 'invoke_tool' permission.",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The event patterns of the runner's active webhook endpoints (kept by a signal on
    # every save and delete of an endpoint): a write that no pattern matches writes no
    # outbox row and reads no endpoint. A stale superset costs one read; never a subset.
    # db_default: rows the previous release inserts during an upgrade get it too.
    webhook_events = models.JSONField(default=list, blank=True, db_default=Value([], JSONField()))

    # DRF treats request.user as authenticated through this attribute.
    is_authenticated = True

    def __str__(self) -> str:
        return self.name


class RunnerToken(models.Model):
    SCOPE_USE_TOOLS = "use_tools"
    SCOPE_REGISTER_CONTRACTS = "register_contracts"
    ALL_SCOPES = [SCOPE_USE_TOOLS, SCOPE_REGISTER_CONTRACTS]

    id = _id_field("tok")
    runner = models.ForeignKey(Runner, on_delete=models.CASCADE, related_name="tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=16, help_text="The first characters, to recognise it.")
    scopes = models.JSONField(default=list)
    label = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.runner})"


class Tool(models.Model):
    class BreakerState(models.TextChoices):
        CLOSED = "closed"
        OPEN = "open"
        HALF_OPEN = "half_open"

    name = models.CharField(primary_key=True, max_length=100)
    active_version = models.ForeignKey(
        "ToolVersion", null=True, on_delete=models.PROTECT, related_name="+"
    )
    # The runner that registered the tool first: only it changes the contract (and so
    # the breaker); other runners invoke the tool only when it or a person allows them.
    owner = models.ForeignKey(
        Runner, null=True, blank=True, on_delete=models.PROTECT, related_name="owned_tools"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # Signing secret of the provider's inbound events (Standard Webhooks), encrypted. Set
    # by a person, never by a runner: whoever holds it can report effects as done.
    inbound_secret_encrypted = models.TextField(blank=True, default="")
    # The circuit breaker (contract block "breaker"); its history is on the tool's events.
    breaker_state = models.CharField(
        max_length=16, choices=BreakerState.choices, default=BreakerState.CLOSED
    )
    breaker_failures = models.PositiveIntegerField(default=0)
    breaker_opened_at = models.DateTimeField(null=True, blank=True)
    breaker_probe = models.ForeignKey(
        "Operation",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The one operation let through while half-open.",
    )

    class Meta:
        permissions = [
            ("decide_tool", "Can decide approvals for operations of this tool"),
            ("reconcile_tool", "Can reconcile operations of this tool"),
            ("activate_tool", "Can activate contract versions of this tool"),
            ("invoke_tool", "May be invoked by a restricted runner"),
        ]

    def __str__(self) -> str:
        return self.name


class ToolVersion(models.Model):
    tool = models.ForeignKey(Tool, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    contract = models.JSONField()
    contract_hash = models.CharField(max_length=64)
    weakens = models.JSONField(
        default=list,
        help_text="Why this version did not activate by itself: how it protects less "
        "than the one active when it was registered, and what held it for a person "
        "(HOLD_NEW_TOOLS); empty when it activated.",
    )
    registered_by = models.ForeignKey(
        Runner, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The registering runner's owner when the version was stored: barred from activating
    # it even if the runner's owner changes afterwards.
    registering_owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    activated_at = models.DateTimeField(null=True, blank=True)
    activated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tool", "number"], name="toolversion_unique_number")
        ]
        ordering = ["tool", "number"]

    def __str__(self) -> str:
        return f"{self.tool_id} v{self.number}"

    @property
    def effect_class(self) -> str:
        return self.contract["effect_class"]


class Run(models.Model):
    class RunStatus(models.TextChoices):
        ACTIVE = "active"
        CANCELLED = "cancelled"
        EXPIRED = "expired"

    id = _id_field("run")
    runner = models.ForeignKey(Runner, on_delete=models.PROTECT, related_name="runs")
    external_id = models.CharField(max_length=255, blank=True, default="")
    principal = models.CharField(max_length=255)
    # The person the principal names, found once when the run starts (display only: who
    # is barred from deciding is judged again at each decision, access.barred_user_ids).
    principal_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.ACTIVE)
    max_tool_calls = models.PositiveIntegerField(null=True, blank=True)
    max_turns = models.PositiveIntegerField(null=True, blank=True)
    deadline_s = models.PositiveIntegerField(null=True, blank=True)
    max_spend = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    tool_calls = models.PositiveIntegerField(default=0)
    turns = models.PositiveIntegerField(default=0)
    spend = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    deadline_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["runner", "id"], name="run_runner_id"),
            models.Index(
                fields=["deadline_at"], name="run_active_deadline", condition=Q(status="active")
            ),
        ]

    def __str__(self) -> str:
        return self.id


# Sorted: the set has no stable order, and migrations must not change from run to run.
_BLOCKING = sorted(status.value for status in BLOCKING)


class Operation(models.Model):
    id = _id_field("op")
    runner = models.ForeignKey(Runner, on_delete=models.PROTECT, related_name="operations")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="operations")
    # Indexed with the id (op_tool_id): a tool's latest operations in one index range.
    tool = models.ForeignKey(
        Tool, on_delete=models.PROTECT, related_name="operations", db_index=False
    )
    tool_version = models.ForeignKey(ToolVersion, on_delete=models.PROTECT, related_name="+")
    effect_class = models.CharField(
        max_length=16, choices=[(c.value, c.value) for c in EffectClass]
    )
    call_id = models.CharField(max_length=255, blank=True, default="")
    operation_key = models.CharField(max_length=255)
    arguments = models.JSONField(help_text="Frozen: validated, sensitive values digested.")
    intent_hash = models.CharField(max_length=64)
    principal = models.CharField(max_length=255)
    principal_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    idempotency_key = models.CharField(max_length=64, unique=True, default=new_idempotency_key)
    status = models.CharField(max_length=20, choices=[(s.value, s.value) for s in Status])
    attempts = models.PositiveIntegerField(default=0, help_text="Attempts claimed so far.")
    not_before = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    downstream_id = models.CharField(max_length=255, blank=True, default="")
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_detail = models.TextField(blank=True, default="")
    unknown_sticky = models.BooleanField(
        default=False,
        help_text="An attempt of this write ended unknown and was not found not applied: "
        "only success or a reconciliation answer can close it.",
    )
    # NULL, not "", when the tool has no concurrency key: the partial unique index below
    # must not treat every keyless operation as holding the same resource.
    concurrency_value = models.CharField(  # noqa: DJ001
        max_length=64, null=True, blank=True, help_text="sha256 of the concurrency key's value."
    )
    turn = models.PositiveIntegerField(null=True, blank=True)
    traceparent = models.CharField(
        max_length=55, blank=True, default="", help_text="W3C trace context of the runner."
    )
    next_probe_at = models.DateTimeField(null=True, blank=True)
    probes = models.PositiveIntegerField(default=0)
    snoozed_until = models.DateTimeField(
        null=True, blank=True, help_text="A person answered 'still unknown' and looks again then."
    )
    previous = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries"
    )
    # Edit before approve: the operation that took this one's place (status superseded),
    # and on that successor the changes a person made ([{"path", "from", "to"}]).
    superseded_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    edits = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Kept beside the status (set with every transition) so that queues can be ordered
    # and filtered by "in this state since" through an index, without reading events.
    status_changed_at = models.DateTimeField(null=True, blank=True)
    # The head of the operation's event chain (its last event's seq and hash), written
    # with each event under the operation's row lock: appending reads no event.
    # db_default: rows the previous release inserts during an upgrade get them too.
    event_seq = models.PositiveIntegerField(default=0, db_default=0)
    event_head = models.CharField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["runner", "operation_key"], name="operation_unique_key_per_runner"
            ),
            # At most one unresolved effect per resource: the database refuses a second
            # operation of the same tool and concurrency-key value in a blocking state.
            models.UniqueConstraint(
                fields=["tool", "concurrency_value"],
                condition=Q(status__in=_BLOCKING, concurrency_value__isnull=False),
                name="operation_one_unresolved_per_key",
            ),
        ]
        indexes = [
            models.Index(fields=["runner", "id"], name="op_runner_id"),
            models.Index(fields=["run", "id"], name="op_run_id"),
            models.Index(fields=["tool", "id"], name="op_tool_id"),
            # The approval page's "first operation for this principal" (selectors.review).
            models.Index(fields=["principal", "id"], name="op_principal_id"),
            models.Index(fields=["status", "id"], name="op_status_id"),
            models.Index(fields=["status", "status_changed_at"], name="op_status_since"),
            # The console's search box looks operations up by these, across runners.
            models.Index(fields=["operation_key"], name="op_operation_key"),
            models.Index(fields=["call_id"], name="op_call_id"),
            models.Index(fields=["downstream_id"], name="op_downstream_id"),
            models.Index(
                fields=["lease_until"], name="op_executing_lease", condition=Q(status="executing")
            ),
            models.Index(
                fields=["next_probe_at"],
                name="op_unknown_probe",
                condition=Q(status="outcome_unknown"),
            ),
            models.Index(
                fields=["deadline_at"],
                name="op_waiting_deadline",
                condition=Q(status__in=["ready", "awaiting_approval"]),
            ),
        ]

    def __str__(self) -> str:
        return self.id


class Attempt(models.Model):
    class AttemptStatus(models.TextChoices):
        EXECUTING = "executing"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        UNKNOWN = "unknown"
        LEASE_EXPIRED = "lease_expired"
        SUPERSEDED = "superseded"

    id = _id_field("att")
    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="attempt_set")
    number = models.PositiveIntegerField()
    status = models.CharField(
        max_length=16, choices=AttemptStatus.choices, default=AttemptStatus.EXECUTING
    )
    claimed_at = models.DateTimeField()
    lease_until = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Heartbeats received; one event is written per HEARTBEAT_EVENT_EVERY of them, so a
    # long call does not grow its operation's history without bound.
    heartbeats = models.PositiveIntegerField(default=0, db_default=0)
    outcome = models.JSONField(null=True, blank=True, help_text="The outcome body as posted.")
    outcome_code = models.CharField(max_length=64, blank=True, default="")
    closed_at = models.DateTimeField(null=True, blank=True)
    not_applied = models.BooleanField(
        default=False, help_text="Reconciliation found that this attempt's effect did not happen."
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation", "number"], name="attempt_unique_number")
        ]
        ordering = ["operation", "number"]

    def __str__(self) -> str:
        return f"{self.operation_id} #{self.number}"


class Resolution(models.Model):
    """A person's "did not happen" for an irreversible operation, awaiting a second person.

    Declaring that money did not leave is what allows it to leave again, so it takes
    effect only when someone other than the declarer confirms it (four eyes). Rows are
    append-only: the second person's answer is a ``ResolutionReview``.
    """

    id = _id_field("res")
    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="resolutions")
    declared_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    note = models.TextField()
    evidence = models.JSONField(default=dict)
    created_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.id

    @property
    def status(self) -> str:
        """``pending`` until reviewed, then the review's decision."""
        try:
            return self.review.decision
        except ResolutionReview.DoesNotExist:
            return "pending"


class ResolutionReview(models.Model):
    class Decision(models.TextChoices):
        CONFIRMED = "confirmed"
        DISPUTED = "disputed"
        # The operation was answered otherwise (a late success, a probe) first.
        WITHDRAWN = "withdrawn"

    resolution = models.OneToOneField(Resolution, on_delete=models.PROTECT, related_name="review")
    decision = models.CharField(max_length=16, choices=Decision.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+"
    )
    note = models.TextField(blank=True, default="")
    at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.resolution_id} {self.decision}"


class InboundEvent(models.Model):
    """An event a provider sent about an effect (a refund succeeded, a message bounced).

    Recorded under a unique (tool, event id) before anything else, so a duplicate
    delivery changes nothing; then matched to an operation and applied as evidence.
    """

    class InboundStatus(models.TextChoices):
        RECEIVED = "received"
        APPLIED = "applied"
        MATCHED = "matched"  # matched, kept as evidence, changed no state
        UNMATCHED = "unmatched"

    id = _id_field("ine")
    tool = models.ForeignKey(Tool, on_delete=models.PROTECT, related_name="inbound_events")
    event_id = models.CharField(max_length=255)
    event_type = models.CharField(max_length=255, blank=True, default="")
    sent_at = models.DateTimeField()
    received_at = models.DateTimeField()
    payload = models.JSONField()
    status = models.CharField(
        max_length=16, choices=InboundStatus.choices, default=InboundStatus.RECEIVED
    )
    outcome = models.CharField(max_length=16, blank=True, default="")
    operation = models.ForeignKey(
        Operation, null=True, blank=True, on_delete=models.PROTECT, related_name="inbound_events"
    )
    note = models.CharField(max_length=500, blank=True, default="")
    processed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tool", "event_id"], name="inbound_unique_event_id")
        ]
        indexes = [
            models.Index(fields=["status", "received_at"], name="inbound_status_received"),
        ]

    def __str__(self) -> str:
        return f"{self.tool_id} {self.event_id}"


class WebhookEndpoint(models.Model):
    """Where a runner wants to hear about its operations (Standard Webhooks)."""

    id = _id_field("whe")
    runner = models.ForeignKey(Runner, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=2000)
    events = models.JSONField(default=list, help_text='Patterns such as "operation.*".')
    secret_encrypted = models.TextField(help_text="whsec_... encrypted with the field key.")
    previous_secret_encrypted = models.TextField(blank=True, default="")
    previous_secret_until = models.DateTimeField(
        null=True, blank=True, help_text="Until then, deliveries carry both signatures."
    )
    is_active = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.url} ({self.runner})"


class OutboxMessage(models.Model):
    """One event for one endpoint, written in the transaction of the change it reports.

    Its id is the ``webhook-id`` receivers deduplicate by; every delivery attempt of it
    is a ``DeliveryAttempt``. Due work lives here (``next_attempt_at``); dispatchers
    claim rows by compare-and-set.
    """

    class MessageStatus(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"
        DISABLED = "disabled"

    id = _id_field("msg")
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="messages")
    operation = models.ForeignKey(
        Operation, null=True, on_delete=models.CASCADE, related_name="outbox_messages"
    )
    event_type = models.CharField(max_length=64)
    payload = models.JSONField()
    status = models.CharField(
        max_length=16, choices=MessageStatus.choices, default=MessageStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="outbox_pending_due",
                condition=Q(status="pending"),
            ),
            models.Index(fields=["created_at"], name="outbox_created"),
            # The oldest undelivered message (a metrics gauge), without walking the
            # delivered ones.
            models.Index(
                fields=["created_at"],
                name="outbox_pending_created",
                condition=Q(status="pending"),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.event_type}"


class DeliveryAttempt(models.Model):
    message = models.ForeignKey(
        OutboxMessage, on_delete=models.CASCADE, related_name="delivery_attempts"
    )
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["message", "number"]

    def __str__(self) -> str:
        return f"{self.message_id} #{self.number}"


class Event(models.Model):
    """One append-only audit record; a transition's event is written with it.

    Events form one hash chain per stream (an operation, a run, a tool, a runner): each
    holds the hash of the stream's previous event, so one operation's history can be
    verified on its own without serializing unrelated writes.
    """

    stream = models.CharField(max_length=120)
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=40)
    operation = models.ForeignKey(
        Operation, null=True, on_delete=models.PROTECT, related_name="events"
    )
    run = models.ForeignKey(Run, null=True, on_delete=models.PROTECT, related_name="events")
    tool_name = models.CharField(max_length=100, blank=True, default="")
    from_status = models.CharField(max_length=20, blank=True, default="")
    to_status = models.CharField(max_length=20, blank=True, default="")
    actor = models.CharField(max_length=200)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+"
    )
    actor_runner = models.ForeignKey(Runner, null=True, on_delete=models.PROTECT, related_name="+")
    at = models.DateTimeField()
    data = models.JSONField(default=dict)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)
    # "<key id>:<hex HMAC-SHA256 of hash>" under AUDIT_EVENT_KEY, "" without a key
    # (operations/eventmac.py); not part of the hash.
    mac = models.CharField(max_length=80, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["stream", "seq"], name="event_unique_seq_per_stream")
        ]
        indexes = [
            models.Index(fields=["at", "id"], name="event_at_id"),
            models.Index(fields=["kind", "id"], name="event_kind_id"),
            models.Index(fields=["tool_name", "id"], name="event_tool_id"),
        ]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.stream}#{self.seq} {self.kind}"


class SavedView(models.Model):
    """A person's named filters of a console list (the operations list or the queue):
    a preference, not part of the ledger. ``query`` is the list's query string."""

    class ListName(models.TextChoices):
        OPERATIONS = "operations"
        RECONCILIATION = "reconciliation"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views"
    )
    list_name = models.CharField(max_length=20, choices=ListName.choices)
    name = models.CharField(max_length=80)
    query = models.CharField(max_length=1000, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "list_name", "name"], name="savedview_unique_name"
            )
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.user} {self.list_name}: {self.name}"


# People's policies, notifications and the transparency log, in modules of their own;
# imported here so that Django and every ``from operations.models import ...`` find them.
from .notifications import Notice as Notice  # noqa: E402
from .notifications import NoticeDelivery as NoticeDelivery  # noqa: E402
from .notifications import NotificationPreference as NotificationPreference  # noqa: E402
from .notifications import NotificationRoute as NotificationRoute  # noqa: E402
from .notifications import SlackInteraction as SlackInteraction  # noqa: E402
from .notifications import SlackMessage as SlackMessage  # noqa: E402
from .policies import Policy as Policy  # noqa: E402
from .policies import PolicyShadowTally as PolicyShadowTally  # noqa: E402
from .policies import PolicyVersion as PolicyVersion  # noqa: E402
from .policies import PolicyWindowEntry as PolicyWindowEntry  # noqa: E402
from .tlog import Checkpoint as Checkpoint  # noqa: E402
from .tlog import LogLeaf as LogLeaf  # noqa: E402
from .tlog import LogNode as LogNode  # noqa: E402
