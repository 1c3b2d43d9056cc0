"""What the notification channels read (docs/notifications.md): an approval request in
words as every channel tells it (``request_view``), who is told of a notice and where
(``personal_targets``, ``slack_channels_for``), and people's preferences.

No value the contract marks ``x-sensitive`` is in a view: the summary and the amount are
the contract's display with sensitive values hidden, as on the approval page.
"""

from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import Group
from django.db.models import Count
from guardian.shortcuts import get_objects_for_group

from approvals.models import ApprovalRequest, ExternalIdentity
from approvals.people import Person
from approvals.policy import is_missing, resolve_pointer

from .. import access
from ..contracts import display, explain
from ..models import (
    Notice,
    NotificationPreference,
    NotificationRoute,
    Resolution,
    SlackInteraction,
    Tool,
)

Kind = Notice.Kind

# What a person may choose to be told, and on which of their own channels.
PERSONAL_KINDS = (
    Kind.REQUEST_OPENED,
    Kind.REQUEST_ESCALATED,
    Kind.REQUEST_REMINDER,
    Kind.CONFIRMATION_NEEDED,
)
PERSONAL_KIND_LABELS = {
    Kind.REQUEST_OPENED: "An approval request I may decide",
    Kind.REQUEST_ESCALATED: "A request escalated to my group",
    Kind.REQUEST_REMINDER: "A reminder before a request I may decide expires",
    Kind.CONFIRMATION_NEEDED: 'A "did not happen" waiting for a second person',
}
PERSONAL_CHANNELS = ("mail", "slack")
DEFAULT_CHANNELS = ("mail",)
# The issuer a Slack account is linked under (``ExternalIdentity``): Slack's member ids
# are unique across workspaces, and ``SLACK_TEAM_ID`` keeps one installation to one.
SLACK_ISSUER = "slack"
# A route to this channel keeps a tool's (or a group's) requests out of Slack.
NO_CHANNEL = "-"


@dataclass(frozen=True)
class Decided:
    username: str
    decision: str
    comment: str


@dataclass(frozen=True)
class RequestView:
    """An approval request as a notification tells it, read when it is sent."""

    request_id: str
    operation_id: str
    intent_hash: str
    tool: str
    effect_class: str
    principal: str
    summary: str
    amount: str
    runner_reason: str
    reasons: list[str]
    status: str
    approvals: int
    approvals_required: int
    expires_at: datetime
    created_at: datetime
    escalated_to: str
    link: str
    needs_second_factor: bool
    decided: list[Decided] = field(default_factory=list)

    @property
    def still_needed(self) -> int:
        return max(0, self.approvals_required - self.approvals)

    @property
    def pending(self) -> bool:
        return self.status == ApprovalRequest.RequestStatus.PENDING


def console_link(path: str) -> str:
    return f"{settings.CONSOLE_BASE_URL.rstrip('/')}{path}"


def request_view(request_id: str) -> RequestView | None:
    request = (
        ApprovalRequest.objects.select_related(
            "operation", "operation__tool", "operation__tool_version"
        )
        .filter(pk=request_id)
        .first()
    )
    if request is None:
        return None
    op = request.operation
    contract = op.tool_version.contract
    context = request.context if isinstance(request.context, dict) else {}
    pointer = display.amount_pointer(contract)
    value = resolve_pointer(op.arguments, pointer) if pointer else None
    amount = display.describe(contract, pointer, value) if pointer and not is_missing(value) else ""
    decisions = list(request.decisions.select_related("user").order_by("at", "pk"))
    return RequestView(
        request_id=request.id,
        operation_id=op.id,
        intent_hash=request.intent_hash,
        tool=op.tool_id,
        effect_class=op.effect_class,
        principal=op.principal,
        summary=display.summary(contract, op.arguments),
        amount=amount,
        runner_reason=explain.runner_reason(context, contract, op.arguments),
        reasons=explain.reasons_in_words(
            contract, context, arguments=op.arguments, tool=op.tool_id
        ),
        status=request.status,
        approvals=sum(1 for d in decisions if d.decision == "approve"),
        approvals_required=request.approvals_required,
        expires_at=request.expires_at,
        created_at=request.created_at,
        escalated_to=request.escalate_to if request.escalated_at else "",
        link=console_link(f"/approvals/{request.id}/"),
        needs_second_factor=access.decision_needs_second_factor(op)
        or bool(access.policy_terms(request).get("second_factor")),
        decided=[Decided(d.user.get_username(), d.decision, d.comment) for d in decisions],
    )


# --- who is told, and where -------------------------------------------------------------


def preference_channels(user: Person) -> dict[str, list[str]]:
    """The channels ``user`` chose for each personal kind (the defaults where none)."""
    row = NotificationPreference.objects.filter(user=user).first()
    chosen = row.channels if row is not None and isinstance(row.channels, dict) else {}
    return {
        kind: [c for c in chosen.get(kind, DEFAULT_CHANNELS) if c in PERSONAL_CHANNELS]
        for kind in PERSONAL_KINDS
    }


def slack_accounts(user_ids: list[int]) -> dict[int, str]:
    """Each person's linked Slack user id, of those who have one."""
    return dict(
        ExternalIdentity.objects.filter(issuer=SLACK_ISSUER, user_id__in=user_ids).values_list(
            "user_id", "subject"
        )
    )


def people_told(notice: Notice) -> list[Person]:
    """Whom a personal notice is for: who may decide the request and is not barred,
    minus who already decided (for the escalation, its group's members; for a reminder,
    both); who may confirm a "did not happen"."""
    if notice.kind == Kind.CONFIRMATION_NEEDED:
        resolution = (
            Resolution.objects.select_related("operation", "operation__tool")
            .filter(pk=notice.resolution_id, review__isnull=True)
            .first()
        )
        if resolution is None:
            return []  # confirmed, disputed or withdrawn before it was told
        return [
            user
            for user in access.people_holding(access.RECONCILE, resolution.operation.tool)
            if user.pk != resolution.declared_by_id
        ]
    request = (
        ApprovalRequest.objects.select_related("operation", "operation__tool")
        .filter(pk=notice.request_id, status=ApprovalRequest.RequestStatus.PENDING)
        .first()
    )
    if request is None:
        return []  # decided or withdrawn before it was told
    op = request.operation
    barred = access.barred_user_ids(request=request, op=op)
    barred |= set(request.decisions.values_list("user_id", flat=True))
    if notice.kind == Kind.REQUEST_ESCALATED:
        people = access.escalation_members(request)
    elif notice.kind == Kind.REQUEST_REMINDER:
        people = [
            *access.people_holding(access.DECIDE, op.tool),
            *access.escalation_members(request),
        ]
    else:
        people = list(access.people_holding(access.DECIDE, op.tool))
    unique = {user.pk: user for user in people if user.is_active and user.pk not in barred}
    return list(unique.values())


def slack_channels_for(request: ApprovalRequest, *, escalated: bool) -> list[str]:
    """Where a request is posted in Slack: the tool's channel, else the channels of the
    groups that decide the tool, else ``SLACK_APPROVALS_CHANNEL``; an escalated request
    also goes to its group's channel."""
    if escalated:
        group_route = NotificationRoute.objects.filter(group__name=request.escalate_to).first()
        if group_route is None or group_route.slack_channel == NO_CHANNEL:
            return []
        return [group_route.slack_channel]
    return slack_channels_of_tool(request.operation.tool)


def slack_person(slack_user_id: str) -> Person | None:
    """The active person linked to a Slack user, or None."""
    link = (
        ExternalIdentity.objects.select_related("user")
        .filter(issuer=SLACK_ISSUER, subject=slack_user_id)
        .first()
    )
    if link is None or not link.user.is_active:
        return None
    return link.user


def tool_route(tool: Tool) -> str:
    route = NotificationRoute.objects.filter(tool=tool).first()
    return route.slack_channel if route is not None else ""


def slack_channels_of_tool(tool: Tool) -> list[str]:
    """Where a new request of ``tool`` would be posted (``slack_channels_for``)."""
    route = tool_route(tool)
    if route == NO_CHANNEL:
        return []
    if route:
        return [route]
    groups = access.deciding_groups(tool)
    channels = list(
        NotificationRoute.objects.filter(group__in=groups)
        .exclude(slack_channel=NO_CHANNEL)
        .order_by("group__name")
        .values_list("slack_channel", flat=True)
    )
    if channels:
        return list(dict.fromkeys(channels))
    default = settings.SLACK_APPROVALS_CHANNEL
    return [default] if default else []


def group_route(group: Group) -> str:
    route = NotificationRoute.objects.filter(group=group).first()
    return route.slack_channel if route is not None else ""


def tools_decided_by(group: Group) -> list[str]:
    """The tools ``group``'s members may decide through it (on the tool, or every tool)."""
    app_label, codename = access.DECIDE.split(".")
    if group.permissions.filter(codename=codename, content_type__app_label=app_label).exists():
        return ["every tool"]
    return sorted(
        get_objects_for_group(group, access.DECIDE, klass=Tool).values_list("name", flat=True)[:200]
    )


def group_rows() -> list[dict]:
    routes = dict(
        NotificationRoute.objects.exclude(group=None).values_list("group_id", "slack_channel")
    )
    return [
        {"group": group, "members": group.members, "slack_channel": routes.get(group.pk, "")}
        for group in Group.objects.annotate(members=Count("user")).order_by("name")[:500]
    ]


def slack_interaction_answer(key: str) -> dict:
    """What an interaction Slack sent before was answered ({} for a plain 200)."""
    answer = SlackInteraction.objects.filter(pk=key).values_list("answer", flat=True).first()
    return answer if isinstance(answer, dict) else {}
