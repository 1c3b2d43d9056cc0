"""Audit verification beyond the chains: the ledger state follows from the events,
TRUNCATE is refused, and anchors kept elsewhere reveal a removed or rewritten history.

The forgeries here use only what the application's database credentials allow: plain
INSERT and UPDATE on tables without triggers, INSERT on the append-only ones.
"""

import contextlib
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
import time_machine
from django.apps import apps
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals.models import ApprovalRequest, Decision, Grant, StandingGrant
from operations import audit, services
from operations.canonical import sha256_hex
from operations.dbroles import as_owner
from operations.errors import NotUnknown
from operations.models import (
    Event,
    LogLeaf,
    Operation,
    Policy,
    Resolution,
    Run,
    Tool,
    ToolVersion,
)
from operations.payloads import iso
from operations.triggers import APPEND_ONLY_MODELS, ignored, trigger_uris, truncate_trigger_uris
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner
from tests.support.audit_log import seal_all

from .conftest import audit_verify, on_postgresql, postgresql_only, steward


def _anchor(*args: str) -> str:
    out = StringIO()
    call_command("audit", "anchor", *args, stdout=out)
    return out.getvalue().strip()


def _sql(statement: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


@contextlib.contextmanager
def tampering():
    """What a database owner could do: bypass every audit trigger (SQLite has none)."""
    with as_owner(), ignored(*trigger_uris(), *truncate_trigger_uris()):
        yield


def _unexplained() -> list[str]:
    return [found.describe() for found in audit.state_verify()]


def _decider(tool: str):
    return person(decide_on=tool)


def _reconciler(tool: str):
    user = person()
    assign_perm("operations.reconcile_tool", user, Tool.objects.get(pk=tool))
    return user


def _pending(api, tool: str = "pay", **approval) -> dict:
    api.tool(tool, contract("irreversible", approval={"mode": "always", **approval}))
    op = api.register(api.run(principal="user:nobody"), tool)
    assert op["status"] == "awaiting_approval"
    return op


def _decide(op: dict, user, *, approve: bool = True, comment: str = "ok") -> None:
    services.approval_decide(
        request_id=op["approval"]["id"], user=user, approve=approve, comment=comment
    )


def _unknown(api, tool: str, effect_class: str = "irreversible") -> Operation:
    api.tool(tool, contract(effect_class))
    op = api.register(api.run(), tool)
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    return Operation.objects.get(pk=op["id"])


def _rich_ledger(api) -> dict[str, str]:
    """Work in every state the approvals, reconciliation and runs can leave behind,
    written through the services only."""
    ids: dict[str, str] = {}

    # Approved, claimed, succeeded.
    op = _pending(api)
    approver = _decider("pay")
    _decide(op, approver)
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "succeeded", "downstream_id": "re_1"})
    ids["approved"] = op["id"]

    # Rejected with a reason.
    op = api.register(api.run(principal="user:nobody"), "pay")
    _decide(op, approver, approve=False, comment="already refunded")
    ids["rejected"] = op["id"]

    # A quorum of two: one approval, then the run is cancelled and the request withdrawn.
    op = _pending(api, "pay2", approvals_required=2)
    _decide(op, _decider("pay2"))
    operator = person()
    assign_perm("operations.change_run", operator)
    services.run_cancel(
        run=Operation.objects.get(pk=op["id"]).run, actor=services.Actor.of_user(operator)
    )
    ids["withdrawn"] = op["id"]

    # Approved, the grant revoked, the claim refused and a new request opened.
    op = api.register(api.run(principal="user:nobody"), "pay")
    _decide(op, approver)
    services.approval_revoke(request_id=op["approval"]["id"], user=approver, reason="fraud")
    api.claim(op["id"], expect=403)
    ids["revoked"] = op["id"]

    # Nobody decides: the request expires and the operation is rejected by the sweep.
    op = _pending(api, "pay3", request_ttl_s=60)
    with time_machine.travel(timezone.now() + timedelta(seconds=61), tick=False):
        assert services.sweep().approvals_expired == 1
    ids["expired"] = op["id"]

    # Unknown; "did not happen" proposed and confirmed by a second person; the new
    # approval given; the retry succeeds.
    unknown = _unknown(api, "refund")
    first, second = _reconciler("refund"), _reconciler("refund")
    services.operation_resolve(operation=unknown, user=first, result="not_found", note="none")
    resolution = Resolution.objects.get(operation=unknown)
    services.operation_resolution_confirm(resolution_id=resolution.id, user=second, confirm=True)
    request = ApprovalRequest.objects.get(operation=unknown)
    services.approval_decide(
        request_id=request.id, user=_decider("refund"), approve=True, comment=""
    )
    api.claim(unknown.id)
    api.outcome(unknown.id, 2, {"kind": "succeeded"})
    ids["confirmed"] = unknown.id

    # Unknown; a proposal disputed; a note, a snooze; then committed by a person.
    unknown = _unknown(api, "refund")
    services.operation_resolve(operation=unknown, user=first, result="not_found", note="none")
    resolution = Resolution.objects.get(operation=unknown)
    services.operation_resolution_confirm(
        resolution_id=resolution.id, user=second, confirm=False, note="the bank says sent"
    )
    services.operation_note_add(operation=unknown, user=second, note="asked the bank")
    services.operation_resolve(
        operation=unknown,
        user=second,
        result="still_unknown",
        snooze_until=timezone.now() + timedelta(hours=1),
    )
    services.operation_resolve(
        operation=unknown, user=second, result="committed", downstream_id="re_9"
    )
    ids["disputed"] = unknown.id

    # Unknown; a proposal pending when the runner's probe answers: the confirmation
    # comes too late and is recorded as withdrawn.
    unknown = _unknown(api, "refund")
    services.operation_resolve(operation=unknown, user=first, result="not_found", note="none")
    resolution = Resolution.objects.get(operation=unknown)
    services.operation_reconcile(
        operation=unknown,
        result="committed",
        actor=services.Actor.of_runner(api.runner),
        downstream_id="re_3",
    )
    with pytest.raises(NotUnknown):
        services.operation_resolution_confirm(
            resolution_id=resolution.id, user=second, confirm=True
        )
    ids["withdrawn_review"] = unknown.id

    # Unknown on an idempotent tool: back to ready with the same key.
    ids["idempotent_retry"] = _unknown(api, "lookup", "idempotent").id

    # Reconciled by the runner: still_unknown (a probe), then not_found (an
    # irreversible tool: a new approval).
    unknown = _unknown(api, "charge")
    for result in ("still_unknown", "not_found"):
        services.operation_reconcile(
            operation=Operation.objects.get(pk=unknown.id),
            result=result,
            actor=services.Actor.of_runner(api.runner),
        )
    ids["reconciled"] = unknown.id

    # Compensable: unknown, undone.
    api.tool("email", contract("compensable"))
    op = api.register(api.run(), "email")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown"})
    services.operation_compensate(
        operation=Operation.objects.get(pk=op["id"]),
        result="committed",
        actor=services.Actor.of_runner(api.runner),
    )
    ids["compensated"] = op["id"]

    # Failed, retried, heartbeat, succeeded; a lease that expires under the sweep (an
    # unknown outcome: retried with the same key).
    api.tool("idem", contract("idempotent"))
    op = api.register(api.run(), "idem")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "failed", "code": "rate_limited"})
    api.claim(op["id"], lease_s=60)
    api.post(f"/api/v1/operations/{op['id']}/attempts/2/heartbeat", {"lease_s": 60})
    api.outcome(op["id"], 2, {"kind": "succeeded"})
    op = api.register(api.run(), "idem")
    api.claim(op["id"], lease_s=5)
    with time_machine.travel(timezone.now() + timedelta(seconds=10), tick=False):
        assert services.sweep().leases_expired == 1
    ids["lease_expired"] = op["id"]

    # A standing grant signed by two people, used up: one use claimed and succeeded,
    # the last one exhausting it; another revoked, its use refused at the next claim.
    api.tool(
        "payout", contract("irreversible", approval={"mode": "always", "approvals_required": 2})
    )
    signers = [_decider("payout"), _decider("payout")]
    terms = services.StandingTerms(
        tool="payout",
        max_uses=2,
        expires_at=timezone.now() + timedelta(hours=1),
        pins=[{"path": "/amount_cents", "op": "lte", "value": 1000}],
        sum_path="/amount_cents",
        max_sum=Decimal(5000),
    )
    grant = services.standing_grant_issue(terms, user=signers[0])
    services.standing_grant_sign(grant_id=grant.id, user=signers[1])
    run = api.run(principal="user:nobody")
    op = api.register(run, "payout", claim={"lease_s": 30})
    api.outcome(op["id"], 1, {"kind": "succeeded"})
    ids["standing_used"] = op["id"]
    assert api.register(run, "payout")["status"] == "ready"
    grant = services.standing_grant_issue(terms, user=signers[0])
    services.standing_grant_sign(grant_id=grant.id, user=signers[1])
    op = api.register(run, "payout")
    services.standing_grant_revoke(grant_id=grant.id, user=signers[1], reason="paused")
    api.claim(op["id"], expect=403)
    ids["standing_revoked"] = op["id"]

    # A contract version that weakens the active one, activated by a person.
    api.tool("pay4", contract("irreversible", approval={"mode": "always"}))
    weaker = api.tool("pay4", contract("irreversible", approval={"mode": "never"}))
    admin = person()
    assign_perm("operations.activate_tool", admin, Tool.objects.get(pk="pay4"))
    services.tool_version_activate(
        version=Tool.objects.get(pk="pay4").versions.get(number=weaker["version"]), user=admin
    )

    # People's policies: a forbid in force that refused a registration, with a newer
    # text watched in shadow; a policy that asked for a person, in force at its second
    # text; one retired; one still a draft.
    api.tool("refund", contract("irreversible"))
    ann, bob = steward(), steward()
    forbid = (
        '@id("no-huge")\nforbid(principal, action == Action::"register", resource)\n'
        "when { context.arguments has amount_cents && context.arguments.amount_cents > %d };"
    )
    services.policies.policy_write(user=ann, text=forbid % 500000)
    services.policies.policy_activate(user=bob, policy_id="no-huge")
    services.policies.policy_write(user=bob, text=forbid % 400000, shadow=True)
    api.register(api.run(), "refund", {"payment_id": "p", "amount_cents": 600000}, expect=403)
    ask = (
        '@id("ask-big")\n@approval("required")\n'
        'permit(principal, action == Action::"register", resource == Tool::"refund")\n'
        "when { context.arguments.amount_cents > %d };"
    )
    services.policies.policy_write(user=ann, text=ask % 10000)
    services.policies.policy_activate(user=bob, policy_id="ask-big")
    services.policies.policy_write(user=bob, text=ask % 20000)
    services.policies.policy_activate(user=ann, policy_id="ask-big")
    op = api.register(api.run(), "refund", {"payment_id": "p", "amount_cents": 30000})
    ids["policy_asked"] = op["id"]
    services.policies.policy_write(user=ann, text=(ask % 1).replace("ask-big", "gone"))
    services.policies.policy_activate(user=bob, policy_id="gone")
    services.policies.policy_retire(user=ann, policy_id="gone", reason="no longer needed")
    services.policies.policy_write(user=ann, text=(ask % 2).replace("ask-big", "draft"))
    return ids


def test_a_rich_clean_ledger_has_no_unexplained_row(api):
    ids = _rich_ledger(api)
    statuses = dict(Operation.objects.filter(pk__in=ids.values()).values_list("pk", "status"))
    assert {name: statuses[op_id] for name, op_id in ids.items()} == {
        "approved": "succeeded",
        "rejected": "rejected",
        "withdrawn": "cancelled",
        "revoked": "awaiting_approval",
        "expired": "rejected",
        "confirmed": "succeeded",
        "disputed": "succeeded",
        "withdrawn_review": "succeeded",
        "idempotent_retry": "ready",
        "reconciled": "awaiting_approval",
        "compensated": "compensated",
        "lease_expired": "ready",
        "standing_used": "succeeded",
        "standing_revoked": "awaiting_approval",
        "policy_asked": "awaiting_approval",
    }
    assert dict(Policy.objects.values_list("pk", "state")) == {
        "no-huge": "active",
        "ask-big": "active",
        "gone": "retired",
        "draft": "draft",
    }
    assert set(StandingGrant.objects.values_list("status", flat=True)) == {"exhausted", "revoked"}
    assert set(ApprovalRequest.objects.values_list("status", flat=True)) == {
        "approved",
        "rejected",
        "withdrawn",
        "revoked",
        "pending",
        "expired",
    }
    assert set(Resolution.objects.values_list("review__decision", flat=True)) == {
        "confirmed",
        "disputed",
        "withdrawn",
    }
    assert _unexplained() == []
    code, out = audit_verify()
    assert code == 0, out
    assert "Every chain verifies." in out
    assert "Every state row follows from the events." in out


@pytest.mark.slow
def test_the_demo_ledger_has_no_unexplained_row(db):
    call_command("seed_demo", stdout=StringIO())
    assert Operation.objects.count() > 100
    assert _unexplained() == []


# --- forged state -----------------------------------------------------------------------


def _forge_approval(op: dict, approver) -> int:
    """A decision and a grant inserted, the request and the operation updated: what
    ``approval_decide`` writes, without its events."""
    now = timezone.now()
    request = ApprovalRequest.objects.get(pk=op["approval"]["id"])
    _sql(
        "INSERT INTO approvals_decision (request_id, user_id, decision, comment, at) "
        "VALUES (%s, %s, 'approve', '', %s)",
        [request.pk, approver.pk, now],
    )
    _sql(
        "INSERT INTO approvals_grant (id, request_id, intent_hash, created_at, expires_at, "
        "revoke_reason) VALUES ('grt_forged', %s, %s, %s, %s, '')",
        [request.pk, request.intent_hash, now, now + timedelta(hours=1)],
    )
    _sql(
        "UPDATE approvals_approvalrequest SET status = 'approved', decided_at = %s WHERE id = %s",
        [now, request.pk],
    )
    _sql("UPDATE operations_operation SET status = 'ready' WHERE id = %s", [op["id"]])
    return Decision.objects.get(request=request).pk


def test_a_forged_approval_lets_the_claim_through_and_verify_names_the_decision(api):
    op = _pending(api)
    decision = _forge_approval(op, _decider("pay"))
    # The attack works: the runner's claim is accepted on the forged grant.
    assert api.claim(op["id"])["attempt"] == 1
    # The chains alone see nothing wrong: every event there is genuine.
    assert audit.chains_verify().ok

    code, out = audit_verify()
    assert code == 1
    assert "Every chain verifies." in out
    assert f"UNEXPLAINED approvals.Decision {decision}: no decision event" in out
    assert f"No event explains approvals.Decision {decision}" in out

    code, out = audit_verify("--all")
    assert code == 1
    assert f"approvals.Grant grt_forged: no granted event in {op['id']}" in out
    assert (
        f"approvals.ApprovalRequest {op['approval']['id']}: its status is approved, "
        "but no event settled it" in out
    )
    # The claim's event starts from "ready", which no event had left.
    assert (
        f"operations.Operation {op['id']}: its event seq 3 (claimed) starts from ready, "
        "but the event before it left awaiting_approval" in out
    )


def test_a_status_changed_without_an_event_is_named(api):
    op = _pending(api)
    _sql("UPDATE operations_operation SET status = 'ready' WHERE id = %s", [op["id"]])
    assert _unexplained() == [
        f"operations.Operation {op['id']}: its status is ready, but its last event left "
        "it awaiting_approval"
    ]


def test_an_extended_or_unrevoked_grant_is_named(api):
    op = _pending(api)
    approver = _decider("pay")
    _decide(op, approver)
    grant = Grant.objects.get()
    extended = grant.expires_at + timedelta(days=30)
    _sql("UPDATE approvals_grant SET expires_at = %s WHERE id = %s", [extended, grant.pk])
    code, out = audit_verify()
    assert code == 1
    assert (
        f"UNEXPLAINED approvals.Grant {grant.pk}: its expires_at is {iso(extended)}, but its "
        f"granted event says {iso(grant.expires_at)}" in out
    )

    _sql("UPDATE approvals_grant SET expires_at = %s WHERE id = %s", [grant.expires_at, grant.pk])
    services.approval_revoke(request_id=op["approval"]["id"], user=approver, reason="fraud")
    assert _unexplained() == []
    _sql("UPDATE approvals_grant SET revoked_at = NULL WHERE id = %s", [grant.pk])
    _sql(
        "UPDATE approvals_approvalrequest SET status = 'approved' WHERE id = %s",
        [op["approval"]["id"]],
    )
    # The attack works: the next claim goes through on the grant revoked for fraud.
    assert api.claim(op["id"])["attempt"] == 1
    assert _unexplained() == [
        f"approvals.Grant {grant.pk}: a grant_revoked event revoked it, but revoked_at is empty",
        f"approvals.ApprovalRequest {op['approval']['id']}: its status is approved, but its "
        "last grant_revoked event left it revoked",
    ]
    assert audit_verify()[0] == 1


def test_changed_arguments_or_a_reset_attempt_count_are_named(api):
    api.tool("t", contract("idempotent"))
    op = api.register(api.run(), "t")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "failed", "code": "rate_limited"})
    _sql("UPDATE operations_operation SET attempts = 0 WHERE id = %s", [op["id"]])
    assert _unexplained() == [
        f"operations.Operation {op['id']}: it counts 0 attempts, but 1 claimed events"
    ]
    _sql(
        "UPDATE operations_operation SET attempts = 1, arguments = %s WHERE id = %s",
        ['{"payment_id": "pay_1", "amount_cents": 500000}', op["id"]],
    )
    assert _unexplained() == [
        f"operations.Operation {op['id']}: its intent_hash is not the hash of its "
        "arguments and principal"
    ]


def test_a_revived_run_and_a_swapped_contract_version_are_named(api):
    api.tool("pay", contract("irreversible", approval={"mode": "always"}))
    weaker = api.tool("pay", contract("irreversible", approval={"mode": "never"}))
    assert Tool.objects.get(pk="pay").active_version.number == 1
    run = api.run()
    services.run_cancel(run=Run.objects.get(pk=run), actor=services.Actor.system("test"))
    _sql("UPDATE operations_run SET status = 'active' WHERE id = %s", [run])
    _sql(
        "UPDATE operations_tool SET active_version_id = %s WHERE name = 'pay'",
        [Tool.objects.get(pk="pay").versions.get(number=weaker["version"]).pk],
    )
    assert _unexplained() == [
        f"operations.Run {run}: its status is active, but its last event left it cancelled",
        "operations.Tool pay: its active version is 2, but its last activating event named 1",
    ]


def test_a_resolution_inserted_without_its_event_is_named(api):
    unknown = _unknown(api, "refund")
    _sql(
        "INSERT INTO operations_resolution (id, operation_id, declared_by_id, note, evidence, "
        "created_at) VALUES ('res_forged', %s, %s, 'none', '{}', %s)",
        [unknown.id, person().pk, timezone.now()],
    )
    assert _unexplained() == [
        f"operations.Resolution res_forged: no resolution_proposed event in {unknown.id} "
        "by its declarer"
    ]


# --- the terms a request, a grant and a run were opened with ---------------------------
#
# These rows decide what may run without being a status: a quorum, an expiry, an
# escalation group, the fields a person may edit, a budget. Each is a plain UPDATE away
# on PostgreSQL too (only events, decisions and resolutions are append-only there).


@postgresql_only
def test_a_quorum_lowered_in_sql_lets_one_approval_through_and_verify_names_the_request(api):
    op = _pending(api, approvals_required=2)
    request_id = op["approval"]["id"]
    _sql("UPDATE approvals_approvalrequest SET approvals_required = 1 WHERE id = %s", [request_id])
    _decide(op, _decider("pay"))
    # The attack works: one person's approval made the grant, and the runner may claim.
    assert Grant.objects.filter(request_id=request_id).exists()
    assert api.claim(op["id"])["attempt"] == 1
    assert Operation.objects.get(pk=op["id"]).status == "executing"
    assert audit.chains_verify().ok

    code, out = audit_verify("--all")
    assert code == 1
    assert "Every chain verifies." in out
    assert (
        f"UNEXPLAINED approvals.ApprovalRequest {request_id}: its approvals_required is 1, "
        "but its approval_requested event opened it with 2" in out
    )
    assert (
        f"UNEXPLAINED approvals.Grant {Grant.objects.get().pk}: it was given on 1 approval, "
        "but its request was opened requiring 2" in out
    )


def _request_line(request_id: str, column: str, row_value: str, recorded: str) -> str:
    return (
        f"UNEXPLAINED approvals.ApprovalRequest {request_id}: its {column} is {row_value}, "
        f"but its approval_requested event opened it with {recorded}"
    )


def test_a_quorum_lowered_for_one_approval_and_put_back_leaves_the_grant_named(api):
    op = _pending(api, approvals_required=2)
    request_id = op["approval"]["id"]
    _sql("UPDATE approvals_approvalrequest SET approvals_required = 1 WHERE id = %s", [request_id])
    _decide(op, _decider("pay"))
    _sql("UPDATE approvals_approvalrequest SET approvals_required = 2 WHERE id = %s", [request_id])
    assert ApprovalRequest.objects.get(pk=request_id).status == "approved"
    grant = Grant.objects.get(request_id=request_id)
    assert _unexplained() == [
        f"approvals.Grant {grant.pk}: it was given on 1 approval, but its request was opened "
        "requiring 2"
    ]
    assert audit_verify()[0] == 1


def test_an_expiry_moved_later_is_named_and_so_is_a_decision_taken_after_the_real_one(api):
    op = _pending(api, request_ttl_s=60)
    request = ApprovalRequest.objects.get(pk=op["approval"]["id"])
    later = request.expires_at + timedelta(days=1)
    _sql("UPDATE approvals_approvalrequest SET expires_at = %s WHERE id = %s", [later, request.pk])
    code, out = audit_verify()
    assert code == 1
    assert (
        _request_line(request.pk, "expires_at", f'"{iso(later)}"', f'"{iso(request.expires_at)}"')
        in out
    )

    # The attack: decided after the request's real expiry, then the expiry put back.
    with time_machine.travel(request.expires_at + timedelta(seconds=1), tick=False):
        assert services.sweep().approvals_expired == 0
        _decide(op, _decider("pay"))
    assert Operation.objects.get(pk=op["id"]).status == "ready"
    _sql(
        "UPDATE approvals_approvalrequest SET expires_at = %s WHERE id = %s",
        [request.expires_at, request.pk],
    )
    decision = Decision.objects.get(request=request)
    assert _unexplained() == [
        f"approvals.Decision {decision.pk}: it is dated {iso(decision.at)}, but its request "
        f"{request.pk} expired at {iso(request.expires_at)}"
    ]
    assert audit_verify()[0] == 1


ESCALATING = {"escalate_after_s": 3600, "escalate_to": "Finance leads"}


def test_an_escalation_group_changed_is_named_though_the_sweep_escalates_to_it(api):
    op = _pending(api, **ESCALATING)
    request_id = op["approval"]["id"]
    _sql("UPDATE approvals_approvalrequest SET escalate_to = 'Interns' WHERE id = %s", [request_id])
    # The sweep offers the request to the forged group and records that, as it should:
    # the event names the group the row holds, so only the opening terms tell.
    with time_machine.travel(timezone.now() + timedelta(seconds=3601), tick=False):
        assert services.sweep().approvals_escalated == 1
    assert Event.objects.get(stream=op["id"], kind="approval_escalated").data["group"] == (
        "Interns"
    )
    code, out = audit_verify()
    assert code == 1
    assert _request_line(request_id, "escalate_to", '"Interns"', '"Finance leads"') in out


def test_an_escalation_brought_forward_and_put_back_is_named(api):
    op = _pending(api, **ESCALATING)
    request = ApprovalRequest.objects.get(pk=op["approval"]["id"])
    now = timezone.now()
    _sql("UPDATE approvals_approvalrequest SET escalate_at = %s WHERE id = %s", [now, request.pk])
    assert _unexplained() == [
        _request_line(
            request.pk, "escalate_at", f'"{iso(now)}"', f'"{iso(request.escalate_at)}"'
        ).removeprefix("UNEXPLAINED ")
    ]
    with time_machine.travel(now + timedelta(seconds=1), tick=False):
        assert services.sweep().approvals_escalated == 1
    _sql(
        "UPDATE approvals_approvalrequest SET escalate_at = %s WHERE id = %s",
        [request.escalate_at, request.pk],
    )
    escalated = Event.objects.get(stream=op["id"], kind="approval_escalated")
    assert _unexplained() == [
        f"approvals.ApprovalRequest {request.pk}: its approval_escalated event is dated "
        f"{iso(escalated.at)}, before its escalate_at {iso(request.escalate_at)}"
    ]


def test_an_editable_list_widened_in_the_contract_row_is_named_on_the_request(api):
    op = _pending(api, editable=["/amount_cents"])
    version = ToolVersion.objects.get(tool_id="pay")
    widened = {
        **version.contract,
        "approval": {**version.contract["approval"], "editable": ["/amount_cents", "/payment_id"]},
    }
    ToolVersion.objects.filter(pk=version.pk).update(
        contract=widened, contract_hash=sha256_hex(widened)
    )
    # The attack: the approver now changes whom the money goes to.
    successor = services.approval_decide(
        request_id=op["approval"]["id"],
        user=_decider("pay"),
        approve=True,
        comment="",
        edits={"/payment_id": "pay_mallory"},
    )
    assert successor.arguments["payment_id"] == "pay_mallory"
    code, out = audit_verify("--all")
    assert code == 1
    assert (
        _request_line(
            op["approval"]["id"],
            "editable",
            '["/amount_cents", "/payment_id"]',
            '["/amount_cents"]',
        )
        in out
    )
    assert (
        "UNEXPLAINED operations.ToolVersion pay v1: its contract_hash is not the one its "
        "contract_registered event holds" in out
    )


def test_people_unbarred_from_a_request_are_named(api):
    unknown = _unknown(api, "refund")
    declarer = _reconciler("refund")
    services.operation_resolve(operation=unknown, user=declarer, result="not_found", note="none")
    services.operation_resolution_confirm(
        resolution_id=Resolution.objects.get(operation=unknown).id,
        user=_reconciler("refund"),
        confirm=True,
    )
    request = ApprovalRequest.objects.get(operation=unknown)
    assert declarer.pk in request.context["barred_user_ids"]
    assert _unexplained() == []
    ApprovalRequest.objects.filter(pk=request.pk).update(context={})
    assert _unexplained() == [
        f"approvals.ApprovalRequest {request.pk}: its barred_user_ids is [], but its "
        f"reconciled event opened it with {request.context['barred_user_ids']}"
    ]


def test_a_run_budget_raised_in_sql_lets_another_call_through_and_verify_names_the_run(api):
    api.tool("t", contract("idempotent"))
    run = api.run(max_tool_calls=1, max_spend=0.1234565, deadline_s=600)
    api.register(run, "t")
    api.register(run, "t", expect=409)
    _sql("UPDATE operations_run SET max_tool_calls = 100 WHERE id = %s", [run])
    api.register(run, "t")
    assert Run.objects.get(pk=run).tool_calls == 2
    code, out = audit_verify()
    assert code == 1
    assert (
        f"UNEXPLAINED operations.Run {run}: its max_tool_calls is 100, but its run_created "
        "event opened it with 1" in out
    )

    created = Run.objects.get(pk=run)
    # Rounded half up to the column's six places, on every database.
    assert str(created.max_spend) == "0.123457"
    later = created.deadline_at + timedelta(days=1)
    _sql(
        "UPDATE operations_run SET max_tool_calls = 1, max_spend = 1000, deadline_s = NULL, "
        "deadline_at = %s WHERE id = %s",
        [later, run],
    )
    assert _unexplained() == [
        f"operations.Run {run}: its deadline_s is null, but its run_created event opened it "
        f'with 600; its max_spend is "1000.000000", but its run_created event opened it '
        f'with "0.123457"; its deadline_at is "{iso(later)}", but its run_created event '
        f'opened it with "{iso(created.deadline_at)}"'
    ]


def test_a_run_moved_to_another_principal_or_runner_is_named(api, other_api):
    run = api.run(principal="user:alice")
    _sql("UPDATE operations_run SET principal = 'user:mallory' WHERE id = %s", [run])
    assert _unexplained() == [
        f'operations.Run {run}: its principal is "user:mallory", but its run_created event '
        'says "user:alice"'
    ]
    _sql(
        "UPDATE operations_run SET principal = 'user:alice', runner_id = %s WHERE id = %s",
        [other_api.runner.pk, run],
    )
    assert _unexplained() == [
        f'operations.Run {run}: its runner_id is "{other_api.runner.pk}", but its run_created '
        f'event was written by runner "{api.runner.pk}"'
    ]


def _as_written_before_terms(*streams: str) -> None:
    """Rewrite ``streams`` as the previous release wrote them: no ``terms`` in the
    events that open requests and runs, no ``deciders`` in ``granted``; chained again."""
    with tampering():
        for stream in streams:
            prev = services.GENESIS_HASH
            for event in Event.objects.filter(stream=stream).order_by("seq"):
                event.data.pop("terms", None)
                event.data.pop("deciders", None)
                event.prev_hash = prev
                event.hash = services.event_hash(event)
                Event.objects.filter(pk=event.pk).update(
                    data=event.data, prev_hash=event.prev_hash, hash=event.hash
                )
                prev = event.hash


def test_rows_opened_before_the_events_held_their_terms_are_compared_with_the_contract(api):
    approved = _pending(api, approvals_required=2, request_ttl_s=600)
    _decide(approved, _decider("pay"))
    _decide(approved, _decider("pay"))
    op = api.register(api.run(principal="user:nobody", max_tool_calls=5), "pay")
    run = Operation.objects.get(pk=op["id"]).run_id
    streams = [approved["id"], op["id"], run, Operation.objects.get(pk=approved["id"]).run_id]
    _as_written_before_terms(*streams)
    assert audit.chains_verify().ok
    assert not Event.objects.filter(data__has_key="terms")
    assert not Event.objects.filter(data__has_key="deciders")
    assert _unexplained() == []

    request = ApprovalRequest.objects.get(pk=op["approval"]["id"])
    later = request.expires_at + timedelta(days=1)
    _sql(
        "UPDATE approvals_approvalrequest SET approvals_required = 1, expires_at = %s "
        "WHERE id = %s",
        [later, request.pk],
    )
    _sql("UPDATE operations_run SET max_tool_calls = 50 WHERE id = %s", [run])
    source = "its contract version and its approval_requested event's time give"
    assert _unexplained() == [
        f"approvals.ApprovalRequest {request.pk}: its approvals_required is 1, but {source} "
        f'2; its expires_at is "{iso(later)}", but {source} "{iso(request.expires_at)}"',
        f"operations.Run {run}: its max_tool_calls is 50, but its run_created event's "
        "budgets give 5",
    ]


# --- what an operation took from its contract version and its run ----------------------


def test_an_operation_pointed_at_another_tools_version_of_the_same_number_is_named(api):
    op = _pending(api, editable=[])
    api.tool(
        "lax", contract("irreversible", approval={"mode": "always", "editable": ["/payment_id"]})
    )
    lax = ToolVersion.objects.get(tool_id="lax", number=1)
    _sql("UPDATE operations_operation SET tool_version_id = %s WHERE id = %s", [lax.pk, op["id"]])
    # The attack: the contract now read for this operation lets the approver edit it.
    successor = services.approval_decide(
        request_id=op["approval"]["id"],
        user=_decider("pay"),
        approve=True,
        comment="",
        edits={"/payment_id": "pay_mallory"},
    )
    assert successor.arguments["payment_id"] == "pay_mallory"
    code, out = audit_verify("--all")
    assert code == 1
    assert (
        f"UNEXPLAINED operations.Operation {op['id']}: its tool_version is a version of lax, "
        "not of its tool pay" in out
    )


def test_an_effect_class_or_deadline_changed_in_sql_is_named(api):
    api.tool("pay", contract("irreversible", retry={**contract()["retry"], "deadline_s": 60}))
    op = api.register(api.run(), "pay")
    registered = Operation.objects.get(pk=op["id"])
    _sql("UPDATE operations_operation SET effect_class = 'idempotent' WHERE id = %s", [op["id"]])
    assert _unexplained() == [
        f'operations.Operation {op["id"]}: its effect_class is "idempotent", but its contract '
        'version says "irreversible"'
    ]
    # The attack works: an unknown outcome of the irreversible call is retried by itself.
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown"})
    assert Operation.objects.get(pk=op["id"]).status == "ready"

    later = registered.deadline_at + timedelta(days=1)
    _sql(
        "UPDATE operations_operation SET effect_class = 'irreversible', deadline_at = %s "
        "WHERE id = %s",
        [later, op["id"]],
    )
    assert _unexplained() == [
        f'operations.Operation {op["id"]}: its deadline_at is "{iso(later)}", but its '
        f'registered event says "{iso(registered.deadline_at)}"'
    ]


def test_a_concurrency_value_cleared_in_sql_is_named(api):
    api.tool("pay", contract("irreversible", concurrency_key="/payment_id"))
    op = api.register(api.run(), "pay")
    api.claim(op["id"])
    second = api.register(api.run(), "pay")
    api.claim(second["id"], expect=409)
    _sql("UPDATE operations_operation SET concurrency_value = NULL WHERE id = %s", [op["id"]])
    # The attack works: a second effect on the same payment while the first is unresolved.
    assert api.claim(second["id"])["attempt"] == 1
    held = Operation.objects.get(pk=second["id"]).concurrency_value
    assert _unexplained() == [
        f"operations.Operation {op['id']}: its concurrency_value is null, but its arguments "
        f'and contract version give "{held}"'
    ]


def test_an_operation_moved_to_another_run_or_runner_is_named(api, other_api):
    api.tool("t", contract("idempotent"))
    run, roomy = api.run(max_tool_calls=1), other_api.run(max_tool_calls=100)
    op = api.register(run, "t")
    _sql("UPDATE operations_operation SET run_id = %s WHERE id = %s", [roomy, op["id"]])
    assert _unexplained() == [
        f'operations.Operation {op["id"]}: its run_id is "{roomy}", but its registered event '
        f'was written in run "{run}"'
    ]
    _sql(
        "UPDATE operations_operation SET run_id = %s, runner_id = %s WHERE id = %s",
        [run, other_api.runner.pk, op["id"]],
    )
    assert _unexplained() == [
        f'operations.Operation {op["id"]}: its runner_id is "{other_api.runner.pk}", but its '
        f'registered event was written by runner "{api.runner.pk}"'
    ]


def test_an_operation_given_another_idempotency_key_is_named(api):
    """The key every attempt carries downstream is recorded by the registered event: a
    row changed to another key (attempts sent with it would not be deduplicated against
    the first) is named."""
    api.tool("t", contract("idempotent"))
    op = api.register(api.run(), "t")
    _sql(
        "UPDATE operations_operation SET idempotency_key = %s WHERE id = %s",
        ["ik_forged", op["id"]],
    )
    assert _unexplained() == [
        f"operations.Operation {op['id']}: its idempotency_key differ from its registered event"
    ]


def _check_foreign_keys_now() -> None:
    # The test's transaction holds deferred foreign-key checks on the rows it wrote, and
    # PostgreSQL truncates no table with checks pending (before any trigger fires).
    _sql("SET CONSTRAINTS ALL IMMEDIATE", [])


def _empty_the_events_table() -> None:
    """What the finding did with TRUNCATE; here past the triggers, as a database owner
    could (on SQLite, which has none, a plain DELETE)."""
    if not on_postgresql():
        _sql("DELETE FROM operations_event", [])
        return
    _check_foreign_keys_now()
    with tampering():
        _sql("TRUNCATE operations_event", [])


def test_an_emptied_events_table_fails_because_operations_are_unexplained(api):
    api.tool("t", contract("idempotent"))
    op = api.register(api.run(), "t")
    _empty_the_events_table()
    code, out = audit_verify()
    assert code == 1
    assert "Checked 0 events in 0 streams" in out
    assert "UNEXPLAINED" in out
    code, out = audit_verify("--all")
    assert f"operations.Operation {op['id']}: it has no event at all, not even registered" in out


# --- TRUNCATE refused -------------------------------------------------------------------


@postgresql_only
def test_truncate_is_refused_on_every_audit_table(api, audit_key):
    _rich_ledger(api)
    seal_all()  # the transparency log's leaves, subtree hashes and a checkpoint
    before = {label: apps.get_model(label).objects.count() for label in APPEND_ONLY_MODELS}
    assert all(before.values())
    tables = [apps.get_model(label)._meta.db_table for label in APPEND_ONLY_MODELS]
    _check_foreign_keys_now()
    for statement in [
        # CASCADE: without it PostgreSQL itself refuses to empty a table others refer to
        # (resolutions, by their reviews) before any trigger has a say.
        *(f"TRUNCATE {table} CASCADE" for table in tables),
        # Emptying what they refer to reaches them through CASCADE, and is refused too.
        "TRUNCATE operations_operation CASCADE",
        "TRUNCATE approvals_approvalrequest CASCADE",
    ]:
        # As the owner, whom privileges would let through (the runtime role holds no
        # TRUNCATE at all: test_db_roles.py).
        with (
            as_owner(),
            pytest.raises(DatabaseError, match="pgtrigger: Cannot truncate"),
            transaction.atomic(),
        ):
            _sql(statement, [])
    assert {label: apps.get_model(label).objects.count() for label in APPEND_ONLY_MODELS} == (
        before
    )


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_flush_still_empties_the_database_and_the_triggers_stay():
    """The test runner flushes between transactional tests (this one included)."""
    _pending(make_runner())
    seal_all()
    assert LogLeaf.objects.exists()
    call_command("flush", interactive=False, verbosity=0)
    assert not Event.objects.exists()
    assert not Operation.objects.exists()
    assert not LogLeaf.objects.exists()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'pgtrigger_no_trunc%%'")
        assert cursor.fetchone()[0] == len(APPEND_ONLY_MODELS)
    with as_owner(), pytest.raises(DatabaseError, match="Cannot truncate"), transaction.atomic():
        _sql("TRUNCATE operations_event", [])


# --- anchors ----------------------------------------------------------------------------


def _history(api, tool: str = "t") -> str:
    api.tool(tool, contract("idempotent"))
    op = api.register(api.run(), tool)
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "failed", "code": "rate_limited"})
    return op["id"]


def test_an_anchor_still_holds_after_more_events_are_appended(api):
    first = _history(api)
    anchor = _anchor("--lag", "0")
    parsed = audit.Anchor.parse(anchor)
    assert (parsed.events, parsed.streams) == (
        Event.objects.count(),
        Event.objects.values("stream").distinct().count(),
    )
    with time_machine.travel(timezone.now() + timedelta(minutes=1)):
        api.claim(first)
        api.outcome(first, 2, {"kind": "succeeded"})
        _history(api, "t2")
    code, out = audit_verify("--expect", anchor)
    assert code == 0, out
    assert f"The anchor holds: the {parsed.events} events recorded by" in out


def test_an_anchor_reveals_a_rewritten_chain(api):
    op = _history(api)
    _history(api, "t2")
    anchor = _anchor("--lag", "0")
    prev = services.GENESIS_HASH
    with tampering():
        for event in Event.objects.filter(stream=op).order_by("seq"):
            event.actor = "user:mallory"
            event.prev_hash = prev
            event.hash = services.event_hash(event)
            Event.objects.filter(pk=event.pk).update(
                actor=event.actor, prev_hash=event.prev_hash, hash=event.hash
            )
            prev = event.hash
    assert audit.chains_verify().ok
    assert _unexplained() == []
    code, out = audit_verify("--expect", anchor)
    assert code == 1
    assert "Every chain verifies." in out
    assert f"ANCHOR MISMATCH expected {anchor}" in out
    assert "a chain was rewritten" in out


def test_an_anchor_reveals_an_emptied_table_and_a_backdated_event(api):
    op = _history(api)
    anchor = _anchor("--lag", "0")
    parsed = audit.Anchor.parse(anchor)

    last = Event.objects.filter(stream=op).order_by("-seq").first()
    forged = Event(
        stream=op,
        seq=last.seq + 1,
        kind="note",
        operation_id=op,
        from_status=last.to_status,
        to_status=last.to_status,
        actor="user:mallory",
        at=last.at,
        data={"note": "backdated"},
        prev_hash=last.hash,
    )
    forged.hash = services.event_hash(forged)
    forged.save()
    code, out = audit_verify("--expect", anchor)
    assert code == 1
    assert "1 events dated by then were added after the anchor was taken" in out

    _empty_the_events_table()
    code, out = audit_verify("--expect", anchor)
    assert code == 1
    assert f"{parsed.events} of the {parsed.events} events recorded by then are missing" in out


def test_anchor_refuses_a_broken_trail_and_verify_refuses_a_malformed_anchor(api):
    op = _history(api)
    code, out = audit_verify("--expect", "eg-anchor-v1,at=yesterday")
    assert code == 1
    assert "--expect takes an anchor printed by 'audit anchor'" in out
    with tampering():
        Event.objects.filter(stream=op, seq=2).update(kind="forged")
    with pytest.raises(CommandError, match="Not anchoring a broken audit trail"):
        _anchor()


def test_the_lag_keeps_recent_events_out_of_the_anchor(api):
    _history(api)
    with time_machine.travel(timezone.now() + timedelta(seconds=30)):
        parsed = audit.Anchor.parse(_anchor("--lag", "600"))
    assert (parsed.events, parsed.streams) == (0, 0)
    assert str(audit.Anchor.parse(str(parsed))) == str(parsed)
