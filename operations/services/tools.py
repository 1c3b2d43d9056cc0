"""Tool contracts: versions and their activation by a person; ownership of a tool, the
runners allowed to invoke it and the people allowed to decide, reconcile and activate."""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.utils import timezone
from guardian.shortcuts import assign_perm, get_group_perms, get_user_perms, remove_perm

from approvals.errors import PermissionRefused
from approvals.people import Person

from .. import access, errors
from ..canonical import sha256_hex
from ..contracts import normalize_contract, weakenings
from ..hosts import lookup_policy
from ..machine import EffectClass, EventKind
from ..models import (
    Runner,
    Tool,
    ToolVersion,
)
from . import policies
from .core import (
    Actor,
    event_append,
)


@dataclass(frozen=True)
class ToolRegistration:
    version: ToolVersion
    created: bool  # the tool did not exist before
    changed: bool  # a new version was stored


def _lock_or_create_tool(name: str, *, runner: Runner) -> tuple[Tool, bool]:
    tool = Tool.objects.select_for_update().filter(pk=name).first()
    if tool is not None:
        return tool, False
    try:
        with transaction.atomic():
            return Tool.objects.create(name=name, owner=runner), True
    except IntegrityError:
        return Tool.objects.select_for_update().get(pk=name), False


def _require_owner(tool: Tool, runner: Runner) -> None:
    if access.runner_owns(runner, tool):
        return
    if tool.owner_id is None:
        raise errors.ToolNotOwned(
            f"No runner owns {tool.name}; a person must transfer it to one first."
        )
    raise errors.ToolNotOwned(
        f"{tool.name} belongs to another runner; only its owner changes its contract or "
        "allows other runners on it."
    )


def _require_lookup_host_possible(contract: dict[str, Any]) -> None:
    """Refuse a lookup URL whose host ``RECONCILE_ALLOWED_HOSTS`` can never admit: each
    of its lookups would fail until ``max_probes`` ran out. Decided without DNS (the name
    may resolve only where workers run); the connection itself is checked at lookup time.
    """
    url = contract["reconcile"]["url"]
    if contract["reconcile"]["mode"] != "lookup" or not url:
        return
    host = urlsplit(url).hostname or ""
    if not lookup_policy().host_possible(host):
        raise errors.UrlNotAllowed(
            f"reconcile.url: lookups may not connect to {host}, so every lookup would "
            "fail. They connect only to hosts listed in RECONCILE_ALLOWED_HOSTS (names or "
            "CIDR ranges; a public address only when listed, a link-local one only in a "
            "listed range)."
        )


class ActivationPolicy(Protocol):
    """A source of reasons to hold a version for a person: the same question and answer
    as ``_activation_holds``."""

    def __call__(
        self, *, tool: Tool, active: ToolVersion | None, contract: dict[str, Any]
    ) -> list[str]: ...


def _setting_holds(
    *, tool: Tool, active: ToolVersion | None, contract: dict[str, Any]
) -> list[str]:
    """What ``HOLD_NEW_TOOLS`` holds: with ``irreversible``, every version of a new
    irreversible tool (a tool is new until a version of it is active, so the first one
    a person activates) and a version that makes a tool irreversible; with ``all``,
    those and every version of any new tool."""
    mode = settings.HOLD_NEW_TOOLS
    if mode == "none":
        return []
    irreversible = contract["effect_class"] == EffectClass.IRREVERSIBLE
    setting = f'HOLD_NEW_TOOLS is "{mode}"'
    if active is None:
        if mode == "all" or irreversible:
            noun = "irreversible tool" if irreversible else "tool"
            return [
                f"{tool.name} is a new {noun} (no version of it is active yet), and "
                f"{setting}: a person activates it"
            ]
        return []
    was = active.contract["effect_class"]
    if irreversible and was != EffectClass.IRREVERSIBLE:
        return [
            f"this version makes {tool.name} irreversible (it was {was}), and {setting}: a "
            "person activates it"
        ]
    return []


def _activation_holds(
    *,
    tool: Tool,
    active: ToolVersion | None,
    contract: dict[str, Any],
    policies: Sequence[ActivationPolicy] = (),
) -> list[str]:
    """Why a person must activate this version of ``tool`` although the strength proof
    may let it activate by itself (empty: nothing holds it); ``active`` is the tool's
    version in force, or None for a new tool.

    The one place that decides it, from the deployment's ``HOLD_NEW_TOOLS``
    (``_setting_holds``), then each of ``policies`` in order: the hook for policies
    people own about ``Action::"activate"`` (Cedar), which add reasons of their own and
    can never take one of the setting's away. A held version is stored and activated as
    a weakening one is: inactive, its reasons in ``weakens``, until a person who does
    not own the registering runner activates it (``tool_version_activate``).
    """
    reasons = _setting_holds(tool=tool, active=active, contract=contract)
    for policy in policies:
        reasons.extend(policy(tool=tool, active=active, contract=contract))
    return list(dict.fromkeys(reasons))


def tool_register(*, name: str, body: Any, runner: Runner) -> ToolRegistration:
    """Store a contract as a new version if it differs from the latest one.

    The runner that registers a tool first owns it; any other runner is refused
    (``tool_not_owned``) before anything is written. A version that weakens the active
    one, or that ``_activation_holds`` holds (``HOLD_NEW_TOOLS``), is stored inactive
    with the reasons in ``weakens``; a person allowed to activate tools (never the
    registering runner's owner) must activate it. A lookup URL whose host the deployment never
    lets lookups reach is refused (``url_not_allowed``), even in an unchanged contract.
    """
    contract = normalize_contract(body)
    _require_lookup_host_possible(contract)
    digest = sha256_hex(contract)
    actor = Actor.of_runner(runner)
    with transaction.atomic():
        tool, created = _lock_or_create_tool(name, runner=runner)
        _require_owner(tool, runner)
        latest = tool.versions.order_by("-number").first()
        if latest is not None and latest.contract_hash == digest:
            return ToolRegistration(version=latest, created=False, changed=False)
        active = tool.active_version
        weakened = weakenings(active.contract, contract) if active is not None else []
        number = latest.number + 1 if latest else 1

        def policy_holds(
            *, tool: Tool, active: ToolVersion | None, contract: dict[str, Any]
        ) -> list[str]:
            # People's policies on Action::"activate" (docs/policies.md).
            return policies.activation_holds(
                policies.activation_facts(
                    runner=runner,
                    tool=tool,
                    contract=contract,
                    first_version=active is None,
                    number=number,
                )
            )

        holds = _activation_holds(
            tool=tool, active=active, contract=contract, policies=(policy_holds,)
        )
        reasons = weakened + holds
        now = timezone.now()
        version = ToolVersion.objects.create(
            tool=tool,
            number=number,
            contract=contract,
            contract_hash=digest,
            weakens=reasons,
            registered_by=runner,
            registering_owner_id=runner.owner_id,
            activated_at=None if reasons else now,
        )
        if not reasons:
            tool.active_version = version
            tool.save(update_fields=["active_version"])
        event_append(
            stream=f"tool:{tool.name}",
            kind=EventKind.CONTRACT_REGISTERED,
            actor=actor,
            tool_name=tool.name,
            data={
                "version": version.number,
                "active": not reasons,
                "weakens": weakened,
                "holds": holds,
                "contract_hash": digest,
            },
            now=now,
        )
    return ToolRegistration(version=version, created=created, changed=True)


def tool_version_activate(*, version: ToolVersion, user: Person) -> ToolVersion:
    """Make ``version`` the active contract of its tool (a person's decision)."""
    tool = version.tool
    refusal = access.activate_refusal(user, version)
    if refusal is not None:
        raise PermissionRefused(refusal)
    with transaction.atomic():
        tool = Tool.objects.select_for_update().get(pk=tool.pk)
        previous = tool.active_version_id
        now = timezone.now()
        ToolVersion.objects.filter(pk=version.pk).update(activated_at=now, activated_by=user)
        tool.active_version = version
        tool.save(update_fields=["active_version"])
        event_append(
            stream=f"tool:{tool.name}",
            kind=EventKind.CONTRACT_ACTIVATED,
            actor=Actor.of_user(user),
            tool_name=tool.name,
            data={"version": version.number, "previous_version_id": previous},
            now=now,
        )
    version.refresh_from_db()
    return version


def tool_transfer(*, tool: Tool, to_runner: Runner, user: Person) -> Tool:
    """A person gives a tool to another runner, which then owns its contract."""
    access.require_administer_tools(user)
    with transaction.atomic():
        tool = Tool.objects.select_for_update().get(pk=tool.pk)
        previous = tool.owner
        if previous is not None and previous.pk == to_runner.pk:
            return tool
        tool.owner = to_runner
        tool.save(update_fields=["owner"])
        event_append(
            stream=f"tool:{tool.name}",
            kind=EventKind.TOOL_TRANSFERRED,
            actor=Actor.of_user(user),
            tool_name=tool.name,
            data={"from": previous.name if previous else None, "to": to_runner.name},
        )
    return tool


def tool_invoker_set(*, tool: Tool, runner: Runner, allow: bool, actor: Actor) -> Tool:
    """Allow ``runner`` to invoke ``tool``, or take that away.

    The tool's owner (a runner actor) or a person who administers tools decides; it is
    an ``invoke_tool`` object permission on the runner's service user, so a restricted
    runner is allowed the same way. A runner never changes its own permission: a
    runner a person restricted cannot allow itself back onto its own tool.
    """
    if actor.runner is None:
        if actor.user is None:
            raise PermissionRefused(
                "A tool's owner or a person who manages runners allows runners on a tool."
            )
        access.require_administer_tools(actor.user)
    elif actor.runner.pk == runner.pk:
        raise errors.ToolNotOwned(
            "A runner cannot change its own permission on a tool; a person decides that."
        )
    with transaction.atomic():
        tool = Tool.objects.select_for_update().get(pk=tool.pk)
        # Judged on the locked row: a transfer that committed meanwhile wins.
        if actor.runner is not None:
            _require_owner(tool, actor.runner)
        holds = runner.service_user.has_perm(access.INVOKE, tool)
        if holds == allow:
            return tool
        if allow:
            assign_perm(access.INVOKE, runner.service_user, tool)
        else:
            remove_perm(access.INVOKE, runner.service_user, tool)
        event_append(
            stream=f"tool:{tool.name}",
            kind=EventKind.TOOL_INVOKER_ALLOWED if allow else EventKind.TOOL_INVOKER_REMOVED,
            actor=actor,
            tool_name=tool.name,
            data={"runner": runner.name},
        )
    return tool


def tool_permissions_set(
    *, tool: Tool, holder: Person | Group, perms: Collection[str], user: Person
) -> Tool:
    """Set which of decide, reconcile and activate (codenames) ``holder``, a person or a
    group, holds on ``tool``; the admin's object permission pages call this.

    Approvals, reconciliation and activation rest on who holds these, so each change is
    an event on the tool's stream naming the holder, what was granted and what was
    taken away. Permissions outside those three (a runner's ``invoke_tool``) are left
    as they are.
    """
    access.require_manage_tool_permissions(user)
    offered = {perm.split(".", 1)[1] for perm in access.PEOPLE_TOOL_PERMISSIONS}
    wanted = set(perms)
    if not wanted <= offered:
        raise errors.InvalidRequest(f"Only {', '.join(sorted(offered))} are set here.")
    is_group = isinstance(holder, Group)
    with transaction.atomic():
        tool = Tool.objects.select_for_update().get(pk=tool.pk)
        held = get_group_perms(holder, tool) if is_group else get_user_perms(holder, tool)
        current = set(held) & offered
        granted, revoked = sorted(wanted - current), sorted(current - wanted)
        if not granted and not revoked:
            return tool
        for perm in revoked:
            remove_perm(perm, holder, tool)
        for perm in granted:
            assign_perm(perm, holder, tool)
        event_append(
            stream=f"tool:{tool.name}",
            kind=EventKind.TOOL_PERMISSIONS_CHANGED,
            actor=Actor.of_user(user),
            tool_name=tool.name,
            data={
                "holder": (
                    f"group:{holder.name}"
                    if isinstance(holder, Group)
                    else f"user:{holder.get_username()}"
                ),
                "granted": granted,
                "revoked": revoked,
            },
        )
    return tool
