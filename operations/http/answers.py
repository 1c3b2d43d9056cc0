"""What the runner API's hot endpoints answer, once the request is authenticated,
throttled and parsed: shared by the DRF views (``views``) and the lean views (``hot``),
which differ only in how they get there and how a body is validated (``Validate``:
the serializer itself, or ``compiled.Compiled`` built from it)."""

from collections.abc import Callable
from typing import Any

from approvals.errors import Refusal

from .. import payloads, selectors, services
from ..errors import InvalidRequest, OperationKeyRequired
from ..models import Runner
from .serializers import (
    HeartbeatOut,
    LeaseIn,
    OperationIn,
    OutcomeIn,
    OutcomeItemIn,
    StrictSerializer,
    tool_result,
)

Validate = Callable[[type[StrictSerializer], Any], dict[str, Any]]
# Turns an exception into its problem body, as the single call would answer it.
Problem = Callable[[Exception], dict[str, Any]]
Answer = tuple[dict[str, Any], int]


def _operation_key_required(raw: Any) -> None:
    if isinstance(raw, dict) and not raw.get("operation_key"):
        raise OperationKeyRequired(
            "Send operation_key: your stable name for this intended effect, made before "
            "the first attempt by your deterministic layer."
        )


def _registration_arguments(raw: Any, validate: Validate) -> dict[str, Any]:
    """``operation_register``'s arguments (but the runner and traceparent) from a body."""
    _operation_key_required(raw)
    data = validate(OperationIn, raw)
    return {
        "run_id": data["run"],
        "tool_name": data["tool"],
        "operation_key": data["operation_key"],
        "arguments": data["arguments"],
        "call_id": data.get("call_id", ""),
        "turn": data.get("turn"),
        "approval": data.get("approval"),
        "claim_lease_s": data["claim"]["lease_s"] if "claim" in data else None,
        "retry_of": data.get("retry_of"),
    }


def _registration_answer(registration: services.Registration, *, claimed: bool) -> Answer:
    op = registration.operation
    # ``fresh``: what the request's own transaction wrote is rendered as it is.
    body = payloads.operation(op if registration.created else selectors.operation_refresh(op))
    if registration.created and claimed:
        attempt = registration.attempt
        body["attempt"] = payloads.attempt(attempt) if attempt is not None else None
        error = registration.claim_error
        if error is not None:
            body["claim_error"] = {"code": error.code, "detail": error.detail, **error.extra}
    return body, 201 if registration.created else 200


def register(*, runner: Runner, raw: Any, validate: Validate, traceparent: str) -> Answer:
    arguments = _registration_arguments(raw, validate)
    registration = services.operation_register(runner=runner, traceparent=traceparent, **arguments)
    return _registration_answer(registration, claimed=arguments["claim_lease_s"] is not None)


def batch_size_check(raw: list[Any]) -> None:
    """A batch of 1 to ``BATCH_MAX_ITEMS`` items, or the whole request is refused."""
    if not 1 <= len(raw) <= services.BATCH_MAX_ITEMS:
        must = f"A batch holds 1 to {services.BATCH_MAX_ITEMS} items."
        raise InvalidRequest(
            f"{must} This one holds {len(raw)}.", errors=[{"path": "/", "message": must}]
        )


def _item(answer: Answer) -> dict[str, Any]:
    body, status = answer
    return {"status": status, "operation": body}


def _refused(problem_of: Problem, exc: Exception) -> dict[str, Any]:
    body = problem_of(exc)
    return {"status": body["status"], "problem": body}


def register_batch(
    *, runner: Runner, raw: list[Any], validate: Validate, traceparent: str, problem_of: Problem
) -> Answer:
    """Each item validated as the single call's body; the valid ones registered in
    order (``services.operations_register_batch``); answers in the request's order."""
    batch_size_check(raw)
    results: list[dict[str, Any] | None] = [None] * len(raw)
    valid: list[tuple[int, dict[str, Any]]] = []
    for index, item in enumerate(raw):
        try:
            valid.append((index, _registration_arguments(item, validate)))
        except Exception as exc:
            results[index] = _refused(problem_of, exc)
    answers = services.operations_register_batch(
        runner=runner, items=[arguments for _, arguments in valid], traceparent=traceparent
    )
    for (index, arguments), answer in zip(valid, answers, strict=True):
        if isinstance(answer, Refusal):
            results[index] = _refused(problem_of, answer)
        else:
            claimed = arguments["claim_lease_s"] is not None
            try:
                results[index] = _item(_registration_answer(answer, claimed=claimed))
            except Exception as exc:
                results[index] = _refused(problem_of, exc)
    return {"results": results}, 200


def claim(*, runner: Runner, operation_id: str, raw: Any, validate: Validate) -> Answer:
    op = selectors.operation_get_for_runner(runner=runner, operation_id=operation_id)
    data = validate(LeaseIn, raw)
    attempt = services.attempt_claim(operation=op, runner=runner, lease_s=data["lease_s"])
    return payloads.attempt(attempt), 201


def heartbeat(
    *, runner: Runner, operation_id: str, number: int, raw: Any, validate: Validate
) -> Answer:
    op = selectors.operation_get_for_runner(runner=runner, operation_id=operation_id)
    data = validate(LeaseIn, raw)
    attempt = services.attempt_heartbeat(
        operation=op, number=number, lease_s=data["lease_s"], runner=runner
    )
    return {"attempt": attempt.number, "lease_until": payloads.iso(attempt.lease_until)}, 200


# What ``heartbeat`` answers is ``HeartbeatOut``'s shape (the OpenAPI document's).
assert set(HeartbeatOut().fields) == {"attempt", "lease_until"}


def _outcome_body(op: Any) -> dict[str, Any]:
    return {**payloads.operation(op), "tool_result": tool_result(op)}


def outcome(
    *, runner: Runner, operation_id: str, number: int, raw: Any, validate: Validate
) -> Answer:
    data = validate(OutcomeIn, raw)
    op = services.attempt_record_outcome(
        operation_id=operation_id, number=number, body=dict(data), runner=runner
    )
    return _outcome_body(op), 200


def outcome_batch(
    *, runner: Runner, run_id: str, raw: Any, validate: Validate, problem_of: Problem
) -> Answer:
    """Outcomes of attempts of the run ``run_id``, each item validated as the single
    call's body with its ``operation`` and ``attempt``, recorded in order
    (``services.attempts_record_outcome_batch``)."""
    if not isinstance(raw, list):
        raise InvalidRequest(
            "Send a JSON array of outcomes, each with its operation and attempt.",
            errors=[{"path": "/", "message": "Must be an array."}],
        )
    batch_size_check(raw)
    selectors.run_get_for_runner(runner=runner, run_id=run_id)
    results: list[dict[str, Any] | None] = [None] * len(raw)
    valid: list[tuple[int, services.OutcomeItem]] = []
    for index, item in enumerate(raw):
        try:
            data = validate(OutcomeItemIn, item)
        except Exception as exc:
            results[index] = _refused(problem_of, exc)
            continue
        operation_id, number = data.pop("operation"), data.pop("attempt")
        valid.append((index, services.OutcomeItem(operation_id, number, data)))
    answers = services.attempts_record_outcome_batch(
        runner=runner, run_id=run_id, items=[item for _, item in valid]
    )
    for (index, _), answer in zip(valid, answers, strict=True):
        if isinstance(answer, Refusal):
            results[index] = _refused(problem_of, answer)
        else:
            results[index] = {"status": 200, "operation": _outcome_body(answer)}
    return {"results": results}, 200
