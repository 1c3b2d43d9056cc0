"""The operation state machine as plain data and pure functions (docs/api.md, The state
machine).

``operations.services`` is the only code that changes an operation's state; it asks
this module which moves are allowed, how a posted outcome is classified for an effect
class, how long the backoff is and what a runner may do next. Nothing here touches the
database, so every row of the outcome table is tested without one.

``EventKind`` is the vocabulary of the ledger: every writer names the kind of the event
it appends by its member, and every reader compares kinds with members.
"""

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum


class Status(StrEnum):
    AWAITING_APPROVAL = "awaiting_approval"
    READY = "ready"
    EXECUTING = "executing"
    OUTCOME_UNKNOWN = "outcome_unknown"
    COMPENSATING = "compensating"
    SUCCEEDED = "succeeded"
    REJECTED = "rejected"
    FAILED_PERMANENT = "failed_permanent"
    BUDGET_EXHAUSTED = "budget_exhausted"
    COMPENSATED = "compensated"
    CANCELLED = "cancelled"
    # A person approved it with changed arguments: a successor operation took its place.
    SUPERSEDED = "superseded"


class EffectClass(StrEnum):
    READ_ONLY = "read_only"
    IDEMPOTENT = "idempotent"
    DEDUPLICATED = "deduplicated"
    COMPENSABLE = "compensable"
    IRREVERSIBLE = "irreversible"


# Strictness order, used to tell whether a new contract version weakens the old one.
EFFECT_CLASS_RANK = {cls: rank for rank, cls in enumerate(EffectClass)}

TERMINAL = frozenset(
    {
        Status.SUCCEEDED,
        Status.REJECTED,
        Status.FAILED_PERMANENT,
        Status.BUDGET_EXHAUSTED,
        Status.COMPENSATED,
        Status.CANCELLED,
        Status.SUPERSEDED,
    }
)

# States in which an operation's effect may exist without an answer: they block claims
# of other operations with the same concurrency-key value (a partial unique index
# enforces it in the database too).
BLOCKING = frozenset({Status.EXECUTING, Status.OUTCOME_UNKNOWN, Status.COMPENSATING})

# States a late ``succeeded`` closes (api.md, late outcomes). ``executing`` is here too:
# a newer attempt of a repeatable operation may be in flight when the older attempt's
# success arrives; the effect happened, so the newer attempt becomes stale.
LATE_SUCCESS_FROM = frozenset(
    {
        Status.OUTCOME_UNKNOWN,
        Status.READY,
        Status.AWAITING_APPROVAL,
        Status.CANCELLED,
        Status.EXECUTING,
    }
)

TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.AWAITING_APPROVAL: frozenset(
        {
            Status.READY,
            Status.REJECTED,
            Status.CANCELLED,
            Status.BUDGET_EXHAUSTED,
            Status.SUCCEEDED,
            Status.OUTCOME_UNKNOWN,
            Status.SUPERSEDED,
        }
    ),
    Status.READY: frozenset(
        {
            Status.EXECUTING,
            Status.AWAITING_APPROVAL,
            Status.CANCELLED,
            Status.BUDGET_EXHAUSTED,
            Status.OUTCOME_UNKNOWN,
            Status.SUCCEEDED,
        }
    ),
    Status.EXECUTING: frozenset(
        {
            Status.SUCCEEDED,
            Status.READY,
            Status.FAILED_PERMANENT,
            Status.BUDGET_EXHAUSTED,
            Status.OUTCOME_UNKNOWN,
            Status.COMPENSATING,
        }
    ),
    Status.OUTCOME_UNKNOWN: frozenset(
        {Status.SUCCEEDED, Status.READY, Status.AWAITING_APPROVAL, Status.BUDGET_EXHAUSTED}
    ),
    Status.COMPENSATING: frozenset({Status.COMPENSATED}),
    # Cancelled is terminal for everything except the evidence of a late success.
    Status.CANCELLED: frozenset({Status.SUCCEEDED}),
    Status.SUCCEEDED: frozenset(),
    Status.REJECTED: frozenset(),
    Status.FAILED_PERMANENT: frozenset(),
    Status.BUDGET_EXHAUSTED: frozenset(),
    Status.COMPENSATED: frozenset(),
    Status.SUPERSEDED: frozenset(),
}


class EventKind(StrEnum):
    """What an event records: one member per kind of event any code writes to the ledger,
    grouped by the stream that holds it. A member equals its string, so the kinds stored
    and hashed into the chains are the strings themselves (``services.core.event_hash``).
    """

    # An operation's own stream (docs/api.md, Reading).
    REGISTERED = "registered"
    APPROVAL_REQUESTED = "approval_requested"
    DECISION = "decision"
    GRANTED = "granted"
    REJECTED = "rejected"
    APPROVAL_EXPIRED = "approval_expired"
    APPROVAL_ESCALATED = "approval_escalated"
    SUPERSEDED = "superseded"
    GRANT_REVOKED = "grant_revoked"
    GRANT_INVALID = "grant_invalid"
    CLAIMED = "claimed"
    HEARTBEAT = "heartbeat"
    OUTCOME = "outcome"
    OUTCOME_CONFLICT = "outcome_conflict"
    LEASE_EXPIRED = "lease_expired"
    LATE_OUTCOME = "late_outcome"
    LATE_SUCCESS = "late_success"
    REOPENED = "reopened"
    BUDGET_EXHAUSTED = "budget_exhausted"
    CANCELLED = "cancelled"
    PROBE = "probe"
    RECONCILED = "reconciled"
    RESOLUTION_PROPOSED = "resolution_proposed"
    RESOLUTION_DISPUTED = "resolution_disputed"
    SNOOZED = "snoozed"
    NOTE = "note"
    COMPENSATION = "compensation"
    INBOUND_EVIDENCE = "inbound_evidence"
    WEBHOOK_REDELIVERY = "webhook_redelivery"
    # A run's stream.
    RUN_CREATED = "run_created"
    RUN_CANCELLED = "run_cancelled"
    RUN_EXPIRED = "run_expired"
    # A policy refused a registration in the run (nothing else is written).
    REGISTRATION_FORBIDDEN = "registration_forbidden"
    # A tool's stream.
    CONTRACT_REGISTERED = "contract_registered"
    CONTRACT_ACTIVATED = "contract_activated"
    TOOL_TRANSFERRED = "tool_transferred"
    TOOL_INVOKER_ALLOWED = "tool_invoker_allowed"
    TOOL_INVOKER_REMOVED = "tool_invoker_removed"
    TOOL_PERMISSIONS_CHANGED = "tool_permissions_changed"
    INBOUND_SECRET_SET = "inbound_secret_set"  # noqa: S105 (the name of an event, not a secret)
    BREAKER_OPENED = "breaker_opened"
    BREAKER_HALF_OPEN = "breaker_half_open"
    BREAKER_CLOSED = "breaker_closed"
    BREAKER_FORCED_OPEN = "breaker_forced_open"
    BREAKER_FORCED_CLOSED = "breaker_forced_closed"
    # A runner's stream.
    RUNNER_CREATED = "runner_created"
    RUNNER_UPDATED = "runner_updated"
    TOKEN_CREATED = "token_created"  # noqa: S105 (the name of an event, not a secret)
    TOKEN_REVOKED = "token_revoked"  # noqa: S105 (the name of an event, not a secret)
    WEBHOOK_ENDPOINT_CREATED = "webhook_endpoint_created"
    WEBHOOK_ENDPOINT_DELETED = "webhook_endpoint_deleted"
    WEBHOOK_ENDPOINT_DISABLED = "webhook_endpoint_disabled"
    WEBHOOK_SECRET_ROTATED = "webhook_secret_rotated"  # noqa: S105 (the name of an event, not a secret)
    # A standing grant's stream (``sgr:<id>``).
    STANDING_GRANT_ISSUED = "standing_grant_issued"
    STANDING_GRANT_SIGNED = "standing_grant_signed"
    STANDING_GRANT_ACTIVATED = "standing_grant_activated"
    STANDING_GRANT_USED = "standing_grant_used"
    STANDING_GRANT_EXHAUSTED = "standing_grant_exhausted"
    STANDING_GRANT_EXPIRED = "standing_grant_expired"
    STANDING_GRANT_REVOKED = "standing_grant_revoked"
    # A policy's stream (``policy:<id>``).
    POLICY_WRITTEN = "policy_written"
    POLICY_SHADOWED = "policy_shadowed"
    POLICY_ACTIVATED = "policy_activated"
    POLICY_RETIRED = "policy_retired"
    # A shadow policy would have done otherwise than the policies in force (its stream).
    POLICY_SHADOW_DIVERGED = "policy_shadow_diverged"
    # A person's stream (console/accounts.py).
    SIGNED_IN = "signed_in"
    SIGNED_OUT = "signed_out"
    SESSIONS_ENDED = "sessions_ended"
    SECOND_FACTOR_ADDED = "second_factor_added"
    SECOND_FACTOR_VERIFIED = "second_factor_verified"
    SECOND_FACTOR_FAILED = "second_factor_failed"
    # Single sign-on (console/sso.py): a provider's account linked to the person, their
    # mapped groups changed by the provider's claim, a sign-in refused (on the ``sso``
    # stream when there is no person).
    IDENTITY_LINKED = "identity_linked"
    GROUPS_SYNCED = "groups_synced"
    SIGN_IN_REFUSED = "sign_in_refused"
    # A linked account removed (a Slack account, by its person or an operator).
    IDENTITY_UNLINKED = "identity_unlinked"
    # Notifications (services/notices.py): which channels tell a person what (their
    # stream); which Slack channel a tool's or a group's requests go to (the tool's
    # stream, or ``group:<id>``).
    NOTIFICATION_PREFERENCES_SET = "notification_preferences_set"
    NOTIFICATIONS_ROUTED = "notifications_routed"
    # Slack (services/slack.py): a button or a form from Slack that decided nothing, on
    # the request's operation; one that could not be trusted (bad signature, old
    # timestamp, another workspace) on the ``slack`` stream.
    SLACK_DECISION_REFUSED = "slack_decision_refused"
    SLACK_REQUEST_REFUSED = "slack_request_refused"
    # The archive's stream: the anchor of each archive file.
    ARCHIVED = "archived"


def can_transition(source: str, target: str) -> bool:
    return Status(target) in TRANSITIONS[Status(source)]


def is_write(effect_class: str) -> bool:
    """Every class but read_only may change the world."""
    return effect_class != EffectClass.READ_ONLY


class Verdict(StrEnum):
    """What a posted outcome means before budgets are considered."""

    SUCCEEDED = "succeeded"
    RETRY = "retry"
    FAILED_PERMANENT = "failed_permanent"
    COMPENSATE = "compensate"
    RECONCILE = "reconcile"


NOT_SENT = "not_sent"
# What an outcome's ``code`` may be. A contract's retryable codes and breaker failure
# codes are compared with it, so they must match this too or they would never apply.
OUTCOME_CODE_PATTERN = r"^[a-z0-9_.:-]{1,64}$"


def classify_outcome(
    *, effect_class: str, kind: str, code: str | None, retryable_codes: list[str]
) -> Verdict:
    """What a posted outcome does, one row per ``kind``/``code``: a success succeeds;
    a failure is retried when its code is ``not_sent`` or retryable, else it is
    permanent; an unknown outcome is retried, compensated or reconciled by effect class
    (docs/api.md, "What a posted outcome does").

    ``kind`` is ``succeeded``, ``failed`` or ``unknown``; an expired lease is classified
    by the caller as ``unknown``.
    """
    if kind == "succeeded":
        return Verdict.SUCCEEDED
    if kind == "failed":
        if code == NOT_SENT or (code is not None and code in retryable_codes):
            return Verdict.RETRY
        return Verdict.FAILED_PERMANENT
    if kind == "unknown":
        if effect_class == EffectClass.COMPENSABLE:
            return Verdict.COMPENSATE
        if effect_class == EffectClass.IRREVERSIBLE:
            return Verdict.RECONCILE
        # read_only, idempotent and deduplicated repeat with the same key.
        return Verdict.RETRY
    raise ValueError(f"unknown outcome kind {kind!r}")


@dataclass(frozen=True)
class Budget:
    attempts_used: int
    max_attempts: int
    deadline_at: datetime | None


def retry_possible(budget: Budget, *, not_before: datetime) -> bool:
    """Whether one more attempt fits the operation's budget (attempts and deadline)."""
    if budget.attempts_used >= budget.max_attempts:
        return False
    return budget.deadline_at is None or not_before < budget.deadline_at


def end_without_retry(*, effect_class: str, unknown_sticky: bool, wanted: Status) -> Status:
    """Where an operation goes when it would fail or run out of budget.

    Unknown is sticky: once a write's attempt ended unknown the effect may exist, so a
    later failure or an empty budget cannot close it; it waits for reconciliation.
    """
    if unknown_sticky and is_write(effect_class):
        return Status.OUTCOME_UNKNOWN
    return wanted


def backoff_delay_ms(
    *, attempt: int, base_delay_ms: int, max_delay_ms: int, rng: random.Random | None = None
) -> int:
    """Capped exponential backoff with full jitter (AWS architecture blog, 2015).

    The ceiling doubles with each attempt from ``base_delay_ms`` up to ``max_delay_ms``;
    the delay is drawn uniformly between zero and that ceiling so that many runners
    retrying at once spread out.
    """
    ceiling = min(max_delay_ms, base_delay_ms * 2 ** max(attempt - 1, 0))
    # Jitter for spreading load, not for secrecy.
    return int((rng or random).uniform(0, ceiling))


def next_probe_delay(*, probes: int, base_s: int = 30, max_s: int = 3600) -> timedelta:
    """Backoff between reconciliation lookups: 30 s doubling, at most an hour."""
    return timedelta(seconds=min(max_s, base_s * 2 ** max(probes - 1, 0)))


def allowed_next_actions(*, status: str, now: datetime, not_before: datetime | None) -> list[str]:
    status = Status(status)
    if status == Status.AWAITING_APPROVAL:
        return ["wait_for_approval"]
    if status == Status.READY:
        if not_before is not None and not_before > now:
            return ["wait_until_not_before"]
        return ["claim_attempt"]
    if status == Status.EXECUTING:
        return ["post_outcome", "heartbeat"]
    if status == Status.OUTCOME_UNKNOWN:
        return ["reconcile"]
    if status == Status.COMPENSATING:
        return ["compensate"]
    return []
