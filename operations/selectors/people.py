"""Reads for people in the console, each filtered through ``operations.access``: the
inbox, the reconciliation queue, search, lists, runs, tools and the audit log."""

from collections.abc import Iterable
from datetime import UTC, date, datetime, time, timedelta
from typing import Any, cast

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db.models import (
    Exists,
    OuterRef,
    Q,
    QuerySet,
)
from django.utils import timezone
from guardian.shortcuts import get_groups_with_perms, get_users_with_perms

from approvals.models import ApprovalRequest, Grant, StandingGrant
from approvals.people import Person

from .. import access, search
from ..errors import NotFound
from ..machine import EventKind, Status
from ..models import (
    Event,
    InboundEvent,
    Operation,
    Resolution,
    Run,
    Runner,
    SavedView,
    Tool,
    ToolVersion,
)
from .runner import with_approvals

# --- people (the console) ------------------------------------------------------------


def operations_visible_to(user: Person) -> QuerySet[Operation]:
    """The operations a person may see: those of the tools they may decide on or
    reconcile (``access.visible_filter``). Every list, search and page starts here."""
    return Operation.objects.filter(access.visible_filter(user, "tool_id"))


def operation_ids_visible_to(*, user: Person, ids: Iterable[str]) -> set[str]:
    """Which of ``ids`` name operations ``user`` may see (to link only those)."""
    wanted = list(ids)
    if not wanted:
        return set()
    return set(operations_visible_to(user).filter(pk__in=wanted).values_list("pk", flat=True))


def operation_get_for_user(*, user: Person, operation_id: str) -> Operation:
    op = with_approvals(operations_visible_to(user).filter(pk=operation_id)).first()
    if op is None:
        raise NotFound(f"No operation {operation_id!r}.")
    return op


def requests_pending_for_user(
    *,
    user: Person,
    tool: str | None = None,
    effect_class: str | None = None,
    run: str | None = None,
) -> QuerySet[ApprovalRequest]:
    """The inbox: pending requests the user may decide on (by the tool's permission, or
    escalated to a group of theirs), most urgent first."""
    queryset = (
        ApprovalRequest.objects.filter(
            _decidable_by(user), status=ApprovalRequest.RequestStatus.PENDING
        )
        .select_related("operation", "operation__run", "operation__tool_version")
        .prefetch_related("decisions")
        .order_by("expires_at", "created_at", "id")
    )
    if tool:
        queryset = queryset.filter(operation__tool_id=tool)
    if effect_class:
        queryset = queryset.filter(operation__effect_class=effect_class)
    if run:
        queryset = queryset.filter(operation__run_id=run)
    return queryset


def _decidable_by(user: Person, perms: list[str] | None = None) -> Q:
    """Requests of tools on which ``user`` holds ``perms`` (default: decide), or
    escalated to one of their groups while they are pending (``access.escalated_to_user``
    says the same of one request)."""
    by_tool = Q(operation__tool__in=access.tools_for_user(user, perms or [access.DECIDE]))
    if not user.is_active:
        return by_tool
    return by_tool | Q(
        escalated_at__isnull=False,
        escalate_to__in=list(user.groups.values_list("name", flat=True)),
        status=ApprovalRequest.RequestStatus.PENDING,
    )


def approval_get_for_user(*, user: Person, approval_id: str) -> ApprovalRequest:
    request = (
        ApprovalRequest.objects.filter(
            _decidable_by(user, [access.DECIDE, access.RECONCILE]), pk=approval_id
        )
        .select_related(
            "grant__standing_grant", "operation", "operation__run", "operation__tool_version"
        )
        .prefetch_related("decisions__user", "grant__standing_grant__signatures__user")
        .first()
    )
    if request is None:
        raise NotFound(f"No approval {approval_id!r}.")
    return request


def approval_comparison(request: ApprovalRequest) -> tuple[str, Operation] | None:
    """An earlier intent to compare this request with, and what it was.

    The same operation's earlier request when there is one (a new approval after a
    grant became invalid or reconciliation found nothing); otherwise the operation this
    one retries, or the latest earlier operation of the same tool in the same run.
    """
    op = request.operation
    if ApprovalRequest.objects.filter(operation=op, created_at__lt=request.created_at).exists():
        return ("an earlier request for this operation", op)
    if op.previous_id:
        label = (
            "the operation this edited copy replaces"
            if op.edits
            else "the operation this one retries"
        )
        return (label, cast(Operation, op.previous))
    earlier = (
        Operation.objects.filter(run_id=op.run_id, tool_id=op.tool_id, id__lt=op.id)
        .order_by("-id")
        .first()
    )
    if earlier is not None:
        return (f"the previous {op.tool_id} call in this run", earlier)
    return None


# --- the reconciliation queue -----------------------------------------------------------

SAVED_QUEUES = {
    "all": "Unknown and compensating",
    "to_confirm": "Waiting for your confirmation",
    "unknown_15m": "Unknown > 15 min",
    "lease_expired": "Lease expired",
    "approved_unclaimed": "Approved but never claimed",
    "probes_failing": "Probes failing",
}
STALE_AFTER = timedelta(minutes=15)
# The queues' counts read at most this many ids (no COUNT over a large ledger on every
# page): the navigation and the queue's tabs show "99+" beyond.
NAV_COUNT_CAP = 100


def _reconcilable(
    user: Person, now: datetime, *, include_snoozed: bool = False
) -> QuerySet[Operation]:
    """The operations of the tools ``user`` may reconcile, without the snoozed ones."""
    base = Operation.objects.filter(tool__in=access.tools_for_user(user, [access.RECONCILE]))
    return base if include_snoozed else base.exclude(snoozed_until__gt=now)


def _queue(
    base: QuerySet[Operation], name: str, *, user: Person, now: datetime
) -> QuerySet[Operation]:
    unresolved = [Status.OUTCOME_UNKNOWN, Status.COMPENSATING]
    if name == "to_confirm":
        # "Did not happen" proposals of someone else, waiting for this person (four eyes).
        proposed = Resolution.objects.filter(operation=OuterRef("pk"), review__isnull=True).exclude(
            declared_by=user
        )
        return base.filter(Exists(proposed), status=Status.OUTCOME_UNKNOWN)
    if name == "unknown_15m":
        return base.filter(status=Status.OUTCOME_UNKNOWN, status_changed_at__lte=now - STALE_AFTER)
    if name == "lease_expired":
        return base.filter(
            Q(status__in=unresolved, error_code="lease_expired")
            | Q(status=Status.EXECUTING, lease_until__lte=now)
        )
    if name == "approved_unclaimed":
        return base.filter(
            status=Status.READY,
            status_changed_at__lte=now - STALE_AFTER,
            approval_requests__status=ApprovalRequest.RequestStatus.APPROVED,
        ).distinct()
    if name == "probes_failing":
        return base.filter(status=Status.OUTCOME_UNKNOWN, probes__gte=1)
    return base.filter(status__in=unresolved)


def reconciliation_queue(
    *,
    user: Person,
    queue: str = "all",
    tool: str | None = None,
    effect_class: str | None = None,
    run: str | None = None,
    min_age_s: int | None = None,
    include_snoozed: bool = False,
    now: datetime | None = None,
) -> QuerySet[Operation]:
    """Operations that need a person's answer, oldest first."""
    now = now or timezone.now()
    base = _reconcilable(user, now, include_snoozed=include_snoozed)
    if tool:
        base = base.filter(tool_id=tool)
    if effect_class:
        base = base.filter(effect_class=effect_class)
    if run:
        base = base.filter(run_id=run)
    if min_age_s:
        base = base.filter(status_changed_at__lte=now - timedelta(seconds=min_age_s))
    return (
        _queue(base, queue if queue in SAVED_QUEUES else "all", user=user, now=now)
        .select_related("run", "tool_version")
        .order_by("status_changed_at", "id")
    )


def reconciliation_counts(
    *, user: Person, now: datetime | None = None, queues: Iterable[str] = SAVED_QUEUES
) -> dict[str, int]:
    """How many operations each saved queue holds for ``user`` unfiltered (snoozed ones
    left out), at most ``NAV_COUNT_CAP``: the queue's tabs and the navigation both show
    these, so they cannot disagree."""
    now = now or timezone.now()
    base = _reconcilable(user, now)
    return {
        name: len(
            _queue(base, name, user=user, now=now).values_list("pk", flat=True)[:NAV_COUNT_CAP]
        )
        for name in queues
    }


def pending_proposals(*, op_ids: list[str]) -> dict[str, Resolution]:
    """The "did not happen" proposals still waiting for a second person, by operation."""
    return {
        resolution.operation_id: resolution
        for resolution in Resolution.objects.filter(
            operation_id__in=op_ids, review__isnull=True
        ).select_related("declared_by")
    }


def nav_counts(*, user: Person) -> dict[str, int]:
    """What the console's navigation counts for this person: requests waiting for their
    decision, the operations the reconciliation queue holds for them (its first tab),
    and "did not happen" proposals of someone else waiting for their confirmation (four
    eyes; the queue's "to_confirm" tab)."""
    queues = reconciliation_counts(user=user, queues=("all", "to_confirm"))
    pending = (
        requests_pending_for_user(user=user)
        .filter(expires_at__gt=timezone.now())
        .exclude(decisions__user=user)
        .order_by()
    )
    return {
        "pending": len(pending.values_list("pk", flat=True)[:NAV_COUNT_CAP]),
        "reconciliation": queues["all"],
        "to_confirm": queues["to_confirm"],
    }


def lands_on_queue(user: Person) -> bool:
    """People who may reconcile but decide on nothing start at the reconciliation queue."""
    return (
        not access.tools_for_user(user, [access.DECIDE]).exists()
        and access.tools_for_user(user, [access.RECONCILE]).exists()
    )


def operation_trace(op: Operation) -> dict[str, Any]:
    """Everything the operation page shows about one operation, in few queries."""
    events = list(Event.objects.filter(stream=op.id).select_related("actor_user").order_by("seq"))
    return {
        "events": events,
        "attempts": list(op.attempt_set.order_by("number")),
        "approvals": list(
            op.approval_requests.select_related("grant__standing_grant")
            .prefetch_related("decisions__user", "grant__standing_grant__signatures__user")
            .order_by("created_at")
        ),
        "resolutions": list(op.resolutions.select_related("declared_by", "review", "review__user")),
        "deliveries": list(
            op.outbox_messages.select_related("endpoint")
            .prefetch_related("delivery_attempts")
            .order_by("created_at", "id")
        ),
        "probes": [
            e
            for e in events
            if e.kind in {EventKind.PROBE, EventKind.RECONCILED, EventKind.LATE_SUCCESS}
        ],
        "notes": [
            e
            for e in events
            if e.kind
            in {
                EventKind.NOTE,
                EventKind.SNOOZED,
                EventKind.RESOLUTION_PROPOSED,
                EventKind.RESOLUTION_DISPUTED,
            }
        ],
    }


def operation_last_event(op: Operation) -> Event | None:
    """The latest event of ``op`` (who did what last), for the page's live status."""
    return Event.objects.filter(stream=op.id).select_related("actor_user").order_by("-seq").first()


# --- the rest of the console: search, lists, runs, tools, audit log, dashboard --------

# States in which an operation waits for a person's answer (the reconciliation backlog).
UNRESOLVED = (Status.OUTCOME_UNKNOWN, Status.COMPENSATING)


def operation_search(*, user: Person, query: str, limit: int = 50) -> list[Operation]:
    """Operations the person may see that ``query`` names, newest first: an exact id or
    idempotency key first (minted by the server, indexed: a match there is the answer),
    else every operation whose key, call id, downstream reference, principal, ids or
    argument values contain it (``operations.search``)."""
    query = query.strip()
    if not query:
        return []
    visible = operations_visible_to(user).select_related("run", "tool_version").order_by("-id")
    minted = list(visible.filter(Q(pk=query) | Q(idempotency_key=query))[:limit])
    if minted:
        return minted
    return list(_matching(visible, query)[:limit])


def _matching(queryset: QuerySet[Operation], query: str) -> QuerySet[Operation]:
    if len(query) < search.MIN_SUBSTRING:
        exact = Q(operation_key=query) | Q(call_id=query) | Q(downstream_id=query)
        return queryset.filter(exact)
    return search.substring_filter(queryset, query)


def operations_list_for_user(
    *,
    user: Person,
    status: str | None = None,
    tool: str | None = None,
    run: str | None = None,
    q: str | None = None,
    principal: str | None = None,
    since: date | None = None,
    until: date | None = None,
) -> QuerySet[Operation]:
    """The operations list, newest first (ids sort in creation order): filtered by
    state, tool, run, text (``operation_search``'s substring match), principal (a part
    of it) and the day registered (``since`` and ``until`` inclusive, UTC)."""
    queryset = operations_visible_to(user)
    if status:
        queryset = queryset.filter(status=status)
    if tool:
        queryset = queryset.filter(tool_id=tool)
    if run:
        queryset = queryset.filter(run_id=run)
    if principal:
        queryset = queryset.filter(principal__icontains=principal)
    if since:
        queryset = queryset.filter(created_at__gte=datetime.combine(since, time.min, UTC))
    if until:
        end = datetime.combine(until, time.min, UTC) + timedelta(days=1)
        queryset = queryset.filter(created_at__lt=end)
    if q:
        queryset = _matching(queryset, q.strip())
    return queryset.select_related("run", "tool_version").order_by("-id")


def saved_views_for(*, user: Person, list_name: str) -> QuerySet[SavedView]:
    return SavedView.objects.filter(user=user, list_name=list_name).order_by("name")


def runs_for_user(user: Person) -> QuerySet[Run]:
    """Runs with at least one operation the person may see; superusers see all."""
    if not user.is_active:
        return Run.objects.none()
    names = access.visible_tool_names(user)
    if names is None:
        return Run.objects.all()
    return Run.objects.filter(
        Exists(Operation.objects.filter(run=OuterRef("pk"), tool_id__in=names))
    )


def run_events(run: Run, limit: int = 100) -> list[Event]:
    """The run's own stream (created, cancelled, expired), oldest first; for a run the
    person may see (``run_get_for_user``)."""
    return list(Event.objects.filter(stream=run.id).order_by("seq")[:limit])


def run_get_for_user(*, user: Person, run_id: str) -> Run:
    run = runs_for_user(user).select_related("runner").filter(pk=run_id).first()
    if run is None:
        raise NotFound(f"No run {run_id!r}.")
    return run


def runners_for_user(user: Person) -> QuerySet[Runner]:
    """Runner accounts with their tokens, for people who manage runners; none otherwise."""
    if not access.may_manage_runners(user):
        return Runner.objects.none()
    return Runner.objects.select_related("owner").prefetch_related("tokens").order_by("name")


def runner_get_for_user(*, user: Person, runner_id: str) -> Runner:
    runner = runners_for_user(user).filter(pk=runner_id).first()
    if runner is None:
        raise NotFound(f"No runner {runner_id!r}.")
    return runner


def runner_events(runner: Runner, limit: int = 50) -> list[Event]:
    """The runner's own stream (tokens, endpoints, changes by people), newest first."""
    return list(Event.objects.filter(stream=f"runner:{runner.id}").order_by("-seq")[:limit])


def tools_visible_to_user(user: Person) -> QuerySet[Tool]:
    """Tools whose page a person may open: deciders, reconcilers and activators, and
    people who administer tools (they transfer them and allow runners on them)."""
    if access.may_administer_tools(user):
        return Tool.objects.all()
    return access.tools_for_user(user, [access.DECIDE, access.RECONCILE, access.ACTIVATE])


def tool_get_for_user(*, user: Person, name: str) -> Tool:
    tool = tools_visible_to_user(user).select_related("active_version").filter(pk=name).first()
    if tool is None:
        raise NotFound(f"No tool {name!r}.")
    return tool


def _global_holders(codename: str) -> QuerySet[Any]:
    """Active people holding the model-wide permission, directly or through a group."""
    permission = Permission.objects.filter(
        content_type__app_label="operations", codename=codename
    ).first()
    user_model = get_user_model()
    if permission is None:
        return user_model.objects.none()
    return (
        user_model.objects.filter(is_active=True)
        .filter(Q(user_permissions=permission) | Q(groups__permissions=permission))
        .distinct()
    )


def tool_access(tool: Tool) -> list[dict[str, Any]]:
    """Who may decide on, reconcile or activate versions of ``tool``, and how.

    One row per permission: people and groups holding it on this tool, people holding
    it for every tool, and whether superusers exist (they hold every permission;
    separation of duties still applies to them).
    """
    rows = []
    superusers = list(
        get_user_model()
        .objects.filter(is_active=True, is_superuser=True)
        .order_by("username")
        .values_list("username", flat=True)
    )
    for perm, label in (
        (access.DECIDE, "Decide"),
        (access.RECONCILE, "Reconcile"),
        (access.ACTIVATE, "Activate"),
    ):
        codename = perm.split(".", 1)[1]
        users = get_users_with_perms(tool, only_with_perms_in=[codename], with_group_users=False)
        groups = get_groups_with_perms(tool, only_with_perms_in=[codename])
        rows.append(
            {
                "permission": perm,
                "label": label,
                "users": sorted(u.get_username() for u in cast(Any, users) if u.is_active),
                "groups": sorted(g.name for g in cast(Any, groups)),
                "global_users": sorted(
                    u.get_username() for u in _global_holders(codename).exclude(is_superuser=True)
                ),
                "superusers": superusers,
            }
        )
    return rows


def tool_runners(tool: Tool) -> dict[str, list[Runner]]:
    """Runners that may invoke ``tool`` (its owner unless restricted, and those allowed
    on it: ``access.runner_may_invoke``) and the other active runners."""
    runners = Runner.objects.filter(is_active=True).select_related("owner").order_by("name")
    allowed = list(runners.filter(pk__in=access.invoking_runners(tool).values("pk")))
    allowed_ids = {runner.pk for runner in allowed}
    return {
        "allowed": allowed,
        "refused": [r for r in runners if r.pk not in allowed_ids],
    }


def tool_versions(tool: Tool) -> list[ToolVersion]:
    return list(tool.versions.select_related("registered_by", "activated_by").order_by("-number"))


def events_for_user(user: Person) -> QuerySet[Event]:
    """Audit events a person may read.

    Superusers read everything. Others read the events of tools they may see: every
    event about a tool they decide on or reconcile, and the contract events (stream
    ``tool:<name>``) of tools they may activate. Events about no tool (runners, sign-ins,
    runs) are for superusers.
    """
    if access.sees_everything(user):
        return Event.objects.all()
    if not user.is_active:
        return Event.objects.none()
    seen = list(access.tools_for_user(user).values_list("name", flat=True))
    activatable = list(
        access.tools_for_user(user, [access.ACTIVATE]).values_list("name", flat=True)
    )
    return Event.objects.filter(
        Q(tool_name__in=seen)
        | Q(stream__in=[f"tool:{name}" for name in activatable if name not in seen])
    )


def _actor_filter(actor: str) -> Q:
    """Events by ``actor``: a label (``user:ann``, ``runner:bot``, ``system:sweep``) or a
    bare name. People and runners are matched through their indexed foreign keys."""
    kind, _, name = actor.partition(":") if ":" in actor else ("", "", actor)
    people = runners = []
    if kind in ("", "user"):
        people = list(get_user_model().objects.filter(username=name).values_list("pk", flat=True))
    if kind in ("", "runner"):
        runners = list(Runner.objects.filter(name=name).values_list("pk", flat=True))
    if not (people or runners):
        return Q(actor=actor if kind else f"system:{name}")
    return Q(actor_user_id__in=people) | Q(actor_runner_id__in=runners)


def audit_events(
    *,
    user: Person,
    actor: str | None = None,
    kind: str | None = None,
    tool: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[Event]:
    """The audit log, newest first. ``actor`` is a full label (``user:ann``) or a bare
    name matched against people, runners and system actors."""
    queryset = events_for_user(user)
    if actor:
        queryset = queryset.filter(_actor_filter(actor))
    if kind:
        queryset = queryset.filter(kind=kind)
    if tool:
        queryset = queryset.filter(tool_name=tool)
    if since:
        queryset = queryset.filter(at__gte=since)
    if until:
        queryset = queryset.filter(at__lt=until)
    return queryset.order_by("-id")


def inbound_events_for_user(
    *, user: Person, status: str | None = None, tool: str | None = None
) -> QuerySet[InboundEvent]:
    """Provider events of the tools a person may see, newest first."""
    queryset = InboundEvent.objects.filter(tool__in=access.tools_for_user(user)).select_related(
        "operation"
    )
    if status:
        queryset = queryset.filter(status=status)
    if tool:
        queryset = queryset.filter(tool_id=tool)
    return queryset.order_by("-received_at", "-id")


BREAKER_EVENT_KINDS = (
    EventKind.BREAKER_OPENED,
    EventKind.BREAKER_HALF_OPEN,
    EventKind.BREAKER_CLOSED,
    EventKind.BREAKER_FORCED_OPEN,
    EventKind.BREAKER_FORCED_CLOSED,
)


def tool_breaker_history(tool: Tool, limit: int = 20) -> list[Event]:
    """The latest circuit-breaker changes of a tool, newest first."""
    return list(
        Event.objects.filter(stream=f"tool:{tool.name}", kind__in=BREAKER_EVENT_KINDS).order_by(
            "-seq"
        )[:limit]
    )


# --- standing grants ----------------------------------------------------------------


def standing_grants_for_user(user: Person) -> QuerySet[StandingGrant]:
    """Standing grants of the tools whose operations ``user`` sees, newest first."""
    return (
        StandingGrant.objects.filter(access.visible_filter(user, "tool"))
        .select_related("created_by", "revoked_by")
        .prefetch_related("signatures__user")
        .order_by("-created_at", "-id")
    )


def standing_grant_get_for_user(*, user: Person, grant_id: str) -> StandingGrant:
    grant = standing_grants_for_user(user).filter(pk=grant_id).first()
    if grant is None:
        raise NotFound(f"No standing grant {grant_id!r}.")
    return grant


def standing_grant_uses(grant: StandingGrant) -> list[Grant]:
    """The grants a standing grant's uses gave, oldest first, with their operations."""
    return list(
        Grant.objects.filter(standing_grant=grant)
        .select_related("request__operation")
        .order_by("created_at", "id")
    )


def standing_grant_events(grant: StandingGrant) -> list[Event]:
    return list(Event.objects.filter(stream=f"sgr:{grant.id}").order_by("seq"))


def run_with_runner(run_id: str) -> Run | None:
    """The run ``run_id`` names with its runner (whose principal and owner a standing
    grant for that run bars), or None for "" (any run) or an unknown id."""
    return Run.objects.select_related("runner").filter(pk=run_id).first() if run_id else None


def tools_decidable_by(user: Person) -> QuerySet[Tool]:
    """Tools ``user`` holds the decide permission on, for whom a standing grant may be
    issued (who may sign is ``access.standing_sign_refusal``'s answer)."""
    return (
        access.tools_for_user(user, [access.DECIDE]).exclude(active_version=None).order_by("name")
    )
