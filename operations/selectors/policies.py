"""Reads of people's policies: what a policy watched in shadow would have done."""

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from approvals.people import Person

from .. import access
from ..models import PolicyShadowTally

SUMMARY_EXAMPLES = 10
WOULD = ("forbid", "require", "permit", "none")


def shadow_summary(
    *, user: Person, policy_id: str, hours: int = 24, now: datetime | None = None
) -> dict[str, Any]:
    """Over the last ``hours`` (whole hours, this one included): per would-have, how
    many registrations and how many of them diverged from the policies in force; the
    versions watched; the newest examples (operation id and tool). One bounded read:
    at most four rows per version and hour."""
    access.require_manage_policies(user)
    hours = max(1, min(hours, 24 * 31))
    at = (now or timezone.now()).replace(minute=0, second=0, microsecond=0)
    since = at - timedelta(hours=hours - 1)
    rows = PolicyShadowTally.objects.filter(policy_id=policy_id, hour__gte=since).values_list(
        "version", "would", "count", "diverged", "examples"
    )
    counts = dict.fromkeys(WOULD, 0)
    diverged = dict.fromkeys(WOULD, 0)
    versions: set[int] = set()
    examples: list[dict[str, Any]] = []
    for version, would, count, divergences, kept in rows:
        versions.add(version)
        counts[would] += count
        diverged[would] += divergences
        examples.extend({**example, "version": version} for example in kept)
    examples.sort(key=lambda example: example.get("at", ""), reverse=True)
    return {
        "policy": policy_id,
        "hours": hours,
        "since": since,
        "versions": sorted(versions),
        "counts": counts,
        "diverged": diverged,
        "total_diverged": sum(diverged.values()),
        "examples": examples[:SUMMARY_EXAMPLES],
    }
