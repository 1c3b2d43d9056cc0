"""People resolving unknown outcomes: every path, the four-eyes rule, permissions."""

from datetime import timedelta

import pytest
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals.errors import DecisionRefused, PermissionRefused
from approvals.models import ApprovalRequest
from operations import services
from operations.errors import NotUnknown
from operations.models import Event, Operation, Resolution, Tool
from tests.approvals.conftest import person
from tests.conftest import contract


def _support(tool: str, **fields):
    user = person(**fields)
    assign_perm("operations.reconcile_tool", user, Tool.objects.get(pk=tool))
    return user


def _unknown(api, cls="irreversible"):
    api.tool(f"t_{cls}", contract(cls, approval={"mode": "never"}))
    op = api.register(api.run(), f"t_{cls}")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    return Operation.objects.get(pk=op["id"])


def test_committed_with_a_reference_closes_as_succeeded(api):
    op = _unknown(api)
    user = _support("t_irreversible")
    services.operation_resolve(operation=op, user=user, result="committed", downstream_id="re_1")
    op.refresh_from_db()
    assert (op.status, op.downstream_id) == ("succeeded", "re_1")
    event = Event.objects.get(stream=op.id, kind="reconciled")
    assert (event.actor, event.data["source"]) == (f"user:{user.username}", "person")
    assert api.operation(op.id)["status"] == "succeeded"


def test_committed_needs_a_reference_or_a_note(api):
    op = _unknown(api)
    user = _support("t_irreversible")
    with pytest.raises(DecisionRefused, match="reference or an evidence note"):
        services.operation_resolve(operation=op, user=user, result="committed")
    services.operation_resolve(operation=op, user=user, result="committed", note="seen in ledger")
    assert Operation.objects.get(pk=op.pk).status == "succeeded"


def test_did_not_happen_on_irreversible_waits_for_a_second_person(api):
    op = _unknown(api)
    first, second = _support("t_irreversible"), _support("t_irreversible")
    services.operation_resolve(operation=op, user=first, result="not_found", note="no refund")
    assert Operation.objects.get(pk=op.pk).status == "outcome_unknown"
    resolution = Resolution.objects.get(operation=op)
    with pytest.raises(DecisionRefused, match="someone else must confirm"):
        services.operation_resolution_confirm(resolution_id=resolution.id, user=first, confirm=True)
    services.operation_resolution_confirm(resolution_id=resolution.id, user=second, confirm=True)
    op.refresh_from_db()
    assert op.status == "awaiting_approval"
    request = ApprovalRequest.objects.get(operation=op)
    assert first.pk in request.context["barred_user_ids"]
    assert request.context["reconciliation"]["declared_by"] == first.username
    assert request.context["reconciliation"]["confirmed_by"] == second.username


def test_the_declarer_cannot_approve_the_retry_that_follows(api):
    op = _unknown(api)
    first, second = _support("t_irreversible"), _support("t_irreversible")
    assign_perm("operations.decide_tool", first, Tool.objects.get(pk="t_irreversible"))
    services.operation_resolve(operation=op, user=first, result="not_found", note="no refund")
    resolution = Resolution.objects.get(operation=op)
    services.operation_resolution_confirm(resolution_id=resolution.id, user=second, confirm=True)
    request = ApprovalRequest.objects.get(operation=op)
    with pytest.raises(PermissionRefused, match="declared the reconciliation"):
        services.approval_decide(request_id=request.id, user=first, approve=True, comment="")


def test_a_disputed_declaration_changes_nothing(api):
    op = _unknown(api)
    first, second = _support("t_irreversible"), _support("t_irreversible")
    services.operation_resolve(operation=op, user=first, result="not_found", note="no refund")
    resolution = Resolution.objects.get(operation=op)
    with pytest.raises(DecisionRefused, match="why you dispute"):
        services.operation_resolution_confirm(
            resolution_id=resolution.id, user=second, confirm=False
        )
    services.operation_resolution_confirm(
        resolution_id=resolution.id,
        user=second,
        confirm=False,
        note="provider shows a pending refund",
    )
    assert Resolution.objects.get(pk=resolution.pk).status == "disputed"
    assert Resolution.objects.get(pk=resolution.pk).review.user == second
    assert Operation.objects.get(pk=op.pk).status == "outcome_unknown"


def test_did_not_happen_on_idempotent_takes_effect_at_once(api):
    op = _unknown(api, "idempotent")  # unknown retries for idempotent: make it sticky first
    api.claim(op.id)
    api.outcome(op.id, 2, {"kind": "failed", "code": "forbidden"})
    op.refresh_from_db()
    assert op.status == "outcome_unknown"
    services.operation_resolve(
        operation=op, user=_support("t_idempotent"), result="not_found", note="absent"
    )
    assert Operation.objects.get(pk=op.pk).status == "ready"


def test_still_unknown_snoozes_until_a_time(api):
    op = _unknown(api)
    user = _support("t_irreversible")
    with pytest.raises(DecisionRefused, match="future"):
        services.operation_resolve(operation=op, user=user, result="still_unknown")
    later = timezone.now() + timedelta(hours=2)
    services.operation_resolve(operation=op, user=user, result="still_unknown", snooze_until=later)
    op.refresh_from_db()
    assert op.status == "outcome_unknown"
    assert op.snoozed_until == later
    assert Event.objects.filter(stream=op.id, kind="snoozed").exists()


def test_reconcile_permission_is_per_tool(api):
    op = _unknown(api)
    api.tool("other", contract("irreversible"))
    elsewhere = _support("other")
    for call in (
        lambda: services.operation_resolve(
            operation=op, user=elsewhere, result="committed", note="x"
        ),
        lambda: services.operation_note_add(operation=op, user=elsewhere, note="x"),
    ):
        with pytest.raises(PermissionRefused):
            call()
    assert Operation.objects.get(pk=op.pk).status == "outcome_unknown"


def test_notes_are_evidence_on_the_trace(api):
    op = _unknown(api)
    services.operation_note_add(operation=op, user=_support("t_irreversible"), note="called bank")
    assert Event.objects.get(stream=op.id, kind="note").data == {"note": "called bank"}


def test_only_unknown_operations_are_resolved(api):
    api.tool("t")
    op = Operation.objects.get(pk=api.register(api.run(), "t")["id"])
    with pytest.raises(NotUnknown):
        services.operation_resolve(operation=op, user=_support("t"), result="committed", note="x")


def test_a_failed_undo_recorded_as_done_by_hand(api):
    op = _unknown(api, "compensable")
    api.post(f"/api/v1/operations/{op.id}/compensations", {"result": "failed"})
    services.operation_compensated_by_hand(
        operation=op, user=_support("t_compensable"), note="refunded in the bank portal"
    )
    op.refresh_from_db()
    assert op.status == "compensated"
    event = Event.objects.filter(stream=op.id, kind="compensation").last()
    assert event.data["evidence"] == {"note": "refunded in the bank portal", "by_hand": True}
