"""What a policy watched in shadow would have done to one registration, and whether
that differs from what the policies in force did (docs/policies.md, Shadow mode).

Pure: the caller hands in both verdicts; ``services.shadow`` records the answer.
"""

from dataclasses import dataclass

from .cedar import Verdict

FORBID = "forbid"
REQUIRE = "require"
PERMIT = "permit"
NONE = "none"


def effect_of(verdict: Verdict, policy_id: str) -> str:
    """What one policy did in ``verdict``: ``forbid``, ``require`` (it asked a person,
    or could not be evaluated and so asks), ``permit`` (a plain permit matched) or
    ``none``."""
    if any(hit.policy.policy_id == policy_id for hit in verdict.forbids):
        return FORBID
    if any(hit.policy.policy_id == policy_id for hit in verdict.asks):
        return REQUIRE
    if any(hit.policy.policy_id == policy_id for hit in verdict.permits):
        return PERMIT
    return NONE


def outcome_of(verdict: Verdict, *, contract_asks: bool = False) -> str:
    """What a registration came to: ``forbid``, ``require`` (a person decides, by the
    contract or a policy) or ``none``."""
    if verdict.forbidden is not None:
        return FORBID
    if verdict.asks or contract_asks:
        return REQUIRE
    return NONE


def _changes(effect: str) -> str:
    # A plain permit changes nothing: for a divergence it is the same as no match.
    return NONE if effect == PERMIT else effect


@dataclass(frozen=True)
class Seen:
    """One shadow policy version on one registration."""

    policy_id: str
    version: int
    would: str  # forbid, require, permit, or none (only when it diverged)
    diverged: bool
    in_force: str  # what the policies in force did: forbid, require, none


def compare(
    shadow: Verdict,
    active: Verdict,
    *,
    shadow_versions: dict[str, int],
    active_versions: dict[str, int],
    contract_asks: bool = False,
) -> tuple[Seen, ...]:
    """Every shadow policy that matched, or that diverged without matching.

    A new policy (none of its versions in force) diverges when it would forbid what the
    policies in force let through or asked a person for, or ask a person where neither
    the contract nor any policy in force did. A new version of an active policy
    diverges when it would do otherwise than its active version did on the same
    registration (a plain permit counts as no match): then ``none`` says it would no
    longer forbid or ask.
    """
    did = outcome_of(active, contract_asks=contract_asks)
    seen = []
    for policy_id, version in shadow_versions.items():
        would = effect_of(shadow, policy_id)
        if policy_id in active_versions:
            diverged = _changes(would) != _changes(effect_of(active, policy_id))
        elif would == FORBID:
            diverged = did != FORBID
        elif would == REQUIRE:
            diverged = did == NONE
        else:
            diverged = False
        if would != NONE or diverged:
            seen.append(Seen(policy_id, version, would, diverged, did))
    return tuple(seen)
