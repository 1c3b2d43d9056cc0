"""People's choices of what they are told and where, and the Slack channels each
tool's or group's approval requests go to (docs/notifications.md). Each change is
audited: a person's on their stream, a route on the tool's or the group's."""

import re
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone

from approvals.people import Person

from .. import access
from ..machine import EventKind
from ..models import NotificationPreference, NotificationRoute, Tool
from ..selectors.notices import PERSONAL_CHANNELS, PERSONAL_KINDS, preference_channels
from .core import Actor, event_append


def preference_set(*, user: Person, channels: dict[str, list[str]]) -> dict[str, list[str]]:
    """Set which channels tell ``user`` of each personal kind; unknown kinds or channels
    are refused (ValueError), so a typo never silences someone."""
    cleaned: dict[str, list[str]] = {}
    for kind, chosen in channels.items():
        if kind not in PERSONAL_KINDS:
            raise ValueError(f"Not something people are told of: {kind!r}.")
        unknown = [c for c in chosen if c not in PERSONAL_CHANNELS]
        if unknown:
            raise ValueError(f"Not a channel: {', '.join(map(repr, unknown))}.")
        cleaned[kind] = sorted(set(chosen))
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
        NotificationPreference.objects.update_or_create(
            user=user, defaults={"channels": cleaned, "updated_at": timezone.now()}
        )
        event_append(
            stream=f"user:{user.pk}",
            kind=EventKind.NOTIFICATION_PREFERENCES_SET,
            actor=Actor.of_user(user),
            data={"channels": cleaned},
        )
    return preference_channels(user)


# A Slack channel as people write it ("#finance-approvals", "finance") or its id; "-"
# keeps a tool's (or a group's) requests out of Slack.
SLACK_CHANNEL = re.compile(r"#?[a-z0-9][a-z0-9_.\-]{0,79}|[CGD][A-Z0-9]{2,30}|-")


def slack_channel_clean(value: str) -> str:
    """A Slack channel name or id, or ValueError saying what one looks like."""
    channel = value.strip()
    if channel and not SLACK_CHANNEL.fullmatch(channel):
        raise ValueError(
            "A Slack channel is its name (lower case, digits, - _ .; up to 80 characters, "
            "e.g. #finance-approvals) or its id (e.g. C0123ABCD); - for none."
        )
    return channel.removeprefix("#") if channel[:1] == "#" else channel


def route_set(
    *, user: Person, channel: str, tool: Tool | None = None, group: Group | None = None
) -> str:
    """Post the approval requests of ``tool`` (or those the group decides) to the Slack
    ``channel``; an empty channel removes the route. Audited on the tool's stream or the
    group's (``group:<id>``). Answers the channel kept."""
    access.require_manage_tool_permissions(user)
    if (tool is None) == (group is None):
        raise ValueError("A route belongs to one tool or one group.")
    cleaned = slack_channel_clean(channel)
    owner: dict[str, Any] = {"tool": tool} if tool is not None else {"group": group}
    with transaction.atomic():
        if tool is not None:
            stream = f"tool:{tool.pk}"
            Tool.objects.select_for_update().filter(pk=tool.pk).exists()
        else:
            assert group is not None
            stream = f"group:{group.pk}"
            Group.objects.select_for_update().filter(pk=group.pk).exists()
        before = NotificationRoute.objects.filter(**owner).values_list("slack_channel", flat=True)
        previous = next(iter(before), "")
        if previous == cleaned:
            return cleaned
        if not cleaned:
            NotificationRoute.objects.filter(**owner).delete()
        else:
            NotificationRoute.objects.update_or_create(**owner, defaults={"slack_channel": cleaned})
        event_append(
            stream=stream,
            kind=EventKind.NOTIFICATIONS_ROUTED,
            actor=Actor.of_user(user),
            tool_name=tool.pk if tool is not None else "",
            data={"slack_channel": cleaned or None, "before": previous or None},
        )
    return cleaned
