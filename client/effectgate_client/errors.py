"""Typed exceptions for what Effectgate answers, and for not reaching it at all.

Every error answer of the runner API is an RFC 9457 problem with a stable ``code``
(api.md, Errors). ``problem_from_response`` turns one into the subclass registered for
its code, so a runner writes ``except RetryLater as exc: sleep(exc.retry_after_s)``
instead of comparing strings. A code this client does not know yet still raises
``ProblemError`` with the code and the whole body.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import httpx


class EffectgateError(Exception):
    """Base class of everything this package raises about Effectgate."""


class TransportError(EffectgateError):
    """Effectgate did not answer (connection refused, timeout, lost response, 5xx),
    and retrying the call as often as allowed did not help."""

    def __init__(self, message: str, *, method: str, path: str) -> None:
        super().__init__(message)
        self.method = method
        self.path = path


class OutcomeNotRecorded(TransportError):
    """The tool ran, but its outcome could not be posted: Effectgate was unreachable.

    Keep ``outcome`` and post it again with ``EffectgateClient.post_outcome`` when
    Effectgate answers: the same outcome is accepted again while the lease lasts and is
    recorded as evidence (a late outcome) after it. Never run the tool again instead:
    the lease will expire and Effectgate will ask what happened.
    """

    def __init__(
        self, message: str, *, operation_id: str, attempt: int, outcome: dict[str, Any]
    ) -> None:
        super().__init__(
            message,
            method="POST",
            path=f"/operations/{operation_id}/attempts/{attempt}/outcome",
        )
        self.operation_id = operation_id
        self.attempt = attempt
        self.outcome = outcome


class ContractNotActive(EffectgateError):
    """``put_tool`` stored the contract as a version that is not active.

    A new version that does not provably protect at least as much as the active one (it
    *weakens* it), or one the server holds for a person (``HOLD_NEW_TOOLS``: a new tool,
    a tool made irreversible), waits for a person to activate it; until then operations
    keep running under the active version, if there is one. ``answer`` is the whole
    answer of ``PUT /tools/{name}``; ``weakens`` its reasons. ``put_tool(...,
    inactive="warn")`` warns with ``ContractNotActiveWarning`` instead and returns the
    answer.
    """

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.tool = str(answer.get("name"))
        self.version = answer.get("version")
        self.active_version = answer.get("active_version")
        self.weakens: list[str] = list(answer.get("weakens") or [])
        super().__init__(inactive_contract_message(answer))


class ContractNotActiveWarning(UserWarning):
    """The warning of ``put_tool(..., inactive="warn")`` (see ``ContractNotActive``)."""


def inactive_contract_message(answer: dict[str, Any]) -> str:
    """What a stored-but-inactive contract version means, and what a person must do."""
    name, version, active = answer.get("name"), answer.get("version"), answer.get("active_version")
    now = (
        f"until then operations run under version {active}"
        if active is not None
        else "until then the tool has no active version and operations of it are refused"
    )
    weakens = answer.get("weakens") or []
    if not weakens:
        # An unchanged contract whose version a person has since replaced as the active one.
        return (
            f"Version {version} of {name} is stored but not active: a person made version "
            f"{active} the active one. A person allowed to activate the tool can activate "
            f"version {version} again on the tool's console page (Tools, {name}, Versions); "
            f"{now}."
        )
    # The reasons are the strength proof's (what the version weakens) or the server's
    # hold on new and irreversible tools (HOLD_NEW_TOOLS), worded by the server.
    return (
        f"Effectgate stored version {version} of {name} but did not activate it "
        f"({'; '.join(weakens)}). A person allowed to activate the tool, who does not own "
        "this runner, must review it and press Activate on the tool's console page (Tools, "
        f"{name}, Versions); {now}."
    )


class UnexpectedResponse(EffectgateError):
    """An answer that is neither success nor a problem document (e.g. a proxy's page)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:200]}")
        self.status = status
        self.text = text


class ProblemError(EffectgateError):
    """An RFC 9457 problem answered by Effectgate.

    ``code`` is the stable machine-readable reason; ``detail`` a sentence for people;
    ``errors`` the validation errors (JSON pointers and messages) when there are any;
    ``retry_after_ms`` how long Effectgate asks to wait, from the body or the
    ``Retry-After`` header.
    """

    code: str = "problem"
    registry: ClassVar[dict[str, type[ProblemError]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            ProblemError.registry[cls.code] = cls

    def __init__(self, problem: dict[str, Any], *, status: int, retry_after_ms: int | None = None):
        self.problem = problem
        self.status = status
        self.code = str(problem.get("code") or type(self).code)
        self.title = str(problem.get("title") or "")
        self.detail = str(problem.get("detail") or self.title or self.code)
        self.errors: list[dict[str, Any]] = list(problem.get("errors") or [])
        self.retry_after_ms = retry_after_ms
        # Set by the client: whether this answered a repeat of a call whose first answer
        # was lost (the first try may then have caused the refusal).
        self.repeated = False
        super().__init__(f"{status} {self.code}: {self.detail}")

    @property
    def retry_after_s(self) -> float | None:
        return None if self.retry_after_ms is None else self.retry_after_ms / 1000

    def for_model(self) -> dict[str, Any]:
        """A tool-result envelope for a refusal that left no operation to ask about
        (invalid arguments, a run out of budget): the same keys as
        ``GET /operations/{id}/tool-result``, so the model sees one shape."""
        return {
            "status": "refused",
            "code": self.code,
            "logical_operation_id": self.problem.get("operation"),
            "message": self.detail,
            "allowed_next_actions": [],
            **({"errors": self.errors} if self.errors else {}),
        }


# --- generic codes ----------------------------------------------------------------------


class NotAuthenticated(ProblemError):
    code = "not_authenticated"


class Forbidden(ProblemError):
    code = "forbidden"


class NotFound(ProblemError):
    code = "not_found"


class MethodNotAllowed(ProblemError):
    code = "method_not_allowed"


class MalformedJSON(ProblemError):
    code = "malformed_json"


class InvalidRequest(ProblemError):
    code = "invalid_request"


class PayloadTooLarge(ProblemError):
    code = "payload_too_large"


class UnsupportedMediaType(ProblemError):
    code = "unsupported_media_type"


class NumberOutOfRange(ProblemError):
    code = "number_out_of_range"


class RateLimited(ProblemError):
    code = "rate_limited"


class InternalError(ProblemError):
    code = "internal_error"


# --- tools, runs and registration -----------------------------------------------------


class InvalidContract(ProblemError):
    code = "invalid_contract"


class UnknownTool(ProblemError):
    code = "unknown_tool"


class ToolNotActive(ProblemError):
    """The tool has versions but none is active: a person must activate one (the
    ``detail`` names it) before operations of it are taken."""

    code = "tool_not_active"


class OperationKeyRequired(ProblemError):
    code = "operation_key_required"


class InvalidArguments(ProblemError):
    """The arguments do not match the tool's schema: the model should fix them."""

    code = "invalid_arguments"


class IntentMismatch(ProblemError):
    """The operation_key names an operation with another intent: a runner bug."""

    code = "intent_mismatch"


class RunNotActive(ProblemError):
    code = "run_not_active"


class UrlNotAllowed(ProblemError):
    code = "url_not_allowed"


# --- claim refusals, in the order Effectgate checks them (api.md, Attempts) ------------


class OperationClosed(ProblemError):
    code = "operation_closed"


class Superseded(ProblemError):
    """A person approved the operation with changes; ``successor`` is the one to run."""

    code = "superseded"

    @property
    def successor(self) -> str | None:
        value = self.problem.get("successor")
        return str(value) if value else None


class ReconciliationRequired(ProblemError):
    code = "reconciliation_required"


class CompensationRequired(ProblemError):
    code = "compensation_required"


class ApprovalRequired(ProblemError):
    code = "approval_required"


class AttemptInProgress(ProblemError):
    code = "attempt_in_progress"


class ToolForbidden(ProblemError):
    code = "tool_forbidden"


class GrantInvalid(ProblemError):
    code = "grant_invalid"


class RetryLater(ProblemError):
    code = "retry_later"


class BudgetExhausted(ProblemError):
    """Registration: the run's budget is spent. Claim: the operation's deadline passed."""

    code = "budget_exhausted"


class ConcurrencyConflict(ProblemError):
    code = "concurrency_conflict"


# --- attempts, reconciliation, compensation ------------------------------------------


class StaleAttempt(ProblemError):
    code = "stale_attempt"


class OutcomeConflict(ProblemError):
    code = "outcome_conflict"


class NotUnknown(ProblemError):
    code = "not_unknown"


class NotCompensating(ProblemError):
    code = "not_compensating"


def _retry_after_ms(body: dict[str, Any], response: httpx.Response) -> int | None:
    value = body.get("retry_after_ms")
    if isinstance(value, int | float) and value >= 0:
        return int(value)
    header = response.headers.get("Retry-After")
    if header is not None:
        try:
            return max(0, int(float(header) * 1000))
        except ValueError:
            return None  # an HTTP date: not something Effectgate sends
    return None


def problem_from_response(response: httpx.Response) -> EffectgateError:
    """The typed exception for an error answer."""
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return UnexpectedResponse(response.status_code, response.text)
    if not isinstance(body, dict) or "code" not in body:
        return UnexpectedResponse(response.status_code, response.text)
    cls = ProblemError.registry.get(str(body["code"]), ProblemError)
    return cls(body, status=response.status_code, retry_after_ms=_retry_after_ms(body, response))
