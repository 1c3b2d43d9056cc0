"""Typed domain errors with a stable ``code``.

Services raise these; one DRF exception handler (``operations.http.problems``) turns them
into RFC 9457 problem details, and the console turns them into messages. The ``code``
and HTTP status of each are part of the runner API contract (api.md).
"""

from approvals.errors import Refusal


class DomainError(Refusal):
    """An operations refusal; see ``approvals.errors.Refusal`` for the fields."""


class InvalidRequest(DomainError):
    code, status, title = "invalid_request", 400, "The request body is not valid"


class InvalidQuery(InvalidRequest):
    """A query parameter an endpoint does not take, or a value it cannot read: the code
    of a bad body, the title of the part of the request at fault."""

    title = "The query parameters are not valid"


class MalformedJSON(DomainError):
    code, status, title = "malformed_json", 400, "The request body is not acceptable JSON"


class PayloadTooLarge(DomainError):
    code, status, title = "payload_too_large", 413, "The request body is too large"


class NumberOutOfRange(DomainError):
    code, status, title = (
        "number_out_of_range",
        422,
        "A number is outside the range every JSON implementation represents exactly",
    )


class OperationKeyRequired(DomainError):
    code, status, title = "operation_key_required", 400, "operation_key is required"


class NotFound(DomainError):
    code, status, title = "not_found", 404, "Not found"


class UnknownTool(DomainError):
    code, status, title = "unknown_tool", 404, "No tool is registered under that name"


class ToolNotActive(DomainError):
    code, status, title = (
        "tool_not_active",
        409,
        "The tool has no active version: a person must activate one first",
    )


class InvalidContract(DomainError):
    code, status, title = "invalid_contract", 422, "The tool contract is not valid"


class InvalidArguments(DomainError):
    code, status, title = "invalid_arguments", 422, "The arguments do not match the tool's schema"


class IntentMismatch(DomainError):
    code, status, title = (
        "intent_mismatch",
        422,
        "This operation_key is already registered with a different intent",
    )


class RunNotActive(DomainError):
    code, status, title = "run_not_active", 409, "The run is not active"


class BudgetExhausted(DomainError):
    code, status, title = "budget_exhausted", 409, "The budget is exhausted"


class ToolForbidden(DomainError):
    code, status, title = "tool_forbidden", 403, "This runner may not invoke this tool"


class ForbiddenByPolicy(DomainError):
    """A policy people wrote refuses the registration (docs/policies.md); the problem
    names the policy (``policy``) and says its ``@message``."""

    code, status, title = "forbidden_by_policy", 403, "A policy forbids this operation"


class InvalidPrincipal(DomainError):
    code, status, title = "invalid_principal", 400, "The principal is not a usable identity"


class ToolNotOwned(DomainError):
    code, status, title = "tool_not_owned", 403, "Another runner owns this tool"


class ScopeForbidden(DomainError):
    code, status, title = "forbidden", 403, "This token's scope does not allow the request"


class OperationClosed(DomainError):
    code, status, title = "operation_closed", 409, "The operation has ended"


class Superseded(DomainError):
    """A person approved an edited copy: ``successor`` is the operation to run."""

    code, status, title = (
        "superseded",
        409,
        "A person approved this operation with changes; run its successor instead",
    )


class ReconciliationRequired(DomainError):
    code, status, title = (
        "reconciliation_required",
        409,
        "The outcome of an earlier attempt is unknown; reconcile it before anything else",
    )


class CompensationRequired(DomainError):
    code, status, title = (
        "compensation_required",
        409,
        "The operation is being compensated; post the undo's outcome",
    )


class ApprovalRequired(DomainError):
    code, status, title = "approval_required", 409, "The operation is waiting for approval"


class AttemptInProgress(DomainError):
    code, status, title = "attempt_in_progress", 409, "An attempt holds a live lease"


class GrantInvalid(DomainError):
    code, status, title = (
        "grant_invalid",
        403,
        "The approval grant is no longer valid; a new approval was requested",
    )


class RetryLater(DomainError):
    code, status, title = "retry_later", 409, "Too early: wait before the next attempt"


class ConcurrencyConflict(DomainError):
    code, status, title = (
        "concurrency_conflict",
        409,
        "Another operation on the same resource has an unresolved effect",
    )


class StaleAttempt(DomainError):
    code, status, title = "stale_attempt", 409, "The attempt's lease has ended"


class OutcomeConflict(DomainError):
    code, status, title = (
        "outcome_conflict",
        409,
        "The attempt already has a different outcome",
    )


class NotUnknown(DomainError):
    code, status, title = "not_unknown", 409, "The operation's outcome is not unknown"


class NotCompensating(DomainError):
    code, status, title = "not_compensating", 409, "The operation is not being compensated"


class InvalidTransition(DomainError):
    """A programming error or a lost race: the state machine refuses the move."""

    code, status, title = "invalid_transition", 409, "The operation cannot make that transition"


class UrlNotAllowed(DomainError):
    code, status, title = "url_not_allowed", 422, "The URL's host is not an allowed target"


class InvalidSignature(DomainError):
    code, status, title = "invalid_signature", 401, "The event's signature does not verify"


class StaleEvent(DomainError):
    code, status, title = (
        "stale_event",
        400,
        "The event's timestamp is more than five minutes from now",
    )


class RateLimited(DomainError):
    """More requests with one token than ``THROTTLE_RUNNER_RATE`` allows (429, with
    ``retry_after_ms`` and ``Retry-After``: when the count starts again)."""

    code, status, title = "rate_limited", 429, "Too many requests"


class NotSealed(DomainError):
    """The event is not in the transparency log at the size asked for: the sealer appends
    committed events within seconds (``AUDIT_SEAL_EVERY_S``)."""

    code, status, title = "not_sealed", 409, "The event is not in the log at that size yet"
