"""How an operation, its approval and a tool's contract look from outside: plain dicts,
no HTTP layer.

The runner API (``serializers.OperationOut``, ``ApprovalOut``, ``AttemptOut`` and
``ToolOut`` render through these functions) and the webhook outbox
(``services.core.outbox_enqueue``) publish the same bodies, built once here (the log's
checkpoints too), so the write layer never imports serializers. The serializers only
describe the fields, for the OpenAPI document; tests/operations/test_bodies.py checks
every answer and webhook against that document, key by key.
"""

import base64
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from approvals.models import ApprovalRequest, Decision, StandingGrant
from approvals.selectors import request_latest

from .machine import allowed_next_actions
from .models import Attempt, Checkpoint, Operation, ToolVersion


def iso(value: datetime | None) -> str | None:
    """RFC 3339 in UTC with a ``Z``, as DRF renders a DateTimeField."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def grant(grant: Any) -> dict[str, Any]:
    decided_by = [
        decision.user.username
        for decision in grant.request.decisions.all()
        if decision.decision == Decision.Verdict.APPROVE
    ]
    if grant.standing_grant_id is not None:
        # Given by a use of a standing grant: the people who signed it decided.
        decided_by += [s.user.username for s in grant.standing_grant.signatures.all()]
    return {
        "id": grant.id,
        "intent_hash": grant.intent_hash,
        "expires_at": iso(grant.expires_at),
        "revoked_at": iso(grant.revoked_at),
        "decided_by": decided_by,
    }


def standing_grant(grant: StandingGrant) -> dict[str, Any]:
    """A standing grant as the ``standing_grant.*`` webhooks carry it."""
    summed = bool(grant.sum_path)
    return {
        "id": grant.id,
        "tool": grant.tool,
        "principal": grant.principal or None,
        "run": grant.run_id or None,
        "pins": grant.pins,
        "max_uses": grant.max_uses,
        "uses": grant.uses,
        "uses_remaining": grant.uses_remaining,
        "sum_path": grant.sum_path or None,
        "max_sum": float(grant.max_sum) if grant.max_sum is not None else None,
        "sum_used": float(grant.sum_used) if summed else None,
        "sum_remaining": (
            max(float(grant.max_sum - grant.sum_used), 0.0) if grant.max_sum is not None else None
        ),
        "approvals_required": grant.approvals_required,
        "signed_by": [s.user.username for s in grant.signatures.select_related("user")],
        "status": str(grant.status),
        "created_at": iso(grant.created_at),
        "expires_at": iso(grant.expires_at),
        "revoke_reason": grant.revoke_reason or None,
    }


def approval(request: ApprovalRequest) -> dict[str, Any]:
    granted = getattr(request, "grant", None)
    return {
        "id": request.id,
        "status": str(request.status),
        "approvals_required": request.approvals_required,
        "reason": request.reason,
        "decisions": [
            {
                "by": decision.user.username,
                "decision": str(decision.decision),
                "comment": decision.comment,
                "at": iso(decision.at),
            }
            for decision in request.decisions.all()
        ],
        "created_at": iso(request.created_at),
        "expires_at": iso(request.expires_at),
        "grant": grant(granted) if granted is not None else None,
        "standing_grant": granted.standing_grant_id if granted is not None else None,
    }


def attempt(attempt: Attempt) -> dict[str, Any]:
    return {
        "attempt": attempt.number,
        "id": attempt.id,
        "idempotency_key": attempt.operation.idempotency_key,
        "lease_until": iso(attempt.lease_until),
        "status": str(attempt.status),
    }


def operation(op: Operation) -> dict[str, Any]:
    request = request_latest(op)
    return {
        "id": op.id,
        "run": op.run_id,
        "tool": op.tool_id,
        "tool_version": op.tool_version.number,
        "effect_class": op.effect_class,
        "call_id": op.call_id or None,
        "operation_key": op.operation_key,
        "arguments": op.arguments,
        "intent_hash": op.intent_hash,
        "principal": op.principal,
        "idempotency_key": op.idempotency_key,
        "status": str(op.status),
        "attempts": op.attempts,
        "not_before": iso(op.not_before),
        "lease_until": iso(op.lease_until),
        "deadline_at": iso(op.deadline_at),
        "approval": approval(request) if request is not None else None,
        "result": op.result,
        "downstream_id": op.downstream_id or None,
        "error_code": op.error_code or None,
        "error_detail": op.error_detail or None,
        "next_probe_at": iso(op.next_probe_at),
        "previous_operation": op.previous_id,
        "superseded_by": op.superseded_by_id,
        "edits": op.edits,
        "allowed_next_actions": allowed_next_actions(
            status=op.status, now=timezone.now(), not_before=op.not_before
        ),
        "created_at": iso(op.created_at),
        "updated_at": iso(op.updated_at),
    }


def tool_version(version: ToolVersion) -> dict[str, Any]:
    """A contract version: the stored contract's own fields at the top level, as the
    runner PUT them with every default filled in, then the version's."""
    tool = version.tool
    active = tool.active_version
    return {
        **version.contract,
        "name": version.tool_id,
        "owner": tool.owner.name if tool.owner is not None else None,
        "version": version.number,
        "active_version": active.number if active is not None else None,
        "active": tool.active_version_id == version.pk,
        "weakens": list(version.weakens),
        "created_at": iso(version.created_at),
    }


def b64(digest: bytes) -> str:
    """A hash as the transparency log's bodies write it: standard base64, padded."""
    return base64.b64encode(bytes(digest)).decode()


def checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
    """A signed checkpoint of the transparency log (the API's and ``audit.checkpoint``'s
    body): what ``note``, the C2SP signed note, says, and the note itself."""
    return {
        "size": checkpoint.size,
        "root": b64(checkpoint.root),
        "time": iso(checkpoint.time),
        "origin": checkpoint.origin,
        "note": checkpoint.note,
    }
