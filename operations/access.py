"""Every "may this person / runner do X" answer, and the permission names, once.

The services call these functions to enforce; the views, templates and selectors call
the same functions to decide what to show and list, so the button a person sees and
the refusal they would get cannot disagree (docs/architecture.md). A ``*_refusal`` function
answers why not (a sentence for the person) or None; a ``may_*`` function answers yes
or no; a ``require_*`` function raises ``PermissionRefused``.

Object permissions are django-guardian's, per tool; a global permission (a user's or a
group's) counts for every tool. Superusers hold every permission, but no rule here
exempts them from separation of duties.
"""

import hmac
import ipaddress
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.db.models import Q, QuerySet
from guardian.core import ObjectPermissionChecker
from guardian.shortcuts import get_groups_with_perms, get_objects_for_user, get_users_with_perms

from approvals.errors import PermissionRefused
from approvals.models import ApprovalRequest, StandingGrant
from approvals.people import Person

from .machine import EffectClass
from .models import Operation, Policy, PolicyVersion, Run, Runner, Tool, ToolVersion

# Permission names (codenames declared in operations.models.Tool.Meta and the built-in
# model permissions of Run and Runner).
DECIDE = "operations.decide_tool"
RECONCILE = "operations.reconcile_tool"
ACTIVATE = "operations.activate_tool"
INVOKE = "operations.invoke_tool"
CANCEL_RUN = "operations.change_run"
MANAGE_RUNNERS = "operations.change_runner"
MANAGE_TOOL_PERMISSIONS = "operations.change_tool"
# People's policies (docs/policies.md): a global permission; runners never hold it.
MANAGE_POLICIES = "operations.manage_policies"
# The object permissions people hold on a tool. ``INVOKE`` is a runner's, set only by
# ``services.tool_invoker_set``.
PEOPLE_TOOL_PERMISSIONS = (DECIDE, RECONCILE, ACTIVATE)

SECOND_FACTOR_REFUSAL = (
    "Deciding on this operation needs a one-time password: verify your session with "
    "your authenticator app first."
)


def _holds(user: Person, perm: str, tool: Tool | None = None) -> bool:
    """An active person holding ``perm`` everywhere or, when ``tool`` is given, on it.

    Django's model backend ignores global permissions when asked about an object, so
    both are asked: a permission given for every tool lets a person act on each, as it
    lets them see each (``tools_for_user``).
    """
    if not user.is_active:
        return False
    if user.has_perm(perm):
        return True
    return tool is not None and bool(user.has_perm(perm, tool))


# ---------------------------------------------------------------------------------------
# Runners


def runner_owns(runner: Runner, tool: Tool) -> bool:
    """The owner changes the contract (and with it the breaker) and allows others."""
    return tool.owner_id == runner.pk


def runner_may_invoke(runner: Runner, tool: Tool) -> bool:
    """A runner invokes the tools it owns and those it was allowed on (``invoke_tool``
    on its service user, given by the tool's owner or a person); a restricted runner
    (``restrict_tools``) only the ones it was allowed on."""
    if not runner.restrict_tools and runner_owns(runner, tool):
        return True
    return bool(runner.service_user.has_perm(INVOKE, tool))


def runner_event_filter(runner: Runner) -> Q:
    """The events whose inclusion in the transparency log a runner may ask to prove:
    those of its own operations and runs, of its own stream (``runner:<id>``) and of the
    contract streams of the tools it owns. Any other event answers ``not_found``, as an
    operation of another runner does."""
    tools = Tool.objects.filter(owner_id=runner.pk).values_list("name", flat=True)
    return (
        Q(operation__runner_id=runner.pk)
        | Q(run__runner_id=runner.pk)
        | Q(stream=f"runner:{runner.pk}")
        | Q(stream__in=[f"tool:{name}" for name in tools])
    )


def invoking_runners(tool: Tool) -> QuerySet[Runner]:
    """Every runner that may invoke ``tool`` now, active or not (``runner_may_invoke``
    of each, in one query): its owner unless restricted, and those whose service user
    holds ``invoke_tool`` on it, for every tool, or through a group."""
    app_label, codename = INVOKE.split(".", 1)
    granted = get_users_with_perms(tool, only_with_perms_in=[codename], with_group_users=True)
    permission = Permission.objects.filter(content_type__app_label=app_label, codename=codename)
    may = (
        Q(service_user__in=granted)
        | Q(service_user__user_permissions__in=permission)
        | Q(service_user__groups__permissions__in=permission)
    )
    if tool.owner_id is not None:
        may |= Q(pk=tool.owner_id, restrict_tools=False)
    return Runner.objects.filter(may).distinct()


# ---------------------------------------------------------------------------------------
# Deciding on approval requests


def may_hold_decide(user: Person, tool: Tool) -> bool:
    """The permission part of deciding: also asked of each decider at every claim."""
    return _holds(user, DECIDE, tool)


def escalated_to_user(user: Person, request: ApprovalRequest) -> bool:
    """Whether ``request`` was escalated (contract ``approval.escalate_to``) to a group
    ``user`` belongs to: its members may decide it as if they held the permission."""
    return bool(
        user.is_active
        and request.escalated_at is not None
        and request.escalate_to
        and user.groups.filter(name=request.escalate_to).exists()
    )


def may_decide_on(user: Person, *, request: ApprovalRequest, tool: Tool) -> bool:
    """The permission part of deciding on one request: the tool's permission, or its
    escalation group. Asked when deciding and of each decider again at every claim."""
    if policy_group_refusal(user, request) is not None:
        return False
    return may_hold_decide(user, tool) or escalated_to_user(user, request)


def escalation_members(request: ApprovalRequest) -> list[Person]:
    """Active members of the group ``request`` was escalated to (whom to tell)."""
    if request.escalated_at is None or not request.escalate_to:
        return []
    return list(get_user_model().objects.filter(groups__name=request.escalate_to, is_active=True))


def decision_needs_second_factor(op: Operation) -> bool:
    """Whether deciding on ``op`` needs a session verified with a one-time password.

    With ``REQUIRE_TOTP_FOR_IRREVERSIBLE`` on, approving or rejecting an irreversible
    operation does; the decision service refuses a decision without it, so every way to
    decide (console, admin, anything added later) is covered by one rule.
    """
    return bool(
        settings.REQUIRE_TOTP_FOR_IRREVERSIBLE and op.effect_class == EffectClass.IRREVERSIBLE
    )


def principal_user_ids(principal: str) -> set[int]:
    """The people a principal names now: ``user:<username>``, compared as identities
    (NFKC, case-folded), so ``user:ALICE`` names alice, and a person created after the
    operation is named too."""
    if not principal.startswith("user:"):
        return set()
    name = _identity(principal[len("user:") :])
    # Compared in Python: a database's case-insensitive match is not NFKC case folding
    # ("Straße" folds to "strasse"); people are few, runners' service users excluded.
    people = get_user_model().objects.exclude(username__startswith="runner:")
    return {
        pk for pk, username in people.values_list("pk", "username") if _identity(username) == name
    }


def _identity(username: str) -> str:
    return unicodedata.normalize("NFKC", username).casefold()


def barred_at_open(op: Operation, *, also: Iterable[int | None] = ()) -> list[int]:
    """Who may not decide on an approval request opened now for ``op`` (separation of
    duties), sorted, as the request records them in its context's ``barred_user_ids``
    (and its opening event in its terms): the person its principal named at
    registration, its runner's owner, and ``also``: whoever declared the "did not
    happen" that led to the request, or whom the request it replaces barred."""
    barred = {op.principal_user_id, op.runner.owner_id, *also}
    return sorted(pk for pk in barred if pk is not None)


def barred_user_ids(*, request: ApprovalRequest, op: Operation) -> set[int]:
    """Who may not decide on ``request``, judged now: everyone it recorded when it
    opened, everyone opening it now would bar (``barred_at_open``: the runner may have
    changed hands since), and the people the principal names now (someone created or
    renamed since the registration)."""
    return {
        *request.context.get("barred_user_ids", []),
        *barred_at_open(op),
        *principal_user_ids(op.principal),
    }


def decide_refusal(
    *, user: Person, request: ApprovalRequest, op: Operation, otp_verified: bool = False
) -> str | None:
    """Why ``user`` may not decide on ``request`` now, or None if they may.

    Superusers are not exempt: separation of duties exists so that no single person
    moves money alone.
    """
    if not user.is_active:
        return "Your account is inactive."
    group_refusal = policy_group_refusal(user, request)
    if group_refusal is not None:
        return group_refusal
    if not may_decide_on(user, request=request, tool=op.tool):
        return "You do not hold the permission to decide for this tool."
    if user.pk in barred_user_ids(request=request, op=op):
        return (
            "You cannot decide on this operation: you are its principal, its runner's "
            "owner, or you declared the reconciliation that led to this request."
        )
    if request.decisions.filter(user=user).exists():
        return "You have already decided on this request; a quorum needs distinct people."
    needs_factor = decision_needs_second_factor(op) or bool(
        policy_terms(request).get("second_factor")
    )
    if needs_factor and not otp_verified:
        return SECOND_FACTOR_REFUSAL
    return None


def may_revoke(user: Person, tool: Tool) -> bool:
    return may_hold_decide(user, tool)


# ---------------------------------------------------------------------------------------
# Standing grants: approval given in advance, under the same rules as the approvals it
# replaces


def standing_barred_user_ids(*, tool: Tool, principal: str, run: Run | None) -> set[int]:
    """Who may never sign a standing grant for ``tool`` and ``principal`` (``""``:
    any) in ``run`` (None: any run): the people the principal names, the owner of every
    runner that may invoke the tool, and, for one run, its principal's people and its
    runner's owner. They would be approving in advance what they run or ask for."""
    barred = set(invoking_runners(tool).exclude(owner=None).values_list("owner_id", flat=True))
    barred |= principal_user_ids(principal)
    if run is not None:
        barred |= principal_user_ids(run.principal)
        barred |= {pk for pk in (run.principal_user_id, run.runner.owner_id) if pk is not None}
    return barred


def standing_needs_second_factor(tool: Tool) -> bool:
    """Whether signing a standing grant for ``tool`` needs a verified session: when
    deciding on its operations does (``decision_needs_second_factor``, by the effect
    class of its active contract)."""
    version = tool.active_version
    return bool(
        settings.REQUIRE_TOTP_FOR_IRREVERSIBLE
        and version is not None
        and version.effect_class == EffectClass.IRREVERSIBLE
    )


def standing_sign_refusal(
    *,
    user: Person,
    tool: Tool,
    principal: str,
    run: Run | None,
    signed_by: Iterable[int] = (),
    otp_verified: bool = False,
) -> str | None:
    """Why ``user`` may not issue or sign a standing grant for ``tool``, ``principal``
    and ``run`` now, or None if they may: the rule of deciding on one of its operations
    (``decide_refusal``), judged for the whole family. ``signed_by``: who signed it
    already.
    """
    if not user.is_active:
        return "Your account is inactive."
    if not may_hold_decide(user, tool):
        return "You do not hold the permission to decide for this tool."
    if user.pk in standing_barred_user_ids(tool=tool, principal=principal, run=run):
        return (
            "You cannot sign a standing grant for this tool: you own a runner that may "
            "invoke it, or you are the principal it covers."
        )
    if user.pk in set(signed_by):
        return "You have already signed this standing grant; a quorum needs distinct people."
    if standing_needs_second_factor(tool) and not otp_verified:
        return SECOND_FACTOR_REFUSAL
    return None


def standing_use_refusal(
    *, grant: StandingGrant, signers: Sequence[Person], op: Operation
) -> str | None:
    """Why a use of ``grant`` may not approve ``op``, or None: every signer must still
    hold the permission to decide, none may be barred from deciding on ``op`` (its
    principal, its runner's owner: a grant for any principal signed by a person who is
    this one's), and when deciding on ``op`` needs a second factor, every signature
    must have had one."""
    barred = {*barred_at_open(op), *principal_user_ids(op.principal)}
    for signer in signers:
        if not may_hold_decide(signer, op.tool):
            return f"{signer.get_username()} no longer holds the permission to decide"
        if signer.pk in barred:
            return f"{signer.get_username()} may not decide on this operation"
    if decision_needs_second_factor(op) and grant.signatures.filter(second_factor=False).exists():
        return "a signature was given without a second factor"
    return None


def may_revoke_standing(user: Person, tool: Tool) -> bool:
    """Who may revoke a standing grant: anyone who may decide on the tool (revoking
    takes authority away, so nobody is barred from it)."""
    return may_hold_decide(user, tool)


def require_revoke(user: Person, tool: Tool) -> None:
    if not may_revoke(user, tool):
        raise PermissionRefused("You may not revoke grants for this tool.")


# ---------------------------------------------------------------------------------------
# Reconciling, redelivering


def may_reconcile(user: Person, tool: Tool) -> bool:
    return _holds(user, RECONCILE, tool)


def require_reconcile(user: Person, tool: Tool) -> None:
    if not may_reconcile(user, tool):
        raise PermissionRefused(f"You may not reconcile operations of {tool.name}.")


def may_redeliver(user: Person, op: Operation) -> bool:
    """People who decide on or reconcile a tool may ask for a webhook again."""
    return may_reconcile(user, op.tool) or may_hold_decide(user, op.tool)


# ---------------------------------------------------------------------------------------
# Tools: activation and breakers


def activate_refusal(user: Person, version: ToolVersion) -> str | None:
    """Why ``user`` may not activate ``version``, or None. The owner of the runner that
    registered it never may: a leaked runner token must not switch protection off with
    its owner's help."""
    if not _holds(user, ACTIVATE, version.tool):
        return "You may not activate versions of this tool."
    registering_runner = version.registered_by
    owners = {version.registering_owner_id}
    if registering_runner is not None:
        owners.add(registering_runner.owner_id)
    if user.pk in owners:
        return "You own the runner that registered this version; someone else must activate it."
    return None


# ---------------------------------------------------------------------------------------
# People's policies


def may_manage_policies(user: Person) -> bool:
    """Write, shadow, simulate and retire policies (and see them: runners never do)."""
    return _holds(user, MANAGE_POLICIES)


def require_manage_policies(user: Person) -> None:
    if not may_manage_policies(user):
        raise PermissionRefused("You may not manage policies.")


def may_simulate_contract(user: Person, tool: Tool) -> bool:
    """Replay past registrations against a contract version of ``tool``
    (``services.contract_simulate``): people who manage policies, and those who may
    activate the tool's versions, whose decision it informs."""
    return may_manage_policies(user) or _holds(user, ACTIVATE, tool)


def require_simulate_contract(user: Person, tool: Tool) -> None:
    if not may_simulate_contract(user, tool):
        raise PermissionRefused("You may not simulate versions of this tool.")


def policy_activate_refusal(user: Person, version: PolicyVersion) -> str | None:
    """Why ``user`` may not put ``version`` in force, or None: four eyes, so never the
    person who wrote that text."""
    if not may_manage_policies(user):
        return "You may not manage policies."
    if version.written_by_id == user.pk:
        return (
            f"You wrote version {version.number} of {version.policy_id}; another person "
            "who manages policies must activate it."
        )
    return None


def policy_shadow_refusal(user: Person, policy: Policy, version: PolicyVersion) -> str | None:
    """Why ``user`` may not watch ``version`` in shadow, or None: one person may (nothing
    is enforced), but not a version already in force."""
    if not may_manage_policies(user):
        return "You may not manage policies."
    if policy.active_version_id == version.pk:
        return f"Version {version.number} of {policy.pk} is already in force."
    return None


def policy_retire_refusal(user: Person, policy: Policy) -> str | None:
    """Why ``user`` may not retire ``policy``, or None: one person may (docs/policies.md),
    unless it is retired already."""
    if not may_manage_policies(user):
        return "You may not manage policies."
    if policy.state == Policy.State.RETIRED:
        return f"Policy {policy.pk} is retired already."
    return None


def policy_terms(request: ApprovalRequest) -> dict[str, Any]:
    """What the policies that asked for ``request`` require beyond the contract (the
    groups a decider belongs to, a second factor), as recorded when it opened."""
    terms = request.context.get("policy_terms") if isinstance(request.context, dict) else None
    return terms if isinstance(terms, dict) else {}


def policy_group_refusal(user: Person, request: ApprovalRequest) -> str | None:
    """Why ``user``'s groups do not let them decide ``request``, or None: a policy's
    ``@group`` asks for a member of each group it names."""
    groups = [g for g in policy_terms(request).get("groups", []) if isinstance(g, str)]
    if not groups:
        return None
    held = set(user.groups.filter(name__in=groups).values_list("name", flat=True))
    missing = [g for g in groups if g not in held]
    if missing:
        return f"A policy asks for a member of {', '.join(missing)} to decide this operation."
    return None


TOOL_PERMISSION_LABELS = ((DECIDE, "decide"), (RECONCILE, "reconcile"), (ACTIVATE, "activate"))


def tool_permissions_held(user: Person, tools: Sequence[Tool]) -> dict[str, list[str]]:
    """For each of ``tools``, which of decide / reconcile / activate ``user`` holds; one
    query for the object permissions of them all."""
    if not user.is_active:
        return {tool.name: [] for tool in tools}
    checker = ObjectPermissionChecker(user)
    checker.prefetch_perms(tools)  # type: ignore[arg-type]  # any sequence works; stubs: QuerySet
    everywhere = {perm for perm, _ in TOOL_PERMISSION_LABELS if user.has_perm(perm)}
    return {
        tool.name: [
            label
            for perm, label in TOOL_PERMISSION_LABELS
            if perm in everywhere or checker.has_perm(perm.split(".", 1)[1], tool)
        ]
        for tool in tools
    }


def may_manage_tool_permissions(user: Person) -> bool:
    """Who may set who decides, reconciles and activates on a tool (the admin's object
    permission pages): the built-in model permission ``operations.change_tool``. No
    column of a tool changes in the admin; this is all that permission allows."""
    return _holds(user, MANAGE_TOOL_PERMISSIONS)


def require_manage_tool_permissions(user: Person) -> None:
    if not may_manage_tool_permissions(user):
        raise PermissionRefused("Setting permissions on tools needs the 'change tool' permission.")


def may_operate_breaker(user: Person, tool: Tool) -> bool:
    return _holds(user, ACTIVATE, tool)


def require_operate_breaker(user: Person, tool: Tool) -> None:
    if not may_operate_breaker(user, tool):
        raise PermissionRefused("You may not operate the circuit breaker of this tool.")


# ---------------------------------------------------------------------------------------
# Runs and runners


def may_administer_tools(user: Person) -> bool:
    """Who may transfer a tool to another runner and allow runners on it: those who
    manage runners (the ``change runner`` permission)."""
    return may_manage_runners(user)


def require_administer_tools(user: Person) -> None:
    if not may_administer_tools(user):
        raise PermissionRefused("Transferring tools needs the 'change runner' permission.")


def may_cancel_run(user: Person) -> bool:
    return _holds(user, CANCEL_RUN)


def require_cancel_run(user: Person) -> None:
    if not may_cancel_run(user):
        raise PermissionRefused("Cancelling runs needs the 'change run' permission.")


def may_manage_runners(user: Person) -> bool:
    """Who may list runners' tokens, issue and revoke them: the built-in model
    permission ``operations.change_runner`` (superusers hold every permission)."""
    return _holds(user, MANAGE_RUNNERS)


def require_manage_runners(user: Person) -> None:
    if not may_manage_runners(user):
        raise PermissionRefused("Managing runner tokens needs the 'change runner' permission.")


# ---------------------------------------------------------------------------------------
# What a person sees


def tools_for_user(user: Person, perms: list[str] | None = None) -> QuerySet[Tool]:
    """Tools on which ``user`` holds any of ``perms`` (default: decide or reconcile)."""
    if not user.is_active:
        return Tool.objects.none()
    return get_objects_for_user(
        user, perms or [DECIDE, RECONCILE], klass=Tool, any_perm=True, accept_global_perms=True
    )


def people_holding(perm: str, tool: Tool) -> list[Person]:
    """Active people holding ``perm`` on ``tool``: on it, through a group, or for every
    tool; superusers by that status alone are left out. Whom to tell (notifications); each
    act is still judged by the rules above when it happens."""
    app_label, codename = perm.split(".")
    direct = get_users_with_perms(
        tool, only_with_perms_in=[codename], with_group_users=True, with_superusers=False
    )
    permission = Permission.objects.get(codename=codename, content_type__app_label=app_label)
    global_holders = get_user_model().objects.filter(
        Q(user_permissions=permission) | Q(groups__permissions=permission)
    )
    people = {user.pk: user for user in [*direct, *global_holders]}
    return [user for user in people.values() if user.is_active]


def deciding_groups(tool: Tool) -> list[Group]:
    """The groups whose members may decide ``tool``'s requests: by a permission on the
    tool or for every tool (where its approval requests are posted)."""
    app_label, codename = DECIDE.split(".")
    on_tool: dict[Group, list[str]] = get_groups_with_perms(tool, attach_perms=True)  # type: ignore[assignment]
    groups = {group.pk: group for group, perms in on_tool.items() if codename in perms}
    for group in Group.objects.filter(
        permissions__codename=codename, permissions__content_type__app_label=app_label
    ):
        groups[group.pk] = group
    return sorted(groups.values(), key=lambda group: group.name)


def may_scrape_metrics(*, authorization: str, address: str) -> bool:
    """Whether a scraper may read ``/metrics``: it sends ``Authorization: Bearer
    <METRICS_TOKEN>``, or connects from an address in ``METRICS_ALLOWED_HOSTS`` (IP
    addresses and CIDR ranges). Neither configured: nobody."""
    token = settings.METRICS_TOKEN
    if token and authorization.startswith("Bearer "):
        return hmac.compare_digest(authorization.removeprefix("Bearer ").encode(), token.encode())
    try:
        client = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(client in network for network in settings.METRICS_ALLOWED_NETWORKS)


def sees_everything(user: Person) -> bool:
    return bool(user.is_active and user.is_superuser)


def visible_tool_names(user: Person) -> list[str] | None:
    """The names of the tools whose operations ``user`` sees (those they may decide on
    or reconcile), or None for every tool. The tools table is small; a literal list
    (rather than the permission subquery) lets the database plan the big tables' scans
    well."""
    if sees_everything(user):
        return None
    names = list(tools_for_user(user).values_list("name", flat=True))
    if len(names) == Tool.objects.count():
        return None
    return names


def visible_filter(user: Person, field: str) -> Q:
    """A filter on ``field`` (a tool name column) keeping what ``user`` may see."""
    if not user.is_active:
        return Q(pk__in=[])
    names = visible_tool_names(user)
    return Q() if names is None else Q(**{f"{field}__in": names})
