"""People's approval decisions and revocations, and the transitions that follow."""

import json
import re
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals import services as approval_services
from approvals.errors import DecisionRefused, Refusal
from approvals.models import ApprovalRequest, StandingGrant
from approvals.people import Person

from .. import access, errors, payloads
from ..canonical import intent_hash
from ..contracts.arguments import apply_edits, validate_frozen
from ..machine import EventKind, Status
from ..models import (
    Notice,
    Operation,
)
from ..policies.cedar import Requirement, strictest
from ..strictjson import loads_strict
from . import notices, policies
from .core import (
    Actor,
    approval_request_open,
    approval_requested_record,
    enter,
    event_append,
    lock,
    outbox_approval_decided,
    outbox_enqueue,
    raise_after_commit,
    record,
)
from .registration import operation_build, registered_event_data
from .rows import insert_unless_conflict
from .standing import StandingTerms, standing_grant_issue_locked

STALE_INTENT = (
    "The request is not the one you were shown: its intent changed or it was replaced. "
    "Open it in the console to see it as it is now."
)


def _lock_request(request_id: str) -> tuple[Operation, ApprovalRequest]:
    """Lock an approval request and its operation (operation first, as everywhere)."""
    request = ApprovalRequest.objects.filter(pk=request_id).only("operation_id").first()
    if request is None:
        raise errors.NotFound(f"No approval {request_id!r}.")
    op = lock(request.operation_id)
    request = ApprovalRequest.objects.select_for_update().get(pk=request_id)
    return op, request


def request_expire_locked(op: Operation, request: ApprovalRequest, *, now: datetime) -> bool:
    if not approval_services.request_expire(request=request, now=now):
        return False
    if op.status == Status.AWAITING_APPROVAL:
        enter(
            op,
            to=Status.REJECTED,
            kind=EventKind.APPROVAL_EXPIRED,
            actor=Actor.system("sweep"),
            now=now,
            data={"approval": request.id},
            error_code="approval_expired",
            error_detail="Nobody decided on the approval request before it expired.",
        )
    outbox_approval_decided(op, request, now=now)
    return True


def approval_escalate_locked(op: Operation, request: ApprovalRequest, *, now: datetime) -> bool:
    """Offer a request still pending at its ``escalate_at`` to its group: its members
    may decide it from now on (``access.decide_refusal``). Audited on the operation,
    reported to webhooks (``approval.escalated``), the group told by mail after commit."""
    if not approval_services.request_escalate(request=request, now=now):
        return False
    record(
        op,
        kind=EventKind.APPROVAL_ESCALATED,
        actor=Actor.system("sweep"),
        now=now,
        data={"approval": request.id, "group": request.escalate_to},
    )
    outbox_enqueue(
        op=op,
        event_type="approval.escalated",
        now=now,
        extra={"approval": payloads.approval(request)},
    )
    notices.notice_write(kind=Notice.Kind.REQUEST_ESCALATED, request=request, now=now)
    return True


def approval_decide(
    *,
    request_id: str,
    user: Person,
    approve: bool,
    comment: str,
    otp_verified: bool = False,
    edits: dict[str, Any] | None = None,
    shown_intent_hash: str | None = None,
    via: str = "",
) -> Operation:
    """One person's decision on a pending request, and the transition that follows.

    Approving counts towards the quorum; the approval that meets it creates a grant and
    moves the operation to ``ready``. A rejection (with a reason) ends the operation as
    ``rejected``; the runner receives the reason. Separation of duties is checked by
    ``access.decide_refusal``, and so is the second factor: ``otp_verified`` says
    whether the person's session was verified with a one-time password, which
    ``access.decision_needs_second_factor`` may require.

    ``edits`` (JSON pointer to value, approvals only) changes fields the contract lists
    in ``approval.editable``: see ``_approve_edited``. Edits equal to the values already
    there change nothing, and the decision is a plain approval. Answers the operation
    the decision leaves to run: the successor when there was an edit.

    ``shown_intent_hash``, when given, is the intent the person was shown (a Slack
    button carries it): the decision is refused, under the request's lock, unless it is
    still the request's. ``via`` names where the decision came from when it was not the
    console (``"slack"``), in the decision's event.
    """
    result: Operation | Exception
    with transaction.atomic():
        op, request = _lock_request(request_id)
        now = timezone.now()
        if request.status == ApprovalRequest.RequestStatus.PENDING and request.expires_at <= now:
            request_expire_locked(op, request, now=now)
        try:
            if shown_intent_hash is not None and shown_intent_hash != request.intent_hash:
                raise DecisionRefused(STALE_INTENT)
            changes: list[dict[str, Any]] = []
            if edits and approve:
                edited, changes = _edited_arguments(op, edits)
            if changes:
                approval_services.decision_check(
                    request=request,
                    refusal=access.decide_refusal(
                        user=user, request=request, op=op, otp_verified=otp_verified
                    ),
                    now=now,
                )
                # A savepoint: a refusal on the way (the successor's own decision) takes
                # every write of the edit back with it, so nothing is half-done.
                with transaction.atomic():
                    result = _approve_edited(
                        op,
                        request,
                        user=user,
                        edited=edited,
                        changes=changes,
                        comment=comment,
                        otp_verified=otp_verified,
                        now=now,
                    )
            else:
                result = _decide_locked(
                    op,
                    request,
                    user=user,
                    approve=approve,
                    comment=comment,
                    otp_verified=otp_verified,
                    now=now,
                    via=via,
                )
        except Refusal as refusal:
            result = refusal
    return raise_after_commit(result)


def _decide_locked(
    op: Operation,
    request: ApprovalRequest,
    *,
    user: Person,
    approve: bool,
    comment: str,
    otp_verified: bool,
    now: datetime,
    via: str = "",
) -> Operation:
    decided = approval_services.decision_record(
        request=request,
        user=user,
        approve=approve,
        comment=comment,
        refusal=access.decide_refusal(user=user, request=request, op=op, otp_verified=otp_verified),
        now=now,
    )
    actor = Actor.of_user(user)
    approvers = sorted(
        request.decisions.filter(decision="approve").values_list("user_id", flat=True)
    )
    record(
        op,
        kind=EventKind.DECISION,
        actor=actor,
        now=now,
        data={
            "approval": request.id,
            "decision": decided.decision.decision,
            "comment": decided.decision.comment,
            "approvals": len(approvers),
            "approvals_required": request.approvals_required,
            **({"via": via} if via else {}),
        },
    )
    if decided.outcome == "approved" and decided.grant is not None:
        enter(
            op,
            to=Status.READY,
            kind=EventKind.GRANTED,
            actor=actor,
            now=now,
            data={
                "approval": request.id,
                "grant": decided.grant.id,
                "intent_hash": decided.grant.intent_hash,
                "expires_at": decided.grant.expires_at,
                # Whose approvals made the quorum: audit verify compares them with the
                # request's approving decisions.
                "deciders": approvers,
            },
        )
    elif decided.outcome == "rejected":
        enter(
            op,
            to=Status.REJECTED,
            kind=EventKind.REJECTED,
            actor=actor,
            now=now,
            data={"approval": request.id, "reason": decided.decision.comment},
            error_code="approval_rejected",
            error_detail=decided.decision.comment,
        )
    if decided.outcome != "pending":
        outbox_approval_decided(op, request, now=now)
    else:
        notices.request_changed(request, now=now)
    return op


def approval_approve_and_issue(
    *,
    request_id: str,
    user: Person,
    comment: str,
    terms: StandingTerms,
    otp_verified: bool = False,
) -> tuple[Operation, StandingGrant]:
    """Approve this and the next ones like it: one person's approval of a pending request
    and the standing grant they issue for its family (``terms``, of the request's tool),
    in one transaction: both happen or neither does. Each is judged by its own rule
    (``access.decide_refusal``, ``access.standing_sign_refusal``)."""
    with transaction.atomic():
        op, request = _lock_request(request_id)
        if terms.tool != op.tool_id:
            raise errors.InvalidRequest(
                f"A standing grant issued from this approval is for {op.tool_id}."
            )
        now = timezone.now()
        op = _decide_locked(
            op,
            request,
            user=user,
            approve=True,
            comment=comment,
            otp_verified=otp_verified,
            now=now,
        )
        grant = standing_grant_issue_locked(
            terms, user=user, otp_verified=otp_verified, now=now, approval_id=request.id
        )
    return op, grant


def _edited_arguments(op: Operation, edits: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """The operation's frozen arguments with a person's edits, validated, and the list of
    changes; refused when a field is not editable or the result breaks the schema."""
    contract = op.tool_version.contract
    editable = contract["approval"].get("editable", [])
    not_editable = sorted(set(edits) - set(editable))
    if not_editable:
        raise errors.InvalidArguments(
            f"Only {', '.join(editable) or 'no field'} may be changed when approving.",
            errors=[{"path": "/arguments" + p, "message": "not editable"} for p in not_editable],
        )
    edited, changes = apply_edits(op.arguments, edits)
    if changes:
        validate_frozen(contract["input_schema"], edited)
        # A person's edit obeys the rules of a runner's body (strictjson): nothing that
        # PostgreSQL cannot store (U+0000) or gives back as another value (1e300, as an
        # integer RFC 8785 refuses), no lone surrogate, NaN, infinity or integer past 2**53.
        paths = ["/arguments" + change["path"] for change in changes]
        try:
            loads_strict(json.dumps(edited, allow_nan=False))
        except (ValueError, errors.NumberOutOfRange) as exc:  # ValueError: NaN, infinities
            raise errors.NumberOutOfRange(
                "An edited value is a number JSON cannot carry exactly.",
                errors=[{"path": path, "message": str(exc)} for path in paths],
            ) from exc
        except errors.MalformedJSON as exc:
            raise errors.InvalidArguments(
                "An edited value cannot be stored as it is.",
                errors=[{"path": path, "message": exc.detail} for path in paths],
            ) from exc
    return edited, changes


# At the very end (``\Z``; "$" would also match before a final newline), in ASCII
# digits (``\d`` admits other scripts' digits).
EDIT_SUFFIX = re.compile(r"~edit-([0-9]+)\Z")
KEY_MAX_LENGTH = 255  # Operation.operation_key


def _successor_key(op: Operation) -> str:
    """``<original key>~edit-N``: N counts the edits of the original's key."""
    match = EDIT_SUFFIX.search(op.operation_key)
    base = op.operation_key[: match.start()] if match else op.operation_key
    number = int(match.group(1)) + 1 if match else 1
    while True:
        key = f"{base}~edit-{number}"
        if len(key) > KEY_MAX_LENGTH:
            raise DecisionRefused("This operation's key is too long to register an edited copy.")
        if not Operation.objects.filter(runner_id=op.runner_id, operation_key=key).exists():
            return key
        number += 1


def _approve_edited(
    op: Operation,
    request: ApprovalRequest,
    *,
    user: Person,
    edited: Any,
    changes: list[dict[str, Any]],
    comment: str,
    otp_verified: bool,
    now: datetime,
) -> Operation:
    """Approve with changes: register a successor operation in the same run with the
    edited arguments (its own intent hash, ``previous`` the original, key
    ``<key>~edit-N``) and an approval request on which this person's approval is the
    first decision, so the quorum counts distinct people on what will actually run.
    The original ends ``superseded`` pointing at it. One transaction, each step audited.
    """
    actor = Actor.of_user(user)
    verdict, in_force = policies.judge_again(
        runner=op.runner,
        run=op.run,
        tool=op.tool,
        contract=op.tool_version.contract,
        frozen=edited,
        now=now,
    )
    if verdict.forbidden is not None:
        forbid = verdict.forbidden.policy
        raise DecisionRefused(
            f"Policy {forbid.policy_id} forbids the changed operation: "
            f"{forbid.message or 'it may not run'}."
        )
    context = {**request.context, "edited_from": request.id, "edits": changes}
    if verdict.asks:
        # The changed arguments are judged anew; what was asked of the original stays.
        earlier = request.context.get("policy_terms")
        terms = [verdict.requirement] + ([Requirement.from_dict(earlier)] if earlier else [])
        context["policy_terms"] = strictest(t for t in terms if t is not None).as_dict()
        hits = policies.hits_described(verdict, in_force.versions)
        known = {h["policy"] for h in hits}
        context["policies"] = hits + [
            h for h in request.context.get("policies", []) if h.get("policy") not in known
        ]
    successor = operation_build(
        runner=op.runner,
        run=op.run,
        tool=op.tool,
        version=op.tool_version,
        operation_key=_successor_key(op),
        frozen=edited,
        digest=intent_hash(tool=op.tool_id, arguments=edited, principal=op.principal),
        principal=op.principal,
        principal_user_id=op.principal_user_id,
        status=Status.AWAITING_APPROVAL,
        deadline_at=op.deadline_at,
        now=now,
        call_id=op.call_id,
        turn=op.turn,
        previous=op,
        edits=changes,
        traceparent=op.traceparent,
    )
    if not insert_unless_conflict(successor):
        raise DecisionRefused(
            f"The key {successor.operation_key!r} was taken meanwhile; decide again."
        )
    event_append(
        stream=successor.id,
        kind=EventKind.REGISTERED,
        actor=actor,
        operation=successor,
        to_status=successor.status,
        data=registered_event_data(successor),
        now=now,
    )
    new_request = approval_request_open(
        successor,
        reason=f"{user.get_username()} changed {', '.join(c['path'] for c in changes)} "
        f"when approving {op.id}. {request.reason}",
        context=context,
        now=now,
    )
    if request.escalated_at is not None:
        # Offered to the escalation group already: the copy stays offered to it, and
        # the terms its opening event records are the inherited ones.
        approval_services.request_escalation_inherit(request=new_request, source=request)
    approval_requested_record(successor, new_request, actor=actor, now=now)
    if request.escalated_at is not None:
        record(
            successor,
            kind=EventKind.APPROVAL_ESCALATED,
            actor=actor,
            now=now,
            data={
                "approval": new_request.id,
                "group": new_request.escalate_to,
                "inherited_from": request.id,
            },
        )
    outbox_enqueue(op=successor, event_type=f"operation.{successor.status}", now=now)
    approval_services.request_supersede(request=request, now=now)
    enter(
        op,
        to=Status.SUPERSEDED,
        kind=EventKind.SUPERSEDED,
        actor=actor,
        now=now,
        data={"approval": request.id, "successor": successor.id, "edits": changes},
        superseded_by=successor,
    )
    outbox_approval_decided(op, request, now=now)
    return _decide_locked(
        successor,
        new_request,
        user=user,
        approve=True,
        comment=comment,
        otp_verified=otp_verified,
        now=now,
    )


def approval_revoke(*, request_id: str, user: Person, reason: str) -> Operation:
    """Revoke a grant. Attempts already executing go on; the next claim is refused."""
    with transaction.atomic():
        op, request = _lock_request(request_id)
        access.require_revoke(user, op.tool)
        if not reason.strip():
            raise DecisionRefused("Say why the grant is revoked.")
        if request.status != ApprovalRequest.RequestStatus.APPROVED:
            raise DecisionRefused(f"This request is {request.status}; no grant to revoke.")
        now = timezone.now()
        grant = approval_services.grant_revoke(request=request, user=user, reason=reason, now=now)
        record(
            op,
            kind=EventKind.GRANT_REVOKED,
            actor=Actor.of_user(user),
            now=now,
            data={"approval": request.id, "grant": grant.id, "reason": grant.revoke_reason},
        )
        outbox_approval_decided(op, request, now=now)
    return op
