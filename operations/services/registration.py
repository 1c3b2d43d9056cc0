"""Registering an intended side effect as an operation (api.md, Operations)."""

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from approvals.policy import evaluate as evaluate_policy
from approvals.policy import is_missing, resolve_pointer

from .. import access, errors
from ..arguments import freeze_arguments, validate_arguments
from ..canonical import canonical_json, intent_hash
from ..machine import Status
from ..models import (
    Attempt,
    Operation,
    Run,
    Runner,
    Tool,
    ToolVersion,
)
from ..selectors import run_get_for_runner
from .claims import claim_locked
from .core import (
    Actor,
    approval_request_open,
    event_append,
    outbox_enqueue,
    record,
)

TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


@dataclass
class Registration:
    operation: Operation
    created: bool
    attempt: Attempt | None = None
    claim_error: errors.DomainError | None = None


def _principal_user(principal: str) -> Any:
    """The person the principal names at registration (shown on the operation); who is
    barred from deciding is judged again at each decision (``access.barred_user_ids``)."""
    return get_user_model().objects.filter(pk__in=access.principal_user_ids(principal)).first()


def _freeze(version: ToolVersion, arguments: Any) -> Any:
    schema = version.contract["input_schema"]
    validate_arguments(schema, arguments)
    return freeze_arguments(
        schema,
        arguments,
        key=settings.SENSITIVE_ARGUMENT_KEY,
        key_id=settings.SENSITIVE_ARGUMENT_KEY_ID,
    )


def _replay(existing: Operation, *, tool_name: str, arguments: Any, principal: str) -> Operation:
    """The same operation_key again: the same operation if the intent is unchanged.

    The arguments are frozen under the contract version the operation was registered
    with, so a newer contract cannot make a faithful replay look like a new intent.
    """
    mismatch = errors.IntentMismatch(
        f"operation_key {existing.operation_key!r} is registered as {existing.id} with "
        "another tool, arguments or principal. Use a new operation_key for a new intent.",
        operation=existing.id,
    )
    if tool_name != existing.tool_id:
        raise mismatch
    try:
        frozen = _freeze(existing.tool_version, arguments)
    except errors.InvalidArguments as exc:
        raise mismatch from exc
    if intent_hash(tool=tool_name, arguments=frozen, principal=principal) != existing.intent_hash:
        raise mismatch
    return existing


def _concurrency_value(contract: dict[str, Any], frozen: Any) -> str | None:
    pointer = contract.get("concurrency_key")
    if not pointer:
        return None
    value = resolve_pointer(frozen, pointer)
    if is_missing(value):
        return None
    return hashlib.sha256(canonical_json(value)).hexdigest()


def _retry_target(*, runner: Runner, tool: Tool, operation_id: str) -> Operation:
    """The compensated operation a new registration retries (linked, never reused)."""
    previous = Operation.objects.filter(pk=operation_id, runner=runner).first()
    if previous is None:
        raise errors.NotFound(f"No operation {operation_id!r}.")
    if previous.tool_id != tool.name or previous.status != Status.COMPENSATED:
        raise errors.InvalidRequest(
            "retry_of names a compensated operation of the same tool.",
            errors=[{"path": "/retry_of", "message": f"{previous.id} is {previous.status}"}],
        )
    return previous


def _check_run_budgets(run: Run, *, turn: int | None, now: datetime) -> None:
    """Refuse a registration the run cannot afford. Raises before anything is written."""
    if run.status != Run.RunStatus.ACTIVE:
        raise errors.RunNotActive(f"Run {run.id} is {run.status}.")
    if run.deadline_at is not None and run.deadline_at <= now:
        raise errors.BudgetExhausted(f"Run {run.id} is past its deadline.", budget="deadline_s")
    if run.max_tool_calls is not None and run.tool_calls >= run.max_tool_calls:
        raise errors.BudgetExhausted(
            f"Run {run.id} has used all {run.max_tool_calls} tool calls.", budget="max_tool_calls"
        )
    if run.max_spend is not None and run.spend >= run.max_spend:
        raise errors.BudgetExhausted(
            f"Run {run.id} has spent its budget of {run.max_spend}.", budget="max_spend"
        )
    if run.max_turns is not None and turn is not None and turn > run.max_turns:
        raise errors.BudgetExhausted(
            f"Turn {turn} is past run {run.id}'s budget of {run.max_turns} turns.",
            budget="max_turns",
        )


def operation_register(
    *,
    runner: Runner,
    run_id: str,
    tool_name: str,
    operation_key: str,
    arguments: Any,
    call_id: str = "",
    turn: int | None = None,
    approval: dict[str, Any] | None = None,
    claim_lease_s: int | None = None,
    retry_of: str | None = None,
    traceparent: str = "",
) -> Registration:
    """Register one intended side effect, or return the one already registered.

    1. Resolve the run (the runner's own) and the tool's active contract version.
    2. A known ``operation_key`` answers the same operation when the intent is the same
       and ``intent_mismatch`` otherwise, before any budget is consulted: a runner that
       crashed after registering must get its operation back.
    3. Check invoke permission, validate and freeze the arguments, hash the intent.
    4. Under the run's row lock: check the run's budgets, insert the operation (the
       unique key settles races between runs), count the tool call, evaluate the
       approval policy, append the events, and claim the first attempt if asked.
    """

    run = run_get_for_runner(runner=runner, run_id=run_id)
    existing = (
        Operation.objects.select_related("tool_version")
        .filter(runner=runner, operation_key=operation_key)
        .first()
    )
    if existing is not None:
        return Registration(
            operation=_replay(
                existing, tool_name=tool_name, arguments=arguments, principal=run.principal
            ),
            created=False,
        )
    tool = Tool.objects.select_related("active_version").filter(pk=tool_name).first()
    if tool is None or tool.active_version is None:
        raise errors.UnknownTool(f"No tool named {tool_name!r} is registered.")
    previous = _retry_target(runner=runner, tool=tool, operation_id=retry_of) if retry_of else None
    if not access.runner_may_invoke(runner, tool):
        raise errors.ToolForbidden(f"Runner {runner.name} may not invoke {tool.name}.")
    version = tool.active_version
    frozen = _freeze(version, arguments)
    digest = intent_hash(tool=tool.name, arguments=frozen, principal=run.principal)
    contract = version.contract
    wants_approval = bool(approval and approval.get("require"))
    policy = evaluate_policy(
        contract["approval"],
        frozen,
        runner_requested=wants_approval,
        runner_reason=(approval or {}).get("reason"),
    )
    actor = Actor.of_runner(runner)

    with transaction.atomic(durable=True):
        run = Run.objects.select_for_update().get(pk=run.pk)
        now = timezone.now()
        _check_run_budgets(run, turn=turn, now=now)
        deadline_s = contract["retry"]["deadline_s"]
        op = Operation(
            runner=runner,
            run=run,
            tool=tool,
            tool_version=version,
            effect_class=contract["effect_class"],
            call_id=call_id,
            operation_key=operation_key,
            arguments=frozen,
            intent_hash=digest,
            principal=run.principal,
            principal_user=_principal_user(run.principal),
            status=Status.AWAITING_APPROVAL if policy.required else Status.READY,
            deadline_at=now + timedelta(seconds=deadline_s) if deadline_s else None,
            concurrency_value=_concurrency_value(contract, frozen),
            turn=turn,
            status_changed_at=now,
            previous=previous,
            traceparent=traceparent if TRACEPARENT.match(traceparent) else "",
        )
        try:
            with transaction.atomic():
                op.save(force_insert=True)
        except IntegrityError:
            existing = Operation.objects.select_related("tool_version").get(
                runner=runner, operation_key=operation_key
            )
            return Registration(
                operation=_replay(
                    existing, tool_name=tool_name, arguments=arguments, principal=run.principal
                ),
                created=False,
            )
        Run.objects.filter(pk=run.pk).update(
            tool_calls=F("tool_calls") + 1,
            turns=max(run.turns, turn or 0),
            updated_at=now,
        )
        event_append(
            stream=op.id,
            kind="registered",
            actor=actor,
            operation=op,
            to_status=op.status,
            data={
                "tool": tool.name,
                "tool_version": version.number,
                "operation_key": operation_key,
                "call_id": call_id,
                "intent_hash": digest,
                "turn": turn,
                "retry_of": previous.id if previous else None,
            },
            now=now,
        )
        if policy.required:
            request = approval_request_open(
                op,
                reason=policy.reason,
                context={
                    "matched_rules": policy.matched_rules,
                    "policy_mode": policy.mode,
                    "runner_reason": policy.runner_reason,
                },
                now=now,
            )
            record(
                op,
                kind="approval_requested",
                actor=actor,
                now=now,
                data={"approval": request.id, "reason": request.reason},
            )
        outbox_enqueue(op=op, event_type=f"operation.{op.status}", now=now)
        registration = Registration(operation=op, created=True)
        if claim_lease_s is not None and op.status == Status.READY:
            result = claim_locked(op, runner=runner, lease_s=claim_lease_s, now=now)
            if isinstance(result, errors.DomainError):
                registration.claim_error = result
            else:
                registration.attempt = result
    return registration
