"""Simulation before activating (docs/policies.md#simulation): replay the operations
registered in the last N days against a candidate policy version, or a candidate
contract version, and say what would change. Writes nothing.

It lives beside the services, not among the selectors, because it judges with the
policies in force as the services compile them (``policies.in_force``).

The history is read in chunks through the primary key (operation ids are time-ordered:
``approvals.ids.id_floor``), as plain values, never model instances: at most
``MAX_OPERATIONS`` operations per simulation, the newest of the window when it holds
more (then ``truncated``). What each operation is judged on:

- exactly as registered: its frozen arguments (sensitive values digested), principal,
  tool, effect class, contract version (its input schema and approval rules) and time;
- approximate: the runner's and the tool's owners are today's; the run's ``tool_calls``
  and ``turns`` are rebuilt from the run's earlier operations (their number, their
  largest turn), which misses calls a policy refused and counts an edited copy once
  more; the run's ``spend`` is its spend today, an upper bound of what it was; the
  contract's decision is taken without the runner's own ``approval.require``.

``APPROXIMATIONS`` says the same to the people reading a simulation (the console).
"""

from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Count, F, Max, Q
from django.utils import timezone

from approvals.ids import id_floor
from approvals.people import Person
from approvals.policy import evaluate as evaluate_approval

from .. import access
from ..errors import NotFound
from ..models import Operation, PolicyVersion, Tool, ToolVersion
from ..policies import cedar
from ..policies.errors import PolicyInvalid
from ..policies.simulation import Past, Simulation, simulate
from .policies import in_force, local_now

MAX_OPERATIONS = 100_000
MAX_DAYS = 366
CHUNK = 2000
_USERNAME = get_user_model().USERNAME_FIELD
APPROXIMATIONS = (
    "The owners of the runner and of the tool are today's.",
    "A run's tool calls and turns are rebuilt from its earlier operations: calls a "
    "policy refused are missed, and an edited copy counts once more.",
    "A run's spend is its spend today, an upper bound of what it was.",
    "The contract's decision is taken without the runner's own approval.require.",
)

COLUMNS = (
    "id",
    "created_at",
    "run_id",
    "runner__name",
    f"runner__owner__{_USERNAME}",
    "tool_id",
    "tool__owner__name",
    "tool_version_id",
    "effect_class",
    "arguments",
    "principal",
    "turn",
    "run__spend",
)


def _window(days: int, limit: int) -> tuple[Q, Q, bool]:
    """Which operations to read (the window, or its newest ``limit`` when it holds
    more: then ``truncated``), and which came before them."""
    if not 1 <= days <= MAX_DAYS:
        raise PolicyInvalid(f"A simulation replays 1 to {MAX_DAYS} days.")
    since = timezone.now() - timedelta(days=days)
    floor = id_floor("op", int(since.timestamp() * 1000))
    # The newest ``limit`` ids of the window come after this one, if there is one.
    cut = (
        Operation.objects.filter(id__gte=floor)
        .order_by("-id")
        .values_list("id", flat=True)[limit : limit + 1]
        .first()
    )
    if cut is None:
        return Q(id__gte=floor, created_at__gte=since), Q(id__lt=floor), False
    return Q(id__gt=cut, created_at__gte=since), Q(id__lte=cut), True


def _history(
    *,
    days: int,
    limit: int,
    tools: frozenset[str] | None,
    contracts: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> tuple[Iterator[Past], bool]:
    """The operations of the window, oldest first, as ``Past``, and whether the
    window was truncated. With ``contracts`` (before, after), each operation's
    contract decision is taken from both instead of its own version's."""
    limit = max(1, min(limit, MAX_OPERATIONS))
    selected, before, truncated = _window(days, limit)
    window = Operation.objects.filter(selected)
    # What each run had done before the window: its operations and largest turn.
    prior = {
        run_id: (count, turn or 0)
        for run_id, count, turn in Operation.objects.filter(
            before, run_id__in=window.values("run_id")
        )
        .values("run_id")
        .annotate(count=Count("id"), turn=Max("turn"))
        .values_list("run_id", "count", "turn")
    }
    by_version: dict[int, dict[str, Any]] = {}

    def contract_of(version_id: int) -> dict[str, Any]:
        if version_id not in by_version:
            by_version[version_id] = ToolVersion.objects.values_list("contract", flat=True).get(
                pk=version_id
            )
        return by_version[version_id]

    def rows() -> Iterator[Past]:
        counted: dict[str, tuple[int, int]] = {}
        for row in window.order_by("id").values_list(*COLUMNS)[:limit].iterator(chunk_size=CHUNK):
            op_id, at, run_id, runner, runner_owner, tool, tool_owner, version_id, *rest = row
            effect_class, arguments, principal, turn, spend = rest
            calls, turns = counted.get(run_id) or prior.get(run_id) or (0, 0)
            counted[run_id] = (calls + 1, max(turns, turn or 0))
            if tools is not None and tool not in tools:
                continue
            contract = contract_of(version_id)
            facts = cedar.Facts(
                runner=runner,
                runner_owner=runner_owner or "",
                tool=tool,
                tool_owner=tool_owner or "",
                effect_class=effect_class,
                input_schema=contract["input_schema"],
                arguments=arguments,
                principal=principal,
                tool_calls=calls,
                spend=Decimal(spend or 0),
                turns=turns,
                now=local_now(at),
            )
            if contracts is None:
                asks, candidate_asks = _asks(contract, arguments), None
            else:
                asks = _asks(contracts[0], arguments)
                candidate_asks = _asks(contracts[1], arguments)
            yield Past(
                operation_id=op_id,
                registered_at=at,
                facts=facts,
                contract_asks=asks,
                candidate_asks=candidate_asks,
            )

    return rows(), truncated


def _asks(contract: dict[str, Any], arguments: Any) -> bool:
    return evaluate_approval(contract["approval"], arguments).required


def policy_simulate(
    *,
    user: Person,
    policy_id: str,
    days: int,
    version: int | None = None,
    limit: int = MAX_OPERATIONS,
) -> Simulation:
    """What a version of a policy (the newest by default) would have changed over the
    last ``days`` days: the policies in force without the candidate, against them with
    it (for a new version of an active policy: with the active version replaced)."""
    access.require_manage_policies(user)
    versions = PolicyVersion.objects.filter(policy_id=policy_id)
    found = (
        versions.order_by("-number") if version is None else versions.filter(number=version)
    ).values_list("text", flat=True)
    text = found.first()
    if text is None:
        raise PolicyInvalid(f"Policy {policy_id} has no version {version}.")
    candidate = cedar.parse(text)
    policies = in_force()
    # Every tool's operations are read (the runs' counters need them); only those of
    # the tools the candidate names are judged.
    history, truncated = _history(days=days, limit=limit, tools=candidate.tools)
    result = simulate(
        history,
        current=policies.active,
        candidate=cedar.PolicySet([candidate]),
        replaces=frozenset({policy_id}) & policies.versions.keys(),
    )
    result.truncated = truncated
    return result


def contract_simulate(
    *, user: Person, tool: str, version: int, days: int = 30, limit: int = MAX_OPERATIONS
) -> Simulation:
    """What a contract version of ``tool`` would have changed over the last ``days``
    days: its approval rules against the active version's, on the tool's operations,
    with the policies in force on both sides (``approvals.policy.evaluate``). For
    people who manage policies or may activate the tool's versions."""
    found_tool = Tool.objects.filter(pk=tool).first()
    if found_tool is None:
        raise NotFound(f"No tool {tool!r}.")
    access.require_simulate_contract(user, found_tool)
    versions = ToolVersion.objects.filter(tool_id=tool)
    candidate = versions.filter(number=version).values_list("contract", flat=True).first()
    active = (
        versions.filter(tool__active_version_id=F("id")).values_list("contract", flat=True).first()
    )
    if candidate is None or active is None:
        raise PolicyInvalid(f"Tool {tool} has no version {version}, or no active version.")
    history, truncated = _history(
        days=days, limit=limit, tools=frozenset({tool}), contracts=(active, candidate)
    )
    result = simulate(history, current=in_force().active)
    result.truncated = truncated
    return result
