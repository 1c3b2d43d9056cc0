"""Standing grants: people's approval given in advance for a family of intents, and its
uses at registration (docs/policies.md, Standing grants).

A standing grant is issued by a person who may decide on the tool, signed by as many
distinct people as the approvals it replaces need (``access.standing_sign_refusal``:
the same permission and separation of duties), and then covers the next operations of
its family: each use approves one exact intent, as a person's approval would, with a
grant that names the standing grant. Every change is an event on the grant's own
stream, ``sgr:<id>``; the runners that may invoke the tool hear of its issue, uses and
revocation (``standing_grant.*`` webhooks).
"""

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals import services as approval_services
from approvals.errors import PermissionRefused, Refusal
from approvals.models import StandingGrant, StandingGrantSignature
from approvals.people import Person
from approvals.policy import parse_pointer
from approvals.standing import amount_at, pins_problem

from .. import access, errors, payloads
from ..machine import EventKind, Status
from ..models import Operation, Tool
from ..selectors import operation_refresh, run_with_runner
from ..text import normalize_principal
from .core import (
    Actor,
    approval_request_open,
    approval_requested_record,
    due_each,
    enter,
    event_append,
    outbox_approval_decided,
    outbox_enqueue_to,
    raise_after_commit,
)
from .terms import money, money_text, standing_grant_terms

GrantStatus = StandingGrant.GrantStatus

MAX_USES = 100_000
MAX_QUORUM = 20
MAX_LIFETIME = timedelta(days=366)
# numeric(20, 6): the largest sum a grant's columns hold, with room for the last use.
MAX_SUM = Decimal(10) ** 13
# The most grants one registration considers (the soonest to expire first).
MAX_CANDIDATES = 50


def stream_of(grant: StandingGrant) -> str:
    return f"sgr:{grant.id}"


def grant_event(
    grant: StandingGrant,
    kind: EventKind,
    *,
    actor: Actor,
    from_status: str = "",
    to_status: str = "",
    data: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> None:
    """One event on the standing grant's own stream (``sgr:<id>``)."""
    event_append(
        stream=stream_of(grant),
        kind=kind,
        actor=actor,
        tool_name=grant.tool,
        from_status=from_status,
        to_status=to_status,
        data=data,
        now=now,
    )


@dataclass(frozen=True)
class StandingTerms:
    """What a person asks for when issuing a standing grant (docs/policies.md).

    ``principal`` and ``run_id`` empty: any. ``sum_path`` names the argument whose sum
    is capped at ``max_sum``. ``approvals_required`` None: the quorum of the tool's
    active contract, the least a standing grant for it may be issued with.
    """

    tool: str
    max_uses: int
    expires_at: datetime
    principal: str = ""
    run_id: str = ""
    pins: list[dict[str, Any]] = field(default_factory=list)
    sum_path: str = ""
    max_sum: Decimal | None = None
    approvals_required: int | None = None


def _tool(name: str) -> Tool:
    tool = Tool.objects.select_related("active_version").filter(pk=name).first()
    if tool is None or tool.active_version is None:
        raise errors.NotFound(f"No tool {name!r}.")
    return tool


def _checked(terms: StandingTerms, *, tool: Tool, now: datetime) -> StandingTerms:
    """``terms`` as a grant stores them (the principal normalized, the sum rounded as the
    column holds it), or ``InvalidRequest`` saying what is wrong."""

    def refuse(detail: str) -> errors.InvalidRequest:
        return errors.InvalidRequest(f"The standing grant cannot be issued: {detail}")

    principal = terms.principal.strip()
    if principal:
        try:
            principal = normalize_principal(principal)
        except ValueError as exc:
            raise refuse(f"{exc}.") from exc
    run_id = terms.run_id.strip()
    if run_id and run_with_runner(run_id) is None:
        raise refuse(f"there is no run {run_id!r}.")
    problem = pins_problem(terms.pins)
    if problem:
        raise refuse(problem)
    if not isinstance(terms.max_uses, int) or not 1 <= terms.max_uses <= MAX_USES:
        raise refuse(f"the number of uses is a whole number from 1 to {MAX_USES}.")
    sum_path = terms.sum_path.strip()
    max_sum = None
    if sum_path or terms.max_sum is not None:
        try:
            if not sum_path or not parse_pointer(sum_path):
                raise ValueError(sum_path)
        except ValueError as exc:
            raise refuse("a maximum sum names the argument it sums, like /amount_cents.") from exc
        try:
            max_sum = money(terms.max_sum)
        except InvalidOperation as exc:
            raise refuse("the maximum sum is a number.") from exc
        if max_sum is None or not max_sum.is_finite() or not 0 < max_sum <= MAX_SUM:
            raise refuse(f"the maximum sum is a number above 0, at most {MAX_SUM}.")
    if not now < terms.expires_at <= now + MAX_LIFETIME:
        raise refuse(f"it expires in the future, within {MAX_LIFETIME.days} days.")
    version = tool.active_version
    assert version is not None  # _tool refuses a tool without one
    needed = version.contract["approval"].get("approvals_required", 1)
    quorum = terms.approvals_required if terms.approvals_required is not None else needed
    if isinstance(quorum, int) and quorum > MAX_QUORUM:
        raise refuse(f"at most {MAX_QUORUM} people sign one.")
    if not isinstance(quorum, int) or quorum < needed:
        raise refuse(
            f"{tool.name} needs {needed} approval{'s' if needed != 1 else ''}; a standing grant "
            "for it needs at least as many signatures."
        )
    return StandingTerms(
        tool=tool.name,
        max_uses=terms.max_uses,
        expires_at=terms.expires_at,
        principal=principal,
        run_id=run_id,
        pins=list(terms.pins),
        sum_path=sum_path,
        max_sum=max_sum,
        approvals_required=quorum,
    )


def _signers(grant: StandingGrant) -> list[Person]:
    return [s.user for s in grant.signatures.select_related("user").order_by("user_id")]


def _announce(grant: StandingGrant, *, event_type: str, now: datetime) -> None:
    """Tell the runners that may invoke the grant's tool (``standing_grant.*``)."""
    runners = access.invoking_runners(Tool.objects.get(pk=grant.tool)).filter(is_active=True)
    outbox_enqueue_to(
        runners=runners,
        event_type=event_type,
        now=now,
        data={"standing_grant": payloads.standing_grant(grant)},
    )


def _signed(grant: StandingGrant, *, activated: bool, actor: Actor, now: datetime) -> None:
    """After a signature: the grant becomes active when it met its quorum."""
    if not activated:
        return
    grant_event(
        grant,
        EventKind.STANDING_GRANT_ACTIVATED,
        actor=actor,
        from_status=GrantStatus.PROPOSED,
        to_status=GrantStatus.ACTIVE,
        data={"signed_by": approval_services.standing_grant_signers(grant)},
        now=now,
    )
    _announce(grant, event_type="standing_grant.issued", now=now)


def standing_grant_issue_locked(
    terms: StandingTerms,
    *,
    user: Person,
    otp_verified: bool,
    now: datetime,
    approval_id: str = "",
) -> StandingGrant:
    """Issue a standing grant in the caller's transaction: its issuer signs it first.
    ``approval_id``: the request whose page it was issued from, for the record."""
    tool = _tool(terms.tool)
    terms = _checked(terms, tool=tool, now=now)
    refusal = access.standing_sign_refusal(
        user=user,
        tool=tool,
        principal=terms.principal,
        run=run_with_runner(terms.run_id),
        otp_verified=otp_verified,
    )
    if refusal is not None:
        raise PermissionRefused(refusal)
    assert terms.approvals_required is not None
    grant = approval_services.standing_grant_open(
        user=user,
        tool=terms.tool,
        principal=terms.principal,
        run_id=terms.run_id,
        pins=terms.pins,
        max_uses=terms.max_uses,
        sum_path=terms.sum_path,
        max_sum=terms.max_sum,
        expires_at=terms.expires_at,
        approvals_required=terms.approvals_required,
        now=now,
    )
    actor = Actor.of_user(user)
    grant_event(
        grant,
        EventKind.STANDING_GRANT_ISSUED,
        actor=actor,
        to_status=GrantStatus.PROPOSED,
        data={"terms": standing_grant_terms(grant), "from_approval": approval_id or None},
        now=now,
    )
    activated = approval_services.standing_grant_sign(
        grant=grant, user=user, refusal=None, second_factor=otp_verified, now=now
    )
    _signed(grant, activated=activated, actor=actor, now=now)
    return grant


def standing_grant_issue(
    terms: StandingTerms, *, user: Person, otp_verified: bool = False
) -> StandingGrant:
    """Issue a standing grant for the family ``terms`` describe. With a quorum of one it
    is active at once; otherwise it is ``proposed`` until enough people sign it
    (``standing_grant_sign``). ``otp_verified``: the issuer's session was verified with
    a one-time password, which signing for an irreversible tool may need."""
    with transaction.atomic():
        return standing_grant_issue_locked(
            terms, user=user, otp_verified=otp_verified, now=timezone.now()
        )


def _lock(grant_id: str) -> StandingGrant:
    grant = StandingGrant.objects.select_for_update().filter(pk=grant_id).first()
    if grant is None:
        raise errors.NotFound(f"No standing grant {grant_id!r}.")
    return grant


def _expire_locked(grant: StandingGrant, *, now: datetime) -> bool:
    previous = approval_services.standing_grant_expire(grant=grant, now=now)
    if previous is None:
        return False
    grant_event(
        grant,
        EventKind.STANDING_GRANT_EXPIRED,
        actor=Actor.system("sweep"),
        from_status=previous,
        to_status=GrantStatus.EXPIRED,
        data={"uses": grant.uses},
        now=now,
    )
    return True


def standing_grant_sign(
    *, grant_id: str, user: Person, otp_verified: bool = False
) -> StandingGrant:
    """One more person's signature on a proposed standing grant; the one that meets its
    quorum makes it active. A grant found past its expiry is marked expired (committed)
    before the signature is refused."""
    result: StandingGrant | Exception
    with transaction.atomic():
        grant = _lock(grant_id)
        now = timezone.now()
        _expire_locked(grant, now=now)
        try:
            refusal = access.standing_sign_refusal(
                user=user,
                tool=_tool(grant.tool),
                principal=grant.principal,
                run=run_with_runner(grant.run_id),
                signed_by=approval_services.standing_grant_signers(grant),
                otp_verified=otp_verified,
            )
            activated = approval_services.standing_grant_sign(
                grant=grant, user=user, refusal=refusal, second_factor=otp_verified, now=now
            )
        except Refusal as refusal_error:
            result = refusal_error
        else:
            actor = Actor.of_user(user)
            grant_event(
                grant,
                EventKind.STANDING_GRANT_SIGNED,
                actor=actor,
                from_status=GrantStatus.PROPOSED,
                to_status=GrantStatus.PROPOSED,
                data={"signatures": grant.signatures.count()},
                now=now,
            )
            _signed(grant, activated=activated, actor=actor, now=now)
            result = grant
    return raise_after_commit(result)


def standing_grant_revoke(*, grant_id: str, user: Person, reason: str) -> StandingGrant:
    """Revoke a standing grant: it covers nothing from now on, and every operation it
    approved is refused at its next claim (``grant_invalid``, a new request opens),
    whichever process serves the claim: the claim reads the grant's status then."""
    with transaction.atomic():
        grant = _lock(grant_id)
        tool = Tool.objects.filter(pk=grant.tool).first()
        if tool is None or not access.may_revoke_standing(user, tool):
            raise PermissionRefused("You may not revoke standing grants for this tool.")
        now = timezone.now()
        previous = approval_services.standing_grant_revoke(
            grant=grant, user=user, reason=reason, now=now
        )
        grant_event(
            grant,
            EventKind.STANDING_GRANT_REVOKED,
            actor=Actor.of_user(user),
            from_status=previous,
            to_status=GrantStatus.REVOKED,
            data={"reason": grant.revoke_reason, "uses": grant.uses},
            now=now,
        )
        _announce(grant, event_type="standing_grant.revoked", now=now)
    return grant


def standing_grant_expire_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """Mark proposed and active standing grants past their expiry as expired (a use
    already refuses them: this keeps their status and history true)."""
    now = now or timezone.now()
    still_due = {
        "status__in": [GrantStatus.PROPOSED, GrantStatus.ACTIVE],
        "expires_at__lte": now,
    }

    def expire(grant_id: str) -> bool:
        grant = (
            StandingGrant.objects.select_for_update(skip_locked=True)
            .filter(pk=grant_id, **still_due)
            .first()
        )
        return grant is not None and _expire_locked(grant, now=now)

    due = StandingGrant.objects.filter(**still_due).values_list("pk", flat=True)[:limit]
    return due_each(due, expire)


# ---------------------------------------------------------------------------------------
# Uses, at registration


def _candidates(op: Operation, *, approvals_required: int, now: datetime) -> list[StandingGrant]:
    """Active, unexpired grants for the operation's tool, principal and run that were
    issued with at least the quorum it needs, soonest to expire first."""
    return list(
        StandingGrant.objects.filter(
            tool=op.tool_id,
            status=GrantStatus.ACTIVE,
            expires_at__gt=now,
            approvals_required__gte=approvals_required,
        )
        .filter(Q(principal="") | Q(principal=op.principal))
        .filter(Q(run_id="") | Q(run_id=op.run_id))
        .order_by("expires_at", "id")[:MAX_CANDIDATES]
    )


def standing_cover_locked(
    op: Operation,
    *,
    approvals_required: int,
    reason: str,
    context: dict[str, Any],
    actor: Actor,
    now: datetime,
) -> StandingGrant | None:
    """Approve ``op`` (locked, just registered ``awaiting_approval``) with a use of a
    standing grant, if one covers it; answers that grant, or None when none does and a
    person must decide (the caller opens the request as usual).

    The keyword parameters say what the approval the operation needs asks of those who
    give it: ``approvals_required`` is the quorum (a grant qualifies when it was issued
    with at least as many signatures). A further requirement (groups whose members must
    sign, a second factor) is one more keyword parameter here, narrowing the grants that
    qualify in ``_candidates`` or ``access.standing_use_refusal``.

    1. Read the candidates (no lock): active, unexpired, the tool, principal and run,
       the quorum; then keep those whose pins the arguments hold, whose summed argument
       is a number, and whose signers may still approve this operation.
    2. Take a use of the first with one conditional UPDATE
       (``approvals.services.standing_grant_take_use``); when a concurrent registration
       took the last use first, try the next.
    3. Record the use as an approval of this exact intent: a request (``reason`` and
       ``context`` as the caller would open it with, naming the grant) approved with a
       grant that names the standing grant; the operation goes ``ready``
       (``approval_requested``, ``granted``), the grant's stream records the use, and
       the grant becomes ``exhausted`` when nothing is left.
    """
    candidates = _candidates(op, approvals_required=approvals_required, now=now)
    if not candidates:
        return None
    signers: dict[str, list[Person]] = defaultdict(list)
    for signature in (
        StandingGrantSignature.objects.filter(grant__in=candidates)
        .select_related("user")
        .order_by("user_id")
    ):
        signers[signature.grant_id].append(signature.user)
    for grant in candidates:
        if not grant.family.includes(
            tool=op.tool_id, principal=op.principal, run_id=op.run_id, arguments=op.arguments
        ):
            continue
        amount = None
        if grant.sum_path:
            amount = money(amount_at(op.arguments, grant.sum_path))
            if amount is None or amount > MAX_SUM:
                continue
        if access.standing_use_refusal(grant=grant, signers=signers[grant.pk], op=op):
            continue
        if approval_services.standing_grant_take_use(grant=grant, amount=amount, now=now):
            _use(
                op,
                grant,
                deciders=[signer.pk for signer in signers[grant.pk]],
                amount=amount,
                reason=reason,
                context=context,
                actor=actor,
                now=now,
            )
            return grant
    return None


def _use(
    op: Operation,
    grant: StandingGrant,
    *,
    deciders: list[int],
    amount: Decimal | None,
    reason: str,
    context: dict[str, Any],
    actor: Actor,
    now: datetime,
) -> None:
    request = approval_request_open(
        op,
        reason=f"Approved by standing grant {grant.id} (use {grant.uses} of {grant.max_uses}). "
        f"{reason}".strip(),
        context={**context, "standing_grant": grant.id},
        now=now,
        announce=False,
    )
    approval_requested_record(op, request, actor=actor, now=now, standing_grant=grant.id)
    given = approval_services.request_approve_standing(
        request=request, standing_grant=grant, now=now
    )
    enter(
        op,
        to=Status.READY,
        kind=EventKind.GRANTED,
        actor=actor,
        now=now,
        data={
            "approval": request.id,
            "grant": given.id,
            "intent_hash": given.intent_hash,
            "expires_at": given.expires_at,
            # The standing grant's signers decided: audit verify compares them.
            "deciders": deciders,
            "standing_grant": grant.id,
        },
    )
    outbox_approval_decided(op, request, now=now)
    grant_event(
        grant,
        EventKind.STANDING_GRANT_USED,
        actor=actor,
        from_status=GrantStatus.ACTIVE,
        to_status=GrantStatus.ACTIVE,
        data={
            "operation": op.id,
            "intent_hash": op.intent_hash,
            "approval": request.id,
            "grant": given.id,
            "uses": grant.uses,
            "amount": money_text(amount),
            "sum_used": money_text(grant.sum_used) if grant.sum_path else None,
        },
        now=now,
    )
    if approval_services.standing_grant_exhaust(grant=grant, now=now):
        grant_event(
            grant,
            EventKind.STANDING_GRANT_EXHAUSTED,
            actor=actor,
            from_status=GrantStatus.ACTIVE,
            to_status=GrantStatus.EXHAUSTED,
            data={
                "uses": grant.uses,
                "sum_used": money_text(grant.sum_used) if grant.sum_path else None,
            },
            now=now,
        )
    # The operation's own runner hears of the use with its operation; the other runners
    # that may invoke the tool, of the grant only (a runner sees only its own operations).
    body = payloads.standing_grant(grant)
    others = access.invoking_runners(op.tool).filter(is_active=True).exclude(pk=op.runner_id)
    outbox_enqueue_to(
        runners=[op.runner],
        event_type="standing_grant.used",
        now=now,
        data={"standing_grant": body, "operation": payloads.operation(operation_refresh(op))},
        operation=op,
    )
    outbox_enqueue_to(
        runners=others, event_type="standing_grant.used", now=now, data={"standing_grant": body}
    )
