"""What people's policies say of one registration (docs/policies.md): the verdict of
those in force, the windows of those that count, what the shadow policies would have
done; and the trace of a registration a policy refused. Called by
``services.registration`` before its transaction."""

from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import errors
from ..machine import EventKind
from ..models import Run, Runner, Tool, ToolVersion
from ..policies import cedar
from ..policies.cedar import Requirement
from ..policies.windows import Counted, counted
from . import policies, shadow
from .core import Actor, event_append
from .shadow import Observation

# What ``registration_judge`` answers: the requirement, the hits that asked, the windows,
# the shadow observation.
Judged = tuple[
    Requirement | None, tuple[dict[str, Any], ...], tuple[Counted, ...], Observation | None
]


def registration_judge(
    *,
    runner: Runner,
    run: Run,
    tool: Tool,
    owners: tuple[str, str],
    version: ToolVersion,
    frozen: Any,
    contract_asks: bool,
) -> Judged:
    """What people's policies in force say of this registration: raises
    ``ForbiddenByPolicy`` for a forbid; else the strictest requirement of those that
    ask (None: none asks), which asked, the windows of the policies with a ``@window``
    that matched (those ask only past their bound, decided in the transaction:
    ``registration._windows_decide``), and what the shadow policies would have done. No policy in
    force nor in shadow: nothing is computed."""
    in_force = policies.in_force()
    if not in_force:
        return None, (), (), None
    facts = policies.registration_facts(
        runner=runner,
        runner_owner=owners[0],
        tool=tool,
        tool_owner=owners[1],
        contract=version.contract,
        frozen=frozen,
        run=run,
        now=timezone.now(),
    )
    verdict = policies.registration_verdict(in_force, facts)
    observed = shadow.shadow_observe(in_force, facts, verdict, contract_asks=contract_asks)
    if verdict.forbidden is not None:
        if observed is not None:
            # Refused: no transaction follows; recorded now, without an operation id.
            shadow.shadow_record_safely(observed)
        hit = verdict.forbidden.policy
        raise errors.ForbiddenByPolicy(
            hit.message or f"Policy {hit.policy_id} forbids this operation.",
            policy=hit.policy_id,
            policy_version=in_force.versions.get(hit.policy_id),
        )
    asks: list[cedar.Hit] = []
    windowed: list[Counted] = []
    for asked in verdict.asks:
        if asked.policy.window is None or asked.missing:
            asks.append(asked)
            continue
        entry = counted(
            asked.policy,
            version=in_force.versions.get(asked.policy.policy_id),
            principal=run.principal,
            tool=tool.name,
            runner=runner.name,
            arguments=frozen,
        )
        if entry is not None:
            windowed.append(entry)
        elif asked.policy.when_missing == "match":
            # The value it groups by or sums is absent: it cannot count, a person decides.
            asks.append(cedar.Hit(asked.policy, missing=True))
    plain = cedar.Verdict(asks=tuple(asks))
    return (
        plain.requirement,
        tuple(policies.hits_described(plain, in_force.versions)),
        tuple(windowed),
        observed,
    )


def registration_forbidden_record(
    refusal: errors.ForbiddenByPolicy, *, runner: Runner, run: Run, tool_name: str
) -> None:
    """The trace of a registration a policy refused: one event on the run's stream,
    the only thing written (no operation, no tool call counted)."""
    with transaction.atomic(durable=True):
        locked = Run.objects.select_for_update().get(pk=run.pk)
        event_append(
            stream=locked.id,
            kind=EventKind.REGISTRATION_FORBIDDEN,
            actor=Actor.of_runner(runner),
            run=locked,
            tool_name=tool_name,
            # The run's status, unchanged: audit verify reads a run's status from the
            # last event of its stream.
            from_status=locked.status,
            to_status=locked.status,
            data={
                "tool": tool_name,
                "policy": refusal.extra.get("policy"),
                "policy_version": refusal.extra.get("policy_version"),
                "message": refusal.detail,
            },
        )
