"""What a registration means, worked out before its transaction (no lock is held while
arguments are validated and hashed): the run and the tool read in one statement, the
refusals in api.md's order, the frozen arguments and the intent hash, the contract's
approval rule and people's policies, and the run's budgets as a refusal says them.
``registration`` writes what this decides; ``batches`` decides it for each item of a
batch."""

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection

from approvals.policy import evaluate as evaluate_policy

from .. import access, errors
from ..canonical import intent_hash
from ..contracts.arguments import freeze_arguments, validate_arguments
from ..machine import Status
from ..models import (
    Operation,
    Run,
    Runner,
    Tool,
    ToolVersion,
)
from ..policies import cedar
from ..policies.cedar import Requirement
from ..policies.windows import Counted
from .judging import registration_judge
from .policies import reason_of
from .shadow import Observation
from .windows import windows_judge_locked

_USERS = get_user_model()._meta.db_table
_USERNAME = get_user_model()._meta.get_field(get_user_model().USERNAME_FIELD).column  # type: ignore[union-attr]


def _freeze(version: ToolVersion, arguments: Any) -> Any:
    schema = version.contract["input_schema"]
    validate_arguments(schema, arguments)
    return freeze_arguments(
        schema,
        arguments,
        key=settings.SENSITIVE_ARGUMENT_KEY,
        key_id=settings.SENSITIVE_ARGUMENT_KEY_ID,
    )


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


@dataclass(frozen=True)
class _Intent:
    """What a registration means, worked out before its transaction: no lock is held
    while arguments are validated and hashed."""

    run: Run
    tool: Tool
    version: ToolVersion
    frozen: Any
    digest: str
    policy: Any
    previous: Operation | None
    # What people's policies ask beyond the contract (``services.policies``): the
    # strictest of those that asked, and which asked.
    requirement: Requirement | None = None
    policy_hits: tuple[dict[str, Any], ...] = ()
    # The windows of limits over time this registration counts in, decided in the
    # transaction (``_windows_decide``).
    windowed: tuple[Counted, ...] = ()
    # What the policies in shadow would have done, recorded once the operation is.
    shadow: Observation | None = None

    @property
    def approval_required(self) -> bool:
        return bool(self.policy.required or self.requirement is not None)

    @property
    def reason(self) -> str:
        return " ".join(
            part for part in (self.policy.reason, reason_of(list(self.policy_hits))) if part
        )

    def request_context(self) -> dict[str, Any]:
        context: dict[str, Any] = {
            "matched_rules": self.policy.matched_rules,
            "policy_mode": self.policy.mode,
            "runner_reason": self.policy.runner_reason,
        }
        if self.requirement is not None:
            context["policies"] = list(self.policy_hits)
            context["policy_terms"] = self.requirement.as_dict()
        return context


def _context(
    *, runner: Runner, run_id: str, tool_name: str
) -> tuple[Run, Tool | None, tuple[str, str]]:
    """The runner's run and the tool with its active version: one read.

    Only what a registration needs is loaded; the run's budgets are checked and counted
    by the conditional UPDATE at the end of the transaction (``_run_count``).
    """
    sql = (
        # The user table's names come from the model, never from a request.
        "SELECT r.principal, r.principal_user_id, r.tool_calls, r.spend, r.turns, "  # noqa: S608
        f"(SELECT u.{_USERNAME} FROM {_USERS} u WHERE u.id = %s), "
        "(SELECT o.name FROM operations_runner o WHERE o.id = t.owner_id), "
        "t.name, t.active_version_id, t.owner_id, "
        "t.breaker_state, v.tool_id, v.number, v.contract, v.contract_hash "
        "FROM operations_run r "
        "LEFT JOIN operations_tool t ON t.name = %s "
        "LEFT JOIN operations_toolversion v ON v.id = t.active_version_id "
        "WHERE r.id = %s AND r.runner_id = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [runner.owner_id, tool_name, run_id, runner.pk])
        row = cursor.fetchone()
    if row is None:
        raise errors.NotFound(f"No run {run_id!r}.")
    principal, principal_user_id, tool_calls, spend, turns, runner_owner, tool_owner, *rest = row
    name, version_id, owner_id, breaker_state, *version = rest
    alias = connection.alias
    # ``from_db`` assigns a partial row's values in the model's field order, whatever
    # order the names are given in: they are listed in that order here.
    run = Run.from_db(
        alias,
        ["id", "runner_id", "principal", "principal_user_id", "tool_calls", "turns", "spend"],
        [run_id, runner.pk, principal, principal_user_id, tool_calls, turns, spend],
    )
    # Who owns what, by name, for the policies (``services.policies``).
    owners = (runner_owner or "", tool_owner or "")
    if name is None:
        return run, None, owners
    tool = Tool.from_db(
        alias,
        ["name", "active_version_id", "owner_id", "breaker_state"],
        [name, version_id, owner_id, breaker_state],
    )
    if version_id is not None:
        tool_id, number, contract, contract_hash = version
        contract = json.loads(contract) if isinstance(contract, str) else contract
        tool.active_version = ToolVersion.from_db(
            alias,
            ["id", "tool_id", "number", "contract", "contract_hash"],
            [version_id, tool_id, number, contract, contract_hash],
        )
    return run, tool, owners


def _not_active(tool: Tool) -> errors.ToolNotActive:
    """A tool whose versions all wait for a person (``HOLD_NEW_TOOLS``, or a proof the
    first version could not pass): which one to activate, read only on this path."""
    latest = (
        ToolVersion.objects.filter(tool_id=tool.name)
        .order_by("-number")
        .values_list("number", flat=True)
        .first()
    )
    return errors.ToolNotActive(
        f"Tool {tool.name} has no active version: waiting for a person to activate "
        f"version {latest}.",
        tool=tool.name,
        waiting_version=latest,
    )


def _intent(
    *,
    runner: Runner,
    run: Run,
    tool: Tool | None,
    owners: tuple[str, str],
    tool_name: str,
    arguments: Any,
    approval: dict[str, Any] | None,
    retry_of: str | None,
) -> _Intent:
    """Refusals in api.md's order: unknown tool, retry target, permission, arguments,
    a policy's forbid."""
    if tool is None:
        raise errors.UnknownTool(f"No tool named {tool_name!r} is registered.")
    if tool.active_version is None:
        raise _not_active(tool)
    previous = _retry_target(runner=runner, tool=tool, operation_id=retry_of) if retry_of else None
    if not access.runner_may_invoke(runner, tool):
        raise errors.ToolForbidden(f"Runner {runner.name} may not invoke {tool.name}.")
    version = tool.active_version
    frozen = _freeze(version, arguments)
    policy = evaluate_policy(
        version.contract["approval"],
        frozen,
        runner_requested=bool(approval and approval.get("require")),
        runner_reason=(approval or {}).get("reason"),
    )
    requirement, hits, windowed, observed = registration_judge(
        runner=runner,
        run=run,
        tool=tool,
        owners=owners,
        version=version,
        frozen=frozen,
        contract_asks=policy.required,
    )
    return _Intent(
        run=run,
        tool=tool,
        version=version,
        frozen=frozen,
        digest=intent_hash(tool=tool.name, arguments=frozen, principal=run.principal),
        policy=policy,
        previous=previous,
        requirement=requirement,
        policy_hits=hits,
        windowed=windowed,
        shadow=observed,
    )


def _windows_decide(intent: _Intent, *, now: datetime) -> _Intent:
    """The intent with the policies whose window this registration passes among those
    that ask, their figures in the approver's words; the windows are locked until the
    transaction ends (``services.windows``)."""
    passed = windows_judge_locked(intent.windowed, now=now)
    if not passed:
        return intent
    hits = [
        {
            "policy": entry.policy.policy_id,
            "version": entry.version,
            "message": entry.policy.message,
            "missing": False,
            "figure": figure,
        }
        for entry, figure in passed
    ]
    terms = [entry.policy.asks or Requirement() for entry, _ in passed]
    return dataclasses.replace(
        intent,
        requirement=cedar.strictest(
            [*terms, *([intent.requirement] if intent.requirement else [])]
        ),
        policy_hits=(*intent.policy_hits, *hits),
    )
