"""The answers of the runner API as ``TypedDict``s: what each client method returns.

They describe the JSON bodies as they arrive (plain ``dict``s at run time: no parsing,
no copies), so that an editor completes ``operation["status"]`` and a type checker
catches ``operation["stauts"]``. Each is the component of the server's OpenAPI document
named in its docstring (``GET /api/schema/``, api.md): tests/client/test_answers.py
holds the keys, which of them are required, and their types equal to the served
document's, so a field the server adds or drops fails that test, not a runner.

Times are ISO 8601 strings, as sent. A key that is ``NotRequired`` may be absent; a
type with ``| None`` may be ``null``.
"""

# No ``from __future__ import annotations`` here: Python 3.11's TypedDict sees
# ``NotRequired`` only in annotations that are evaluated.
from typing import Any, Literal, NotRequired, TypedDict

# --- the values of the status fields (the server's state machines) ---------------------

OperationStatus = Literal[
    "awaiting_approval",
    "ready",
    "executing",
    "outcome_unknown",
    "compensating",
    "succeeded",
    "rejected",
    "failed_permanent",
    "budget_exhausted",
    "compensated",
    "cancelled",
    "superseded",
]
EffectClass = Literal["read_only", "idempotent", "deduplicated", "compensable", "irreversible"]
NextAction = Literal[
    "claim_attempt",
    "wait_for_approval",
    "wait_until_not_before",
    "post_outcome",
    "heartbeat",
    "reconcile",
    "compensate",
]
RunStatus = Literal["active", "cancelled", "expired"]
AttemptStatus = Literal[
    "executing", "succeeded", "failed", "unknown", "lease_expired", "superseded"
]
ApprovalStatus = Literal[
    "pending", "approved", "rejected", "expired", "revoked", "withdrawn", "superseded"
]
OutcomeKind = Literal["succeeded", "failed", "unknown"]


# --- tools and runs ---------------------------------------------------------------------


class Tool(TypedDict):
    """A contract version with the tool's name and which version is active (``ToolOut``):
    the answer of ``put_tool`` and ``get_tool``. The contract's blocks are as the runner
    put them, every default filled in."""

    name: str
    version: int
    active_version: int | None
    active: bool
    weakens: list[str]
    owner: str | None
    effect_class: EffectClass
    input_schema: dict[str, Any]
    retry: dict[str, Any]
    approval: dict[str, Any]
    reconcile: dict[str, Any]
    concurrency_key: str | None
    inbound: dict[str, Any] | None
    breaker: dict[str, Any] | None
    description: NotRequired[str]
    display: NotRequired[dict[str, Any]]
    created_at: str


class ToolPage(TypedDict):
    """A page of ``GET /tools`` (``ToolPageOut``)."""

    next: str | None
    previous: str | None
    results: list[Tool]


class Budgets(TypedDict, total=False):
    """A run's budgets (``BudgetsIn``): ``create_run(budgets=...)`` and ``Run["budgets"]``
    (which has every key, ``None`` for no limit)."""

    max_tool_calls: int | None
    max_turns: int | None
    deadline_s: int | None
    max_spend: float | None


class Usage(TypedDict):
    """What a run has used of its budgets (``UsageOut``)."""

    tool_calls: int
    turns: int
    spend: float
    elapsed_s: float


class Run(TypedDict):
    """A run (``RunOut``): the answer of ``create_run``, ``get_run`` and ``cancel_run``."""

    id: str
    external_id: str
    principal: str
    status: RunStatus
    budgets: Budgets
    usage: Usage
    deadline_at: str | None
    created_at: str
    ended_at: str | None


# --- approvals --------------------------------------------------------------------------


class Decision(TypedDict):
    """One person's decision on an approval request (``DecisionOut``)."""

    by: str
    decision: str
    comment: str
    at: str


class Grant(TypedDict):
    """The grant an approved request issued (``GrantOut``)."""

    id: str
    intent_hash: str
    expires_at: str
    revoked_at: str | None
    decided_by: list[str]


class Approval(TypedDict):
    """An approval request (``ApprovalOut``), as ``Operation["approval"]`` holds it."""

    id: str
    status: ApprovalStatus
    approvals_required: int
    reason: str
    decisions: list[Decision]
    created_at: str
    expires_at: str
    grant: Grant | None
    standing_grant: str | None


class ApprovalDetail(Approval):
    """An approval request with its operation and intent (``ApprovalDetailOut``): the
    answer of ``get_approval``."""

    operation: str
    intent_hash: str


# --- operations and attempts ------------------------------------------------------------

# "from" is a Python keyword: these two are spelt the functional way.
Edit = TypedDict("Edit", {"path": str, "from": Any, "to": Any})
Edit.__doc__ = """What an approver changed in the arguments (``EditOut``): a JSON pointer
into ``arguments``, the value before and after."""


class Operation(TypedDict):
    """An operation (``OperationOut``): the answer of ``get_operation``, ``reconcile``,
    ``compensate`` and each item of ``list_operations``."""

    id: str
    run: str
    tool: str
    tool_version: int
    effect_class: EffectClass
    call_id: str | None
    operation_key: str
    arguments: Any
    intent_hash: str
    principal: str
    idempotency_key: str
    status: OperationStatus
    attempts: int
    not_before: str | None
    lease_until: str | None
    deadline_at: str | None
    approval: Approval | None
    result: Any
    downstream_id: str | None
    error_code: str | None
    error_detail: str | None
    next_probe_at: str | None
    previous_operation: str | None
    superseded_by: str | None
    edits: list[Edit] | None
    allowed_next_actions: list[NextAction]
    created_at: str
    updated_at: str


class Attempt(TypedDict):
    """A claimed attempt (``AttemptOut``): the answer of ``claim``, and the inline claim of
    ``register(..., claim_lease_s=...)``. Pass ``idempotency_key`` to the provider."""

    attempt: int
    id: str
    idempotency_key: str
    lease_until: str
    status: AttemptStatus


class ClaimError(TypedDict):
    """Why the inline claim of a registration was refused (``ClaimErrorOut``): the
    refusal's problem ``code`` and ``detail`` and its other members."""

    code: str
    detail: str
    retry_after_ms: NotRequired[int]
    breaker: NotRequired[Literal["open", "half_open"]]


class RegisteredOperation(Operation):
    """The answer of ``register`` (``OperationCreatedOut``): the operation and, when a
    new one was registered with ``claim_lease_s``, the inline claim: ``attempt`` (``None``
    with ``claim_error`` when it was refused). A replay (200) has neither key."""

    attempt: NotRequired[Attempt | None]
    claim_error: NotRequired[ClaimError]


class Heartbeat(TypedDict):
    """The answer of ``heartbeat`` (``HeartbeatOut``): the lease as extended."""

    attempt: int
    lease_until: str


class ToolResult(TypedDict):
    """The envelope for the model (``ToolResultOut``): the answer of ``tool_result`` and
    the ``tool_result`` of an outcome's answer."""

    status: OperationStatus
    code: str | None
    logical_operation_id: str
    message: str
    allowed_next_actions: list[str]


class OutcomeAnswer(Operation):
    """The answer of ``post_outcome`` (``OutcomeAnswerOut``): the operation after
    classification, and the envelope for the model, so no further request is needed."""

    tool_result: ToolResult


class OperationPage(TypedDict):
    """A page of ``GET /operations`` (``OperationPageOut``); ``list_operations`` follows
    the cursor and yields the ``Operation``s."""

    next: str | None
    previous: str | None
    results: list[Operation]


Event = TypedDict(
    "Event",
    {
        "id": int,
        "seq": int,
        "kind": str,
        "from": str | None,
        "to": str | None,
        "actor": str,
        "at": str,
        "data": Any,
        "hash": str,
        "prev_hash": str,
    },
)
Event.__doc__ = """An event of an operation's ledger (``EventOut``): each item of the
answer of ``events``. ``from`` and ``to`` are the statuses of a transition."""


# --- what the client sends, and problems ---------------------------------------------------


class OutcomeBody(TypedDict):
    """An attempt's outcome (``OutcomeInRequest``): the ``outcome`` of ``post_outcome``."""

    kind: OutcomeKind
    result: NotRequired[Any]
    downstream_id: NotRequired[str]
    cost: NotRequired[float | None]
    code: NotRequired[str]
    detail: NotRequired[str]
    retry_after_ms: NotRequired[int]


class ProblemFieldError(TypedDict):
    """One validation error of a problem: a JSON pointer and a message."""

    path: str
    message: str


class Problem(TypedDict):
    """An RFC 9457 problem (``Problem``), as ``ProblemError.problem`` holds it, with the
    request's id (``ProblemError.request_id``). Refusals add members of their own
    (``operation``, ``successor``, ``breaker``, ``policy``...)."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    errors: NotRequired[list[ProblemFieldError]]
    retry_after_ms: NotRequired[int]
    request_id: str


# --- batches (api.md, Batches) --------------------------------------------------------------


class BatchRefusal(TypedDict):
    """A refused item of a batch answer: the status and problem the single call answers
    (``register_many`` and ``post_outcomes`` raise it as ``BatchItem.error``)."""

    status: int
    problem: Problem


class RegistrationBatchDone(TypedDict):
    """A registered item of a batch: 201 new, 200 the same operation again."""

    status: Literal[200, 201]
    operation: RegisteredOperation


class RegistrationBatch(TypedDict):
    """The answer of ``POST /operations`` with an array (``RegistrationBatchOut``):
    each item's answer, in order; ``register_many`` turns them into ``BatchItem``s."""

    results: list[RegistrationBatchDone | BatchRefusal]


class OutcomeBatchDone(TypedDict):
    """A recorded item of an outcome batch: the operation with its ``tool_result``."""

    status: Literal[200]
    operation: OutcomeAnswer


class OutcomeBatch(TypedDict):
    """The answer of ``POST /runs/{run_id}/outcomes`` (``OutcomeBatchOut``);
    ``post_outcomes`` turns it into ``BatchItem``s."""

    results: list[OutcomeBatchDone | BatchRefusal]


__all__ = [
    "Approval",
    "ApprovalDetail",
    "ApprovalStatus",
    "Attempt",
    "AttemptStatus",
    "BatchRefusal",
    "Budgets",
    "ClaimError",
    "Decision",
    "Edit",
    "EffectClass",
    "Event",
    "Grant",
    "Heartbeat",
    "NextAction",
    "Operation",
    "OperationPage",
    "OperationStatus",
    "OutcomeAnswer",
    "OutcomeBatch",
    "OutcomeBatchDone",
    "OutcomeBody",
    "OutcomeKind",
    "Problem",
    "ProblemFieldError",
    "RegisteredOperation",
    "RegistrationBatch",
    "RegistrationBatchDone",
    "Run",
    "RunStatus",
    "Tool",
    "ToolPage",
    "ToolResult",
    "Usage",
]
