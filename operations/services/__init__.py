"""Every write of the operation ledger, and the only door to an operation's state.

One module per concern; this package re-exports the public names, so callers write
``from operations import services`` and ``services.attempt_claim(...)``.

Rules (docs/architecture.md says where each lives):

- Each public function takes keyword-only arguments, including who acts, and runs in
  one ``transaction.atomic`` (``durable=True`` on the runner's hot path: registration,
  claim, outcome, so "committed before it answers" is enforced, not assumed). It locks
  the row it changes (``core.lock``; under SQLite every transaction takes the write lock
  at BEGIN instead), moves it with ``core.transition`` (checked against
  ``machine.TRANSITIONS``) and appends the event in the same transaction.
- A refusal that must leave a trace (an expired lease handled during a claim, a grant
  found invalid) commits the trace and then raises (``core.raise_after_commit``): the
  private ``*_locked`` helpers return the error instead of raising it inside the
  transaction.
- "May this person or runner do X" is asked of ``operations.access``, never decided here.
- No HTTP call happens inside a transaction; this package imports neither tasks nor the
  HTTP layer (import-linter contracts in pyproject.toml).
"""

from .batches import (
    BATCH_MAX_ITEMS,
    OutcomeItem,
    attempts_record_outcome_batch,
    operations_register_batch,
)
from .breaker import tool_breaker_set
from .claims import attempt_claim
from .core import GENESIS_HASH, Actor, event_append, event_hash, outbox_enqueue
from .decisions import approval_approve_and_issue, approval_decide, approval_revoke
from .deliveries import delivery_begin, delivery_claim, delivery_finish, delivery_prune
from .endpoints import (
    webhook_endpoint_create,
    webhook_endpoint_delete,
    webhook_endpoint_disable,
    webhook_endpoint_rotate,
    webhook_redeliver,
)
from .inbound import InboundReceipt, inbound_apply, inbound_receive, tool_inbound_secret_set
from .notices import (
    notice_claim,
    notice_delivery_claim,
    notice_delivery_finish,
    notice_fan_out,
    notices_prune,
    reminders_due,
)
from .outcomes import attempt_heartbeat, attempt_record_outcome
from .preferences import preference_set, route_set, slack_channel_clean
from .reconciliation import (
    operation_compensate,
    operation_compensated_by_hand,
    operation_note_add,
    operation_probe_failed,
    operation_reconcile,
    operation_resolution_confirm,
    operation_resolve,
)
from .registration import Registration, operation_register
from .runners import (
    TOKEN_PREFIX,
    runner_create,
    runner_update,
    token_authenticate,
    token_create,
    token_issue_by_user,
    token_revoke,
    token_revoke_by_user,
)
from .runs import run_cancel, run_create
from .saved_views import saved_view_delete, saved_view_save
from .seal import SealReport, log_seal, log_seal_due
from .slack import (
    slack_decision_refused,
    slack_interaction_answered,
    slack_interaction_first,
    slack_interaction_key,
    slack_link,
    slack_message_record,
    slack_message_updated,
    slack_request_refused,
    slack_unlink,
)
from .standing import (
    StandingTerms,
    standing_grant_issue,
    standing_grant_revoke,
    standing_grant_sign,
)
from .sweep import (
    SweepReport,
    approval_escalate_due,
    approval_expire_due,
    inbound_apply_pending,
    lease_expire_due,
    operation_deadline_due,
    run_expire_due,
    standing_grants_expire_due,
    sweep,
)
from .tools import (
    ToolRegistration,
    tool_invoker_set,
    tool_permissions_set,
    tool_register,
    tool_transfer,
    tool_version_activate,
)

__all__ = [
    "BATCH_MAX_ITEMS",
    "GENESIS_HASH",
    "TOKEN_PREFIX",
    "Actor",
    "InboundReceipt",
    "OutcomeItem",
    "Registration",
    "SealReport",
    "StandingTerms",
    "SweepReport",
    "ToolRegistration",
    "approval_approve_and_issue",
    "approval_decide",
    "approval_escalate_due",
    "approval_expire_due",
    "approval_revoke",
    "attempt_claim",
    "attempt_heartbeat",
    "attempt_record_outcome",
    "attempts_record_outcome_batch",
    "delivery_begin",
    "delivery_claim",
    "delivery_finish",
    "delivery_prune",
    "event_append",
    "event_hash",
    "inbound_apply",
    "inbound_apply_pending",
    "inbound_receive",
    "lease_expire_due",
    "log_seal",
    "log_seal_due",
    "notice_claim",
    "notice_delivery_claim",
    "notice_delivery_finish",
    "notice_fan_out",
    "notices_prune",
    "operation_compensate",
    "operation_compensated_by_hand",
    "operation_deadline_due",
    "operation_note_add",
    "operation_probe_failed",
    "operation_reconcile",
    "operation_register",
    "operation_resolution_confirm",
    "operation_resolve",
    "operations_register_batch",
    "outbox_enqueue",
    "preference_set",
    "reminders_due",
    "route_set",
    "run_cancel",
    "run_create",
    "run_expire_due",
    "runner_create",
    "runner_update",
    "saved_view_delete",
    "saved_view_save",
    "slack_channel_clean",
    "slack_decision_refused",
    "slack_interaction_answered",
    "slack_interaction_first",
    "slack_interaction_key",
    "slack_link",
    "slack_message_record",
    "slack_message_updated",
    "slack_request_refused",
    "slack_unlink",
    "standing_grant_issue",
    "standing_grant_revoke",
    "standing_grant_sign",
    "standing_grants_expire_due",
    "sweep",
    "token_authenticate",
    "token_create",
    "token_issue_by_user",
    "token_revoke",
    "token_revoke_by_user",
    "tool_breaker_set",
    "tool_inbound_secret_set",
    "tool_invoker_set",
    "tool_permissions_set",
    "tool_register",
    "tool_transfer",
    "tool_version_activate",
    "webhook_endpoint_create",
    "webhook_endpoint_delete",
    "webhook_endpoint_disable",
    "webhook_endpoint_rotate",
    "webhook_redeliver",
]
