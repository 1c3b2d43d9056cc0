"""Reads of people's policies (docs/policies.md), for the console and the ``policy``
command. Only people who manage policies see them (``access.may_manage_policies``);
runners never do: no API route leads here."""

from django.db.models import OuterRef, QuerySet, Subquery

from approvals.people import Person

from .. import access
from ..errors import NotFound
from ..models import Event, Policy, PolicyVersion


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
