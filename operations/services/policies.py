"""People's policies (docs/policies.md): writing, shadowing, activating with four eyes,
retiring; the policies in force at a registration; what they say of it.

A policy's life is ``draft`` -> ``shadow`` -> ``active`` -> ``retired``: each change is
one transaction on the policy's locked row with its event on the stream ``policy:<id>``
(``audit verify`` replays them). A new text of an active policy is a draft version
beside the active one until a second person activates it; the active text stays in
force meanwhile.

The policies in force are remembered by each process under the *policy generation*
(operations/tokencache.py, migration 0014), which a trigger moves in the transaction
of any change: a registration that starts after the change committed reads the new
value and loads the new policies, on every process. Runners never read policies: no
API route leads here.
"""

import logging
import threading
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from approvals.errors import PermissionRefused
from approvals.people import Person

from .. import access, tokencache
from ..canonical import sha256_hex
from ..machine import EventKind
from ..models import Policy, PolicyVersion, Run, Runner, Tool, ToolVersion
from ..policies import cedar
from ..policies.errors import PolicyInvalid
from .core import Actor, event_append

logger = logging.getLogger(__name__)
State = Policy.State


def stream_of(policy_id: str) -> str:
    return f"policy:{policy_id}"


def active_contracts() -> dict[str, dict[str, Any]]:
    """Every tool's active contract, by tool name: what a policy is validated against."""
    rows = ToolVersion.objects.filter(tool__active_version_id=F("id")).values_list(
        "tool_id", "contract"
    )
    return dict(rows)


def policy_validate(text: str) -> cedar.Policy:
    """Parse and validate ``text`` against the active contracts, or raise
    ``PolicyInvalid`` with Cedar's message."""
    return cedar.validate(text, active_contracts())


def _lock(policy_id: str) -> Policy:
    policy = Policy.objects.select_for_update().filter(pk=policy_id).first()
    if policy is None:
        raise PolicyInvalid(f"No policy {policy_id!r}.")
    return policy


def _version(policy: Policy, number: int | None) -> PolicyVersion:
    versions = PolicyVersion.objects.filter(policy=policy)
    version = (
        versions.order_by("-number").first()
        if number is None
        else versions.filter(number=number).first()
    )
    if version is None:
        raise PolicyInvalid(f"Policy {policy.pk} has no version {number}.")
    return version


def _state_of(policy: Policy, *, retired: bool = False) -> str:
    if retired:
        return State.RETIRED
    if policy.active_version_id is not None:
        return State.ACTIVE
    if policy.shadow_version_id is not None:
        return State.SHADOW
    return State.DRAFT


def _event(policy: Policy, kind: EventKind, *, user: Person, now: datetime, **data: Any) -> None:
    event_append(
        stream=stream_of(policy.pk),
        kind=kind,
        actor=Actor.of_user(user),
        data={"policy": policy.pk, "state": policy.state, **data},
        now=now,
    )


def _save(policy: Policy, now: datetime, *, retired: bool = False) -> None:
    policy.state = _state_of(policy, retired=retired)
    policy.updated_at = now
    policy.save(update_fields=["state", "active_version", "shadow_version", "updated_at"])


def policy_write(*, user: Person, text: str, shadow: bool = False) -> PolicyVersion:
    """Store ``text`` as the newest version of the policy its ``@id`` names (a new
    policy starts as a draft), after Cedar validated it against the active contracts.
    The same text as the newest version is not stored again. With ``shadow`` the
    version is watched at once (``policy_shadow``)."""
    access.require_manage_policies(user)
    parsed = policy_validate(text)
    now = timezone.now()
    with transaction.atomic():
        try:
            with transaction.atomic():
                Policy.objects.create(id=parsed.policy_id, created_at=now, updated_at=now)
        except IntegrityError:
            pass
        policy = _lock(parsed.policy_id)
        latest = PolicyVersion.objects.filter(policy=policy).order_by("-number").first()
        digest = sha256_hex(text)
        if latest is not None and latest.text_hash == digest:
            version = latest
        else:
            version = PolicyVersion.objects.create(
                policy=policy,
                number=latest.number + 1 if latest else 1,
                text=text,
                text_hash=digest,
                kind=parsed.kind,
                message=parsed.message,
                written_by=user,
                written_at=now,
            )
            retired = policy.state == State.RETIRED
            if retired:
                # Written again after retiring: a draft once more.
                policy.state = State.DRAFT
            _save(policy, now)
            _event(
                policy,
                EventKind.POLICY_WRITTEN,
                user=user,
                now=now,
                version=version.number,
                text_hash=digest,
                effect=parsed.kind,
            )
        if shadow:
            _shadow_locked(policy, version, user=user, now=now)
    return version


def _shadow_locked(policy: Policy, version: PolicyVersion, *, user: Person, now: datetime) -> None:
    refusal = access.policy_shadow_refusal(user, policy, version)
    if refusal is not None:
        raise PolicyInvalid(refusal)
    if policy.shadow_version_id == version.pk:
        return
    policy.shadow_version = version
    _save(policy, now)
    _event(
        policy,
        EventKind.POLICY_SHADOWED,
        user=user,
        now=now,
        version=version.number,
        text_hash=version.text_hash,
    )


def policy_shadow(*, user: Person, policy_id: str, number: int | None = None) -> Policy:
    """Watch a version (the newest by default) on live registrations without enforcing
    it; one person may do it, since nothing is enforced."""
    access.require_manage_policies(user)
    with transaction.atomic():
        policy = _lock(policy_id)
        version = _version(policy, number)
        policy_validate(version.text)
        _shadow_locked(policy, version, user=user, now=timezone.now())
    return policy


def policy_activate(*, user: Person, policy_id: str, number: int | None = None) -> Policy:
    """Put a version (the newest by default) in force: a second person, never its
    author (``access.policy_activate_refusal``), checked on the locked row. The text is
    validated again against today's contracts."""
    with transaction.atomic():
        policy = _lock(policy_id)
        version = _version(policy, number)
        refusal = access.policy_activate_refusal(user, version)
        if refusal is not None:
            raise PermissionRefused(refusal)
        if policy.active_version_id == version.pk:
            raise PolicyInvalid(f"Version {version.number} of {policy.pk} is already in force.")
        policy_validate(version.text)
        now = timezone.now()
        previous = policy.active_version.number if policy.active_version else None
        policy.active_version = version
        if policy.shadow_version_id is not None and policy.shadow_version_id <= version.pk:
            policy.shadow_version = None
        _save(policy, now)
        _event(
            policy,
            EventKind.POLICY_ACTIVATED,
            user=user,
            now=now,
            version=version.number,
            text_hash=version.text_hash,
            author=version.written_by_id,
            previous_version=previous,
        )
    return policy


def policy_retire(*, user: Person, policy_id: str, reason: str = "") -> Policy:
    """Take a policy out of force and out of shadow. One person may: retiring a forbid
    loosens the guard, so it is an event everyone sees, and writing the text again
    needs two people to be in force once more."""
    access.require_manage_policies(user)
    with transaction.atomic():
        policy = _lock(policy_id)
        if policy.state == State.RETIRED:
            return policy
        now = timezone.now()
        policy.active_version = None
        policy.shadow_version = None
        _save(policy, now, retired=True)
        _event(policy, EventKind.POLICY_RETIRED, user=user, now=now, reason=reason[:500])
    return policy


# ---------------------------------------------------------------------------------------
# The policies in force, remembered per process under the policy generation


@dataclass(frozen=True)
class InForce:
    """The active and the shadow policies, compiled; with the version of each."""

    active: cedar.PolicySet
    shadow: cedar.PolicySet
    versions: dict[str, int] = field(default_factory=dict)
    shadow_versions: dict[str, int] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(len(self.active) or len(self.shadow))


NONE_IN_FORCE = InForce(active=cedar.PolicySet([]), shadow=cedar.PolicySet([]))


def _unreadable(policy_id: str) -> cedar.Policy:
    """A stored text this Cedar no longer reads: it asks a person for every operation
    (a guard that cannot be read must not silently stop guarding)."""
    return cedar.parse(
        f'@id("{policy_id}")\n@approval("required")\n'
        f'@message("Policy {policy_id} cannot be read by this Cedar; a person decides.")\n'
        'permit(principal, action == Action::"register", resource);'
    )


def _compiled(rows: list[tuple[str, int, str]]) -> tuple[cedar.PolicySet, dict[str, int]]:
    policies = []
    for policy_id, _number, text in rows:
        try:
            policies.append(cedar.parse(text))
        except PolicyInvalid:
            logger.error("policy %s: the stored text does not parse; it asks a person", policy_id)
            policies.append(_unreadable(policy_id))
    return cedar.PolicySet(policies), {pid: number for pid, number, _ in rows}


def _load() -> InForce:
    active = list(
        PolicyVersion.objects.filter(policy__active_version_id=F("id"))
        .order_by("policy_id")
        .values_list("policy_id", "number", "text")
    )
    shadow = list(
        PolicyVersion.objects.filter(policy__shadow_version_id=F("id"))
        .order_by("policy_id")
        .values_list("policy_id", "number", "text")
    )
    if not active and not shadow:
        return NONE_IN_FORCE
    active_set, versions = _compiled(active)
    shadow_set, shadow_versions = _compiled(shadow)
    return InForce(active_set, shadow_set, versions, shadow_versions)


class _Remembered:
    def __init__(self) -> None:
        self.generation: int | None = None
        self.value: InForce = NONE_IN_FORCE
        self.lock = threading.Lock()


_remembered = _Remembered()


def in_force() -> InForce:
    """The policies in force now. On PostgreSQL, remembered under the policy generation
    (read with the token generation: no statement of its own on the hot path); a change
    committed before this registration began is always seen. On SQLite, read each time."""
    generation = tokencache.policy_generation()
    if generation is None:
        return _load()
    with _remembered.lock:
        if _remembered.generation == generation:
            return _remembered.value
    # Loaded after the generation was read: a change committed in between moved the
    # generation, so what is stored under the old value is never used again.
    value = _load()
    with _remembered.lock:
        _remembered.generation, _remembered.value = generation, value
    return value


def forget() -> None:
    """Drop what this process remembers (tests)."""
    with _remembered.lock:
        _remembered.generation, _remembered.value = None, NONE_IN_FORCE


# ---------------------------------------------------------------------------------------
# What the policies say of one registration


def local_now(now: datetime) -> datetime:
    return timezone.localtime(now, ZoneInfo(settings.POLICY_TIME_ZONE))


def registration_facts(
    *,
    runner: Runner,
    runner_owner: str,
    tool: Tool,
    tool_owner: str,
    contract: dict[str, Any],
    frozen: Any,
    run: Run,
    now: datetime,
) -> cedar.Facts:
    return cedar.Facts(
        runner=runner.name,
        runner_owner=runner_owner,
        tool=tool.name,
        tool_owner=tool_owner,
        effect_class=contract["effect_class"],
        input_schema=contract["input_schema"],
        arguments=frozen,
        principal=run.principal,
        tool_calls=run.tool_calls or 0,
        spend=Decimal(run.spend or 0),
        turns=run.turns or 0,
        now=local_now(now),
    )


def registration_verdict(policies: InForce, facts: cedar.Facts) -> cedar.Verdict:
    """What the policies in force say of a registration (none in force: nothing)."""
    if not len(policies.active):
        return cedar.NOTHING
    return policies.active.evaluate(facts)


def hits_described(verdict: cedar.Verdict, versions: dict[str, int]) -> list[dict[str, Any]]:
    """The policies that asked, for the request's context and the approver: id, version,
    message, whether it asked because it could not be evaluated (never the text)."""
    return [
        {
            "policy": hit.policy.policy_id,
            "version": versions.get(hit.policy.policy_id),
            "message": hit.policy.message,
            "missing": hit.missing,
        }
        for hit in verdict.asks
    ]


def reason_of(hits: list[dict[str, Any]]) -> str:
    """The approver's sentence for the policies that asked."""
    parts = []
    for hit in hits:
        said = hit["message"] or "a person must approve"
        if hit["missing"]:
            said += (
                " (it could not be evaluated: an argument it reads is absent, so a person decides)"
            )
        if hit.get("figure"):
            # A limit over time: the window's figure, this registration included.
            said += f" ({hit['figure']})"
        parts.append(f"Policy {hit['policy']} asks: {said}.")
    return " ".join(parts)


def activation_facts(
    *, runner: Runner, tool: Tool, contract: dict[str, Any], first_version: bool, number: int
) -> cedar.Facts:
    return cedar.Facts(
        runner=runner.name,
        runner_owner="",
        tool=tool.name,
        tool_owner=runner.name,
        effect_class=contract["effect_class"],
        input_schema=contract["input_schema"],
        action=cedar.ACTIVATE,
        first_version=first_version,
        version=number,
    )


def activation_holds(facts: cedar.Facts) -> list[str]:
    """Why the policies in force hold a contract version for a person (a ``forbid`` on
    ``Action::"activate"`` that matches, or cannot be evaluated), in words."""
    policies = in_force()
    if not len(policies.active):
        return []
    verdict = policies.active.evaluate(facts)
    hits = ([verdict.forbidden] if verdict.forbidden else []) + list(verdict.asks)
    return [
        f"policy {hit.policy.policy_id} holds it for a person: "
        f"{hit.policy.message or 'a person activates it'}"
        for hit in hits
    ]


def judge_again(
    *, runner: Runner, run: Run, tool: Tool, contract: dict[str, Any], frozen: Any, now: datetime
) -> tuple[cedar.Verdict, "InForce"]:
    """What the policies in force say of arguments a person changed (an edited copy is
    a new intent: it is judged as a registration would be)."""
    policies = in_force()
    if not len(policies.active):
        return cedar.NOTHING, policies
    owner = runner.owner.get_username() if runner.owner is not None else ""
    tool_owner = Runner.objects.filter(pk=tool.owner_id).values_list("name", flat=True).first()
    facts = registration_facts(
        runner=runner,
        runner_owner=owner,
        tool=tool,
        tool_owner=tool_owner or "",
        contract=contract,
        frozen=frozen,
        run=run,
        now=now,
    )
    verdict = policies.active.evaluate(facts)
    # A limit over time counted the original when it was registered; the edited copy
    # replaces it and waits for a person already: it is not counted again, and a
    # window does not ask of it.
    asks = tuple(hit for hit in verdict.asks if hit.policy.window is None or hit.missing)
    return replace(verdict, asks=asks), policies
