"""Typed exceptions for what Effectgate answers, and for not reaching it at all.

Every error answer of the runner API is an RFC 9457 problem with a stable ``code``
(api.md, Errors). ``problem_from_response`` turns one into the subclass registered for
its code, so a runner writes ``except RetryLater as exc: sleep(exc.retry_after_s)``
instead of comparing strings. A code this client does not know yet still raises
``ProblemError`` with the code and the whole body. There is one subclass for every code
the server can emit (``ProblemError.registry``; tests/client/test_errors.py holds it
equal to the server's list).

Every error carries ``request_id``: the id Effectgate gave the request (the problem
body's ``request_id``, else the answer's ``X-Request-Id`` header), the one its logs
name, so that a line of a runner's log finds the server's. It is in ``str()`` and
``repr()`` of the error. ``None`` when no answer came back.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import httpx

# The header Effectgate names every answer with (and keeps, when the caller sent a
# valid one).
REQUEST_ID_HEADER = "X-Request-Id"
# The ids Effectgate sends: its own (``req_`` and 26 characters) or a caller's that it
# kept. Anything else (a proxy's page, a body that is not Effectgate's) is not kept, so
# that no error message carries text of unbounded size or with line breaks.
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def _clean_request_id(value: object) -> str | None:
    if isinstance(value, str) and _REQUEST_ID.fullmatch(value):
        return value
    return None


def request_id_of(response: httpx.Response) -> str | None:
    """The ``X-Request-Id`` of an answer, or None when it has none (or not a sane one)."""
    return _clean_request_id(response.headers.get(REQUEST_ID_HEADER))


def _with_request_id(message: str, request_id: str | None) -> str:
    return f"{message} [request {request_id}]" if request_id else message


class EffectgateError(Exception):
    """Base class of everything this package raises about Effectgate."""

    # The id of the request, from Effectgate's answer (``X-Request-Id``); None when it
    # did not answer, or for errors that are no answer of Effectgate.
    request_id: str | None = None


class TransportError(EffectgateError):
    """Effectgate did not answer (connection refused, timeout, lost response, 5xx),
    and retrying the call as often as allowed did not help.

    ``request_id`` is the ``X-Request-Id`` of the last answer when there was one (a proxy
    in front of Effectgate may send none), else None.
    """

    def __init__(
        self, message: str, *, method: str, path: str, request_id: str | None = None
    ) -> None:
        self.message = message
        self.method = method
        self.path = path
        self.request_id = _clean_request_id(request_id)
        super().__init__(_with_request_id(message, self.request_id))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.message!r}, method={self.method!r}, "
            f"path={self.path!r}, request_id={self.request_id!r})"
        )


class OutcomeNotRecorded(TransportError):
    """The tool ran, but its outcome could not be posted: Effectgate was unreachable,
    or still answered 429 or a 5xx after every repeat (``request_id``: the last answer's).

    Keep ``outcome`` and post it again with ``EffectgateClient.post_outcome`` when
    Effectgate answers: the same outcome is accepted again while the lease lasts and is
    recorded as evidence (a late outcome) after it. Never run the tool again instead:
    the lease will expire and Effectgate will ask what happened.
    """

    def __init__(
        self,
        message: str,
        *,
        operation_id: str,
        attempt: int,
        outcome: dict[str, Any],
        request_id: str | None = None,
    ) -> None:
        super().__init__(
            message,
            method="POST",
            path=f"/operations/{operation_id}/attempts/{attempt}/outcome",
            request_id=request_id,
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

    def __init__(self, answer: Mapping[str, Any]) -> None:
        self.answer = dict(answer)
        self.tool = str(answer.get("name"))
        self.version = answer.get("version")
        self.active_version = answer.get("active_version")
        self.weakens: list[str] = list(answer.get("weakens") or [])
        super().__init__(inactive_contract_message(answer))


class ContractNotActiveWarning(UserWarning):
    """The warning of ``put_tool(..., inactive="warn")`` (see ``ContractNotActive``)."""


def inactive_contract_message(answer: Mapping[str, Any]) -> str:
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

    def __init__(self, status: int, text: str, *, request_id: str | None = None) -> None:
        self.status = status
        self.text = text
        self.request_id = _clean_request_id(request_id)
        super().__init__(_with_request_id(f"HTTP {status}: {text[:200]}", self.request_id))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, text={self.text[:200]!r}, "
            f"request_id={self.request_id!r})"
        )


class ProblemError(EffectgateError):
    """An RFC 9457 problem answered by Effectgate.

    ``code`` is the stable machine-readable reason; ``detail`` a sentence for people;
    ``errors`` the validation errors (JSON pointers and messages) when there are any;
    ``retry_after_ms`` how long Effectgate asks to wait, from the body or the
    ``Retry-After`` header; ``request_id`` the request's id (the body's ``request_id``,
    else the ``X-Request-Id`` header).

    Each subclass names its ``code`` and the HTTP status the server answers it with
    (``http_status``); ``registry`` maps every code to its class.
    """

    code: str = "problem"
    http_status: ClassVar[int | None] = None
    registry: ClassVar[dict[str, type[ProblemError]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            ProblemError.registry[cls.code] = cls

    def __init__(
        self,
        problem: dict[str, Any],
        *,
        status: int,
        retry_after_ms: int | None = None,
        request_id: str | None = None,
    ):
        self.problem = problem
        self.status = status
        self.code = str(problem.get("code") or type(self).code)
        self.title = str(problem.get("title") or "")
        self.detail = str(problem.get("detail") or self.title or self.code)
        self.errors: list[dict[str, Any]] = list(problem.get("errors") or [])
        self.retry_after_ms = retry_after_ms
        self.request_id = _clean_request_id(problem.get("request_id")) or _clean_request_id(
            request_id
        )
        # Set by the client: whether this answered a repeat of a call whose first answer
        # was lost (the first try may then have caused the refusal).
        self.repeated = False
        super().__init__(_with_request_id(f"{status} {self.code}: {self.detail}", self.request_id))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, code={self.code!r}, "
            f"detail={self.detail!r}, request_id={self.request_id!r})"
        )

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


# --- generic codes: the token, its scope and rate, the body, the server ---------------


class NotAuthenticated(ProblemError):
    code, http_status = "not_authenticated", 401


class Forbidden(ProblemError):
    """The token's scope does not allow the request (or, for people, the permission)."""

    code, http_status = "forbidden", 403


class NotFound(ProblemError):
    code, http_status = "not_found", 404


class MethodNotAllowed(ProblemError):
    code, http_status = "method_not_allowed", 405


class NotAcceptable(ProblemError):
    """The request's ``Accept`` header excludes JSON (this client always accepts it)."""

    code, http_status = "not_acceptable", 406


class MalformedJSON(ProblemError):
    code, http_status = "malformed_json", 400


class InvalidRequest(ProblemError):
    code, http_status = "invalid_request", 400


class PayloadTooLarge(ProblemError):
    code, http_status = "payload_too_large", 413


class UnsupportedMediaType(ProblemError):
    code, http_status = "unsupported_media_type", 415


class NumberOutOfRange(ProblemError):
    code, http_status = "number_out_of_range", 422


class RateLimited(ProblemError):
    code, http_status = "rate_limited", 429


class InternalError(ProblemError):
    code, http_status = "internal_error", 500


# --- tools, runs and registration -----------------------------------------------------


class InvalidContract(ProblemError):
    code, http_status = "invalid_contract", 422


class UnknownTool(ProblemError):
    code, http_status = "unknown_tool", 404


class ToolNotActive(ProblemError):
    """The tool has versions but none is active: a person must activate one (the
    ``detail`` names it) before operations of it are taken."""

    code, http_status = "tool_not_active", 409


class ToolNotOwned(ProblemError):
    """Another runner registered the tool first and owns it: only its owner changes the
    contract or allows other runners. Use another name, or ask the owner."""

    code, http_status = "tool_not_owned", 403


class InvalidPrincipal(ProblemError):
    """``create_run``: the ``principal`` holds characters that hide (zero-width,
    bidirectional controls, line breaks...); the ``detail`` says which. Not worth a
    retry: send the identity as it is written."""

    code, http_status = "invalid_principal", 400


class OperationKeyRequired(ProblemError):
    code, http_status = "operation_key_required", 400


class InvalidArguments(ProblemError):
    """The arguments do not match the tool's schema: the model should fix them."""

    code, http_status = "invalid_arguments", 422


class IntentMismatch(ProblemError):
    """The operation_key names an operation with another intent: a runner bug."""

    code, http_status = "intent_mismatch", 422


class RunNotActive(ProblemError):
    code, http_status = "run_not_active", 409


class ForbiddenByPolicy(ProblemError):
    """A policy people wrote refuses the registration (docs/policies.md); ``policy``
    names it and ``detail`` says its message."""

    code, http_status = "forbidden_by_policy", 403

    @property
    def policy(self) -> str | None:
        value = self.problem.get("policy")
        return str(value) if value else None


class UrlNotAllowed(ProblemError):
    code, http_status = "url_not_allowed", 422


# --- claim refusals, in the order Effectgate checks them (api.md, Attempts) ------------


class OperationClosed(ProblemError):
    code, http_status = "operation_closed", 409


class Superseded(ProblemError):
    """A person approved the operation with changes; ``successor`` is the one to run."""

    code, http_status = "superseded", 409

    @property
    def successor(self) -> str | None:
        value = self.problem.get("successor")
        return str(value) if value else None


class ReconciliationRequired(ProblemError):
    code, http_status = "reconciliation_required", 409


class CompensationRequired(ProblemError):
    code, http_status = "compensation_required", 409


class ApprovalRequired(ProblemError):
    code, http_status = "approval_required", 409


class AttemptInProgress(ProblemError):
    code, http_status = "attempt_in_progress", 409


class ToolForbidden(ProblemError):
    code, http_status = "tool_forbidden", 403


class GrantInvalid(ProblemError):
    code, http_status = "grant_invalid", 403


class RetryLater(ProblemError):
    code, http_status = "retry_later", 409


class BudgetExhausted(ProblemError):
    """Registration: the run's budget is spent. Claim: the operation's deadline passed."""

    code, http_status = "budget_exhausted", 409


class ConcurrencyConflict(ProblemError):
    code, http_status = "concurrency_conflict", 409


# --- attempts, reconciliation, compensation ------------------------------------------


class StaleAttempt(ProblemError):
    code, http_status = "stale_attempt", 409


class OutcomeConflict(ProblemError):
    code, http_status = "outcome_conflict", 409


class NotUnknown(ProblemError):
    code, http_status = "not_unknown", 409


class NotCompensating(ProblemError):
    code, http_status = "not_compensating", 409


class InvalidTransition(ProblemError):
    """The state machine refused a move: a lost race with another change of the same
    operation (read it again), or a bug."""

    code, http_status = "invalid_transition", 409


# --- inbound provider events, the transparency log, people's actions ------------------


class InvalidSignature(ProblemError):
    """``POST /inbound/...``: the provider event's signature does not verify."""

    code, http_status = "invalid_signature", 401


class StaleEvent(ProblemError):
    """``POST /inbound/...``: the event's timestamp is more than five minutes off."""

    code, http_status = "stale_event", 400


class NotSealed(ProblemError):
    """The event is not in the transparency log at the size asked for yet: the sealer
    appends committed events within seconds; ask again."""

    code, http_status = "not_sealed", 409


class DecisionRefused(ProblemError):
    """A decision that separation of duties or a closed request refuses (the console's;
    a runner does not decide)."""

    code, http_status = "decision_refused", 409


class PolicyInvalid(ProblemError):
    """A policy text that does not parse or validate (the console's and ``manage.py
    policy``'s; a runner does not write policies)."""

    code, http_status = "policy_invalid", 422


def _retry_after_ms(body: dict[str, Any], response: httpx.Response) -> int | None:
    value = body.get("retry_after_ms")
    if isinstance(value, int | float) and value >= 0 and math.isfinite(value):
        return int(value)
    header = response.headers.get("Retry-After")
    if header is not None:
        try:
            return max(0, int(float(header) * 1000))
        except (ValueError, OverflowError):
            return None  # an HTTP date (not something Effectgate sends), or no number
    return None


def problem_from_response(response: httpx.Response) -> EffectgateError:
    """The typed exception for an error answer, with the answer's request id."""
    request_id = request_id_of(response)
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return UnexpectedResponse(response.status_code, response.text, request_id=request_id)
    if not isinstance(body, dict) or "code" not in body:
        return UnexpectedResponse(response.status_code, response.text, request_id=request_id)
    return problem_from_body(
        body,
        status=response.status_code,
        retry_after_ms=_retry_after_ms(body, response),
        request_id=request_id,
    )


def problem_from_body(
    body: dict[str, Any],
    *,
    status: int,
    retry_after_ms: int | None = None,
    request_id: str | None = None,
) -> ProblemError:
    """The typed exception for a problem document: the class registered for its
    ``code`` (``ProblemError`` for a code this client does not know). A batch answers
    each refused item with such a document (api.md, Batches)."""
    if retry_after_ms is None:
        value = body.get("retry_after_ms")
        if isinstance(value, int | float) and value >= 0 and math.isfinite(value):
            retry_after_ms = int(value)
    cls = ProblemError.registry.get(str(body.get("code")), ProblemError)
    return cls(body, status=status, retry_after_ms=retry_after_ms, request_id=request_id)


_E = TypeVar("_E", bound=Exception)


def own_copy(exc: _E) -> _E:
    """A copy of ``exc`` (its class, attributes and cause, not its traceback): each
    caller that meets one request's failure gets an exception of its own."""
    try:
        copy = type(exc).__new__(type(exc), *exc.args)
        copy.__dict__.update(exc.__dict__)
    except (TypeError, AttributeError):  # an exception that cannot be copied so
        return exc
    copy.__cause__, copy.__context__ = exc.__cause__, exc.__context__
    return copy
