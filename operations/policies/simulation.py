"""What would change if a policy (or a contract version) had been in force over past
registrations (docs/policies.md, Simulation).

Pure: the caller streams the history in (``services.simulation`` reads it from the
ledger) and hands in the policy sets. Each operation is judged twice, before and after:

- before: the policies in force and what its contract decided;
- after: the policies in force without those the candidate replaces (its own active
  version), plus the candidate, and what the candidate contract decides when one is
  simulated.

The policies in force and the candidate are evaluated together, in one Cedar call per
operation (a second only when a forbid matched: ``PolicySet.evaluate_each``); the hits
are then split between them, and the "after" verdict is put together from both (each
policy's match does not depend on the others).
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .cedar import NOTHING, Facts, Hit, PolicySet, Verdict
from .shadow import FORBID, NONE, REQUIRE, outcome_of

EXAMPLES = 5
CHANGES = ("newly_asking", "newly_forbidden", "no_longer_asking", "no_longer_forbidden")


@dataclass(frozen=True)
class Past:
    """One registered operation as it was: what the policies saw, and whether its
    contract asked a person (``contract_asks``); with a candidate contract, whether
    that one would (``candidate_asks``; None: the same as before)."""

    operation_id: str
    registered_at: datetime
    facts: Facts
    contract_asks: bool
    candidate_asks: bool | None = None


@dataclass
class Change:
    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Simulation:
    """Counts of what would change, with up to ``EXAMPLES`` examples each."""

    operations: int = 0
    truncated: bool = False
    changes: dict[str, Change] = field(default_factory=lambda: {name: Change() for name in CHANGES})

    def as_dict(self) -> dict[str, Any]:
        return {
            "operations": self.operations,
            "truncated": self.truncated,
            **{
                name: {"count": change.count, "examples": change.examples}
                for name, change in self.changes.items()
            },
        }


def _without(verdict: Verdict, replaced: frozenset[str]) -> Verdict:
    if not replaced or verdict is NOTHING:
        return verdict

    def keep(hits: tuple[Hit, ...]) -> tuple[Hit, ...]:
        return tuple(hit for hit in hits if hit.policy.policy_id not in replaced)

    forbids = keep(verdict.forbids)
    return Verdict(
        forbidden=forbids[0] if forbids else None,
        asks=keep(verdict.asks),
        permits=keep(verdict.permits),
        forbids=forbids,
    )


def _split(verdict: Verdict, theirs: set[int]) -> tuple[Verdict, Verdict]:
    """``verdict`` as two: the hits of the policies not in ``theirs`` (by identity),
    and those of ``theirs``."""

    def part(hits: tuple[Hit, ...], mine: bool) -> tuple[Hit, ...]:
        return tuple(hit for hit in hits if (id(hit.policy) in theirs) != mine)

    halves = []
    for mine in (True, False):
        forbids = part(verdict.forbids, mine)
        halves.append(
            Verdict(
                forbidden=forbids[0] if forbids else None,
                asks=part(verdict.asks, mine),
                permits=part(verdict.permits, mine),
                forbids=forbids,
            )
        )
    return halves[0], halves[1]


def _with(base: Verdict, added: Verdict) -> Verdict:
    if added is NOTHING:
        return base
    forbids = base.forbids + added.forbids
    return Verdict(
        forbidden=forbids[0] if forbids else None,
        asks=base.asks + added.asks,
        permits=base.permits + added.permits,
        forbids=forbids,
    )


def _change(before: str, after: str) -> str | None:
    if after == FORBID and before != FORBID:
        return "newly_forbidden"
    if before == FORBID and after != FORBID:
        return "no_longer_forbidden"
    if after == REQUIRE and before == NONE:
        return "newly_asking"
    if before == REQUIRE and after == NONE:
        return "no_longer_asking"
    return None


def simulate(
    history: Iterable[Past],
    *,
    current: PolicySet,
    candidate: PolicySet | None = None,
    replaces: frozenset[str] = frozenset(),
    examples: int = EXAMPLES,
) -> Simulation:
    """Judge each past operation before and after (module docstring); count the
    operations that would be newly asking, newly forbidden, no longer asking or no
    longer forbidden, keeping the first ``examples`` of each (operation id, tool, when,
    before and after, which policies)."""
    result = Simulation()
    candidates = list(candidate.policies) if candidate is not None else []
    both = PolicySet([*current.policies, *candidates])
    theirs = {id(policy) for policy in candidates}
    for past in history:
        result.operations += 1
        before, added = (
            _split(both.evaluate_each(past.facts), theirs)
            if len(both)
            else (
                NOTHING,
                NOTHING,
            )
        )
        after = _with(_without(before, replaces), added)
        was = outcome_of(before, contract_asks=past.contract_asks)
        asks_after = past.contract_asks if past.candidate_asks is None else past.candidate_asks
        will = outcome_of(after, contract_asks=asks_after)
        name = _change(was, will)
        if name is None:
            continue
        change = result.changes[name]
        change.count += 1
        if len(change.examples) < examples:
            change.examples.append(
                {
                    "operation": past.operation_id,
                    "tool": past.facts.tool,
                    "registered_at": past.registered_at.isoformat(),
                    "before": was,
                    "after": will,
                    "policies": sorted({hit.policy.policy_id for hit in added.matched()}),
                }
            )
    return result
