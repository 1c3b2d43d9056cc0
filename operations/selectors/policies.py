"""Reads of people's policies (docs/policies.md), for the console and the ``policy``
command. Only people who manage policies see them (``access.may_manage_policies``);
runners never do: no API route leads here."""

from datetime import datetime, timedelta
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone

from approvals.people import Person

from .. import access
from ..errors import NotFound
from ..models import Event, Policy, PolicyShadowTally, PolicyVersion

SUMMARY_EXAMPLES = 10
WOULD = ("forbid", "require", "permit", "none")


def policy_rows() -> QuerySet[Policy]:
    """Every policy with its active version and the number, kind and message of its
    newest version (``newest_number``, ``newest_kind``, ``newest_message``). The
    ``policy`` command reads this as the operator with shell access."""
    newest = PolicyVersion.objects.filter(policy=OuterRef("pk")).order_by("-number")
    return (
        Policy.objects.select_related("active_version", "shadow_version")
        .annotate(
            newest_number=Subquery(newest.values("number")[:1]),
            newest_kind=Subquery(newest.values("kind")[:1]),
            newest_message=Subquery(newest.values("message")[:1]),
        )
        .order_by("id")
    )


def policies_for_user(user: Person) -> QuerySet[Policy]:
    """The policies ``user`` may see: all of them for a person who manages policies,
    none for anyone else."""
    return policy_rows() if access.may_manage_policies(user) else Policy.objects.none()


def policy_get_for_user(*, user: Person, policy_id: str) -> Policy:
    policy = policies_for_user(user).filter(pk=policy_id).first()
    if policy is None:
        raise NotFound(f"No policy {policy_id!r}.")
    return policy


def policy_versions(policy: Policy) -> list[PolicyVersion]:
    """A policy's versions, newest first, with their authors."""
    return list(
        PolicyVersion.objects.filter(policy=policy).select_related("written_by").order_by("-number")
    )


def policy_events(policy: Policy) -> list[Event]:
    """The policy's history: its stream ``policy:<id>``, oldest first."""
    return list(Event.objects.filter(stream=f"policy:{policy.pk}").order_by("seq"))


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
