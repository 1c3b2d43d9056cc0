"""Standing grants: issuing and signing under the rules of deciding, uses at
registration, exhaustion, expiry, the sum cap, revocation at the next claim, and the
webhooks. The concurrency of uses is tests/operations/test_standing_concurrency.py."""

from datetime import timedelta
from decimal import Decimal

import pytest
import time_machine
from django.utils import timezone
from guardian.shortcuts import assign_perm, remove_perm

from approvals.errors import DecisionRefused, PermissionRefused
from approvals.models import ApprovalRequest, Grant, StandingGrant
from operations import audit, services
from operations.errors import InvalidRequest
from operations.models import Event, Operation, OutboxMessage, Tool
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner

ALWAYS = {"mode": "always"}
PAY_1 = {"payment_id": "pay_1", "amount_cents": 500}


def _tool(api, name: str = "refund", **approval) -> None:
    api.tool(name, contract("irreversible", approval={**ALWAYS, **approval}))


def _terms(tool: str = "refund", **overrides) -> services.StandingTerms:
    fields = {
        "tool": tool,
        "max_uses": 3,
        "expires_at": timezone.now() + timedelta(hours=1),
        "pins": [{"path": "/payment_id", "op": "eq", "value": "pay_1"}],
        **overrides,
    }
    return services.StandingTerms(**fields)


def _issue(user, **overrides) -> StandingGrant:
    return services.standing_grant_issue(_terms(**overrides), user=user)


def _kinds(stream: str) -> list[str]:
    return list(Event.objects.filter(stream=stream).order_by("seq").values_list("kind", flat=True))


def _clean_audit() -> None:
    assert [found.describe() for found in audit.state_verify()] == []
    assert audit.chains_verify().ok


def test_an_operation_the_grant_covers_is_ready_at_once_and_its_approval_names_it(api):
    _tool(api)
    ann = person(decide_on="refund")
    grant = _issue(ann)
    assert grant.status == "active"

    op = api.register(api.run(), "refund", PAY_1)

    assert op["status"] == "ready"
    approval = op["approval"]
    assert approval["status"] == "approved"
    assert approval["standing_grant"] == grant.id
    assert approval["decisions"] == []
    assert approval["grant"]["decided_by"] == [ann.username]
    assert approval["grant"]["intent_hash"] == op["intent_hash"]
    assert approval["reason"].startswith(f"Approved by standing grant {grant.id} (use 1 of 3).")
    given = Grant.objects.get(request_id=approval["id"])
    assert given.standing_grant_id == grant.id
    grant.refresh_from_db()
    assert (grant.uses, grant.status) == (1, "active")
    assert _kinds(op["id"]) == ["registered", "approval_requested", "granted"]
    assert _kinds(f"sgr:{grant.id}") == [
        "standing_grant_issued",
        "standing_grant_activated",
        "standing_grant_used",
    ]
    used = Event.objects.get(stream=f"sgr:{grant.id}", kind="standing_grant_used")
    assert used.data["operation"] == op["id"]
    assert used.data["intent_hash"] == op["intent_hash"]
    assert used.data["uses"] == 1
    assert api.claim(op["id"])["attempt"] == 1
    _clean_audit()


def test_a_use_claims_inline_when_the_registration_asks(api):
    _tool(api)
    _issue(person(decide_on="refund"))
    op = api.register(api.run(), "refund", PAY_1, claim={"lease_s": 30})
    assert op["status"] == "executing"
    assert op["attempt"]["attempt"] == 1


@pytest.mark.parametrize(
    ("terms", "registration"),
    [
        ({"pins": [{"path": "/payment_id", "op": "eq", "value": "pay_2"}]}, {}),
        ({"principal": "user:bob"}, {}),
        ({"pins": [{"path": "/amount_cents", "op": "lte", "value": 499}]}, {}),
        ({"pins": [{"path": "/amount_cents", "op": "gte", "value": 501}]}, {}),
        ({"pins": [{"path": "/payment_id", "op": "in", "value": ["pay_3", "pay_4"]}]}, {}),
        ({}, {"tool": "payout"}),
    ],
    ids=["pin-eq", "principal", "pin-lte", "pin-gte", "pin-in", "tool"],
)
def test_an_intent_outside_the_family_waits_for_a_person(api, terms, registration):
    _tool(api)
    _tool(api, "payout")
    grant = _issue(person(decide_on="refund"), **terms)
    op = api.register(api.run("user:alice"), registration.get("tool", "refund"), PAY_1)
    assert op["status"] == "awaiting_approval"
    assert op["approval"]["status"] == "pending"
    assert op["approval"]["standing_grant"] is None
    grant.refresh_from_db()
    assert grant.uses == 0


def test_a_grant_for_one_run_covers_only_that_run(api):
    _tool(api)
    run, other = api.run(), api.run()
    _issue(person(decide_on="refund"), run_id=run)
    assert api.register(other, "refund", PAY_1)["status"] == "awaiting_approval"
    assert api.register(run, "refund", PAY_1)["status"] == "ready"


def test_a_principal_is_matched_as_an_identity(api):
    _tool(api)
    _issue(person(decide_on="refund"), principal="USER:Alice")
    assert StandingGrant.objects.get().principal == "user:alice"
    assert api.register(api.run("user:ALICE"), "refund", PAY_1)["status"] == "ready"


def test_a_runner_that_asks_for_a_person_gets_one(api):
    _tool(api)
    _issue(person(decide_on="refund"))
    op = api.register(api.run(), "refund", PAY_1, approval={"require": True, "reason": "odd"})
    assert op["status"] == "awaiting_approval"


def test_a_quorum_of_two_covers_nothing_until_a_second_person_signs(api):
    _tool(api, approvals_required=2)
    ann, bob = person(decide_on="refund"), person(decide_on="refund")
    grant = _issue(ann)
    assert grant.status == "proposed"
    assert grant.approvals_required == 2
    assert api.register(api.run(), "refund", PAY_1)["status"] == "awaiting_approval"

    with pytest.raises(PermissionRefused, match="already signed"):
        services.standing_grant_sign(grant_id=grant.id, user=ann)
    grant = services.standing_grant_sign(grant_id=grant.id, user=bob)

    assert grant.status == "active"
    op = api.register(api.run(), "refund", PAY_1)
    assert op["status"] == "ready"
    assert sorted(op["approval"]["grant"]["decided_by"]) == sorted([ann.username, bob.username])
    assert _kinds(f"sgr:{grant.id}") == [
        "standing_grant_issued",
        "standing_grant_signed",
        "standing_grant_activated",
        "standing_grant_used",
    ]
    with pytest.raises(DecisionRefused, match="active; it takes no more signatures"):
        services.standing_grant_sign(grant_id=grant.id, user=person(decide_on="refund"))
    _clean_audit()


def test_a_grant_below_the_quorum_the_tool_needs_is_refused(api):
    _tool(api, approvals_required=2)
    with pytest.raises(InvalidRequest, match="needs 2 approvals"):
        _issue(person(decide_on="refund"), approvals_required=1)
    assert not StandingGrant.objects.exists()


def test_a_grant_issued_with_a_quorum_of_one_does_not_cover_a_tool_that_now_needs_two(api):
    _tool(api)
    _issue(person(decide_on="refund"))
    _tool(api, approvals_required=2)  # stronger: active at once
    assert api.register(api.run(), "refund", PAY_1)["status"] == "awaiting_approval"


@pytest.mark.parametrize(
    "terms",
    [
        {"max_uses": 0},
        {"expires_at": timezone.now() - timedelta(seconds=1)},
        {"expires_at": timezone.now() + timedelta(days=400)},
        {"pins": [{"path": "amount", "op": "eq", "value": 1}]},
        {"sum_path": "/amount_cents"},
        {"sum_path": "/amount_cents", "max_sum": Decimal(0)},
        {"max_sum": Decimal(10)},
        {"principal": "user:ali\u200bce"},
        {"run_id": "run_nope"},
        {"approvals_required": 21},
    ],
    ids=[
        "no-use",
        "past",
        "too-long",
        "pin",
        "sum-without-max",
        "zero-sum",
        "max-without-path",
        "hidden",
        "run",
        "quorum",
    ],
)
def test_terms_that_cannot_be_met_are_refused(api, terms):
    _tool(api)
    with pytest.raises(InvalidRequest, match="cannot be issued"):
        _issue(person(decide_on="refund"), **terms)
    assert not StandingGrant.objects.exists()
    assert not Event.objects.filter(stream__startswith="sgr:").exists()


def test_the_principal_and_the_runner_owners_never_issue_one_for_themselves(db):
    owner, other_owner = person(), person()
    api = make_runner(owner=owner)
    other = make_runner(owner=other_owner)
    _tool(api)
    tool = Tool.objects.get(pk="refund")
    services.tool_invoker_set(
        tool=tool, runner=other.runner, allow=True, actor=services.Actor.of_runner(api.runner)
    )
    carol, dave = person(username="carol"), person(username="dave")
    for user in (owner, other_owner, carol, dave):
        assign_perm("operations.decide_tool", user, tool)
    dave_run = api.run("user:dave")

    for user, terms in [
        (owner, {}),  # owns the runner that owns the tool
        (other_owner, {}),  # owns a runner allowed to invoke it
        (carol, {"principal": "user:Carol"}),  # the principal it covers
        (dave, {"run_id": dave_run}),  # the principal of the one run it covers
    ]:
        with pytest.raises(PermissionRefused, match="you own a runner that may invoke it"):
            _issue(user, **terms)
    with pytest.raises(PermissionRefused, match="permission to decide"):
        _issue(person())
    assert not StandingGrant.objects.exists()
    # Barred from signing too, once someone else issued it.
    grant = _issue(person(decide_on="refund"), approvals_required=2)
    with pytest.raises(PermissionRefused, match="you own a runner"):
        services.standing_grant_sign(grant_id=grant.id, user=other_owner)
    assert StandingGrant.objects.get().status == "proposed"


def test_a_grant_for_any_principal_does_not_cover_its_signers_own_operations(api):
    _tool(api)
    ann = person(decide_on="refund")
    grant = _issue(ann)
    assert api.register(api.run(f"user:{ann.username}"), "refund", PAY_1)["status"] == (
        "awaiting_approval"
    )
    assert api.register(api.run("user:alice"), "refund", PAY_1)["status"] == "ready"
    grant.refresh_from_db()
    assert grant.uses == 1


def test_a_signer_who_lost_the_permission_covers_nothing(api):
    _tool(api)
    ann = person(decide_on="refund")
    _issue(ann)
    remove_perm("operations.decide_tool", ann, Tool.objects.get(pk="refund"))
    assert api.register(api.run(), "refund", PAY_1)["status"] == "awaiting_approval"


def test_the_last_use_exhausts_the_grant_and_the_next_waits_for_a_person(api):
    _tool(api)
    grant = _issue(person(decide_on="refund"), max_uses=2)
    run = api.run()
    statuses = [api.register(run, "refund", PAY_1)["status"] for _ in range(3)]
    assert statuses == ["ready", "ready", "awaiting_approval"]
    grant.refresh_from_db()
    assert (grant.uses, grant.status) == (2, "exhausted")
    assert _kinds(f"sgr:{grant.id}")[-1] == "standing_grant_exhausted"
    assert Grant.objects.filter(standing_grant=grant).count() == 2
    _clean_audit()


def test_the_sum_of_one_argument_is_capped(api):
    _tool(api)
    grant = _issue(
        person(decide_on="refund"),
        pins=[],
        max_uses=10,
        sum_path="/amount_cents",
        max_sum=Decimal(1000),
    )
    run = api.run()
    statuses = [
        api.register(run, "refund", {"payment_id": "p", "amount_cents": amount})["status"]
        for amount in (400, 400, 400, 200)
    ]
    assert statuses == ["ready", "ready", "awaiting_approval", "ready"]
    grant.refresh_from_db()
    assert (grant.uses, grant.sum_used, grant.status) == (3, Decimal(1000), "exhausted")
    used = Event.objects.filter(stream=f"sgr:{grant.id}", kind="standing_grant_used")
    assert [e.data["sum_used"] for e in used.order_by("seq")] == [
        "400.000000",
        "800.000000",
        "1000.000000",
    ]
    _clean_audit()


def test_an_expired_grant_covers_nothing_and_the_sweep_marks_it_expired(api):
    _tool(api)
    grant = _issue(person(decide_on="refund"), expires_at=timezone.now() + timedelta(minutes=5))
    with time_machine.travel(timezone.now() + timedelta(minutes=6), tick=False):
        assert api.register(api.run(), "refund", PAY_1)["status"] == "awaiting_approval"
        assert services.sweep().standing_grants_expired == 1
        assert services.sweep().standing_grants_expired == 0
    grant.refresh_from_db()
    assert (grant.status, grant.uses) == ("expired", 0)
    assert _kinds(f"sgr:{grant.id}")[-1] == "standing_grant_expired"
    _clean_audit()


def test_a_proposed_grant_past_its_expiry_takes_no_signature(api):
    _tool(api, approvals_required=2)
    grant = _issue(person(decide_on="refund"), expires_at=timezone.now() + timedelta(minutes=5))
    with (
        time_machine.travel(timezone.now() + timedelta(minutes=6), tick=False),
        pytest.raises(DecisionRefused, match="expired"),
    ):
        services.standing_grant_sign(grant_id=grant.id, user=person(decide_on="refund"))
    grant.refresh_from_db()
    assert grant.status == "expired"  # committed before the refusal
    _clean_audit()


def test_revoking_refuses_the_next_claim_and_opens_a_new_request(api):
    _tool(api)
    ann = person(decide_on="refund")
    grant = _issue(ann)
    run = api.run()
    waiting = api.register(run, "refund", PAY_1)
    running = api.register(run, "refund", PAY_1, claim={"lease_s": 60})
    assert (waiting["status"], running["status"]) == ("ready", "executing")

    revoked = services.standing_grant_revoke(grant_id=grant.id, user=ann, reason="paused")

    assert revoked.status == "revoked"
    refused = api.claim(waiting["id"], expect=403)
    assert refused["code"] == "grant_invalid"
    assert "was revoked" in refused["detail"]
    body = api.operation(waiting["id"])
    assert body["status"] == "awaiting_approval"
    assert body["approval"]["status"] == "pending"
    assert body["approval"]["standing_grant"] is None
    # An attempt already executing goes on; what registers next waits for a person.
    assert api.outcome(running["id"], 1, {"kind": "succeeded"})["status"] == "succeeded"
    assert api.register(run, "refund", PAY_1)["status"] == "awaiting_approval"
    with pytest.raises(DecisionRefused, match="already revoked"):
        services.standing_grant_revoke(grant_id=grant.id, user=ann, reason="again")
    _clean_audit()


def test_revoking_an_exhausted_grant_still_stops_what_it_approved(api):
    _tool(api)
    ann = person(decide_on="refund")
    grant = _issue(ann, max_uses=1)
    op = api.register(api.run(), "refund", PAY_1)
    assert StandingGrant.objects.get(pk=grant.id).status == "exhausted"
    services.standing_grant_revoke(grant_id=grant.id, user=ann, reason="wrong account")
    assert api.claim(op["id"], expect=403)["code"] == "grant_invalid"


def test_revoking_needs_a_reason_and_the_permission_to_decide(api):
    _tool(api)
    grant = _issue(person(decide_on="refund"))
    with pytest.raises(PermissionRefused):
        services.standing_grant_revoke(grant_id=grant.id, user=person(), reason="no")
    with pytest.raises(DecisionRefused, match="Say why"):
        services.standing_grant_revoke(
            grant_id=grant.id, user=person(decide_on="refund"), reason="  "
        )
    assert StandingGrant.objects.get().status == "active"


def test_approve_this_and_the_next_like_it_is_one_step(api):
    _tool(api)
    ann = person(decide_on="refund")
    run = api.run()
    pending = api.register(run, "refund", PAY_1)
    op, grant = services.approval_approve_and_issue(
        request_id=pending["approval"]["id"], user=ann, comment="same ticket", terms=_terms()
    )
    assert op.status == "ready"
    assert ApprovalRequest.objects.get(pk=pending["approval"]["id"]).status == "approved"
    issued = Event.objects.get(stream=f"sgr:{grant.id}", kind="standing_grant_issued")
    assert issued.data["from_approval"] == pending["approval"]["id"]
    statuses = [api.register(run, "refund", PAY_1)["status"] for _ in range(4)]
    assert statuses == ["ready", "ready", "ready", "awaiting_approval"]
    _clean_audit()


def test_approve_this_and_the_next_refused_changes_nothing(db):
    owner = person()
    api = make_runner(owner=owner)
    _tool(api)
    pending = api.register(api.run(), "refund", PAY_1)
    decider = person(decide_on="refund")
    # The grant's terms are refused after the approval was recorded: both are undone.
    with pytest.raises(InvalidRequest):
        services.approval_approve_and_issue(
            request_id=pending["approval"]["id"],
            user=decider,
            comment="",
            terms=_terms(max_uses=0),
        )
    request = ApprovalRequest.objects.get(pk=pending["approval"]["id"])
    assert request.status == "pending"
    assert not request.decisions.exists()
    assert Operation.objects.get(pk=pending["id"]).status == "awaiting_approval"
    assert not StandingGrant.objects.exists()
    with pytest.raises(InvalidRequest, match="for refund"):
        services.approval_approve_and_issue(
            request_id=pending["approval"]["id"],
            user=decider,
            comment="",
            terms=_terms(tool="payout"),
        )


@pytest.fixture
def hooks(settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]

    def subscribe(api, events=("standing_grant.*",)):
        response = api.post(
            "/api/v1/webhook-endpoints",
            {"url": "http://127.0.0.1:9/hook", "events": list(events)},
        )
        assert response.status_code == 201, response.json()
        return response.json()["id"]

    return subscribe


def _messages(endpoint: str) -> list[OutboxMessage]:
    return list(OutboxMessage.objects.filter(endpoint_id=endpoint).order_by("created_at", "id"))


def test_webhooks_announce_issue_use_and_revocation_to_the_runners_that_may_invoke(
    api, other_api, hooks
):
    _tool(api)
    services.tool_invoker_set(
        tool=Tool.objects.get(pk="refund"),
        runner=other_api.runner,
        allow=True,
        actor=services.Actor.of_runner(api.runner),
    )
    stranger = make_runner()
    owner_hook, other_hook, stranger_hook = hooks(api), hooks(other_api), hooks(stranger)
    ann = person(decide_on="refund")

    grant = _issue(ann, max_uses=2)
    op = api.register(api.run(), "refund", PAY_1)
    services.standing_grant_revoke(grant_id=grant.id, user=ann, reason="paused")

    owned, other = _messages(owner_hook), _messages(other_hook)
    assert [m.event_type for m in owned] == [
        "standing_grant.issued",
        "standing_grant.used",
        "standing_grant.revoked",
    ]
    assert [m.event_type for m in other] == [m.event_type for m in owned]
    assert _messages(stranger_hook) == []
    issued = owned[0].payload["data"]["standing_grant"]
    assert issued["id"] == grant.id
    assert (issued["status"], issued["uses"], issued["uses_remaining"]) == ("active", 0, 2)
    assert issued["signed_by"] == [ann.username]
    # The operation goes with the use only to its own runner.
    used = owned[1].payload["data"]
    assert used["operation"]["id"] == op["id"]
    assert used["operation"]["approval"]["standing_grant"] == grant.id
    assert used["standing_grant"]["uses"] == 1
    assert owned[1].operation_id == op["id"]
    assert set(other[1].payload["data"]) == {"standing_grant"}
    assert other[1].operation_id is None
    revoked = owned[2].payload["data"]["standing_grant"]
    assert (revoked["status"], revoked["revoke_reason"]) == ("revoked", "paused")


def test_a_proposed_grant_sends_no_issued_webhook(api, hooks):
    _tool(api, approvals_required=2)
    endpoint = hooks(api)
    grant = _issue(person(decide_on="refund"))
    assert _messages(endpoint) == []
    services.standing_grant_sign(grant_id=grant.id, user=person(decide_on="refund"))
    assert [m.event_type for m in _messages(endpoint)] == ["standing_grant.issued"]


def test_a_covered_registration_sends_ready_and_the_decided_approval(api, hooks):
    _tool(api)
    endpoint = hooks(api, ("operation.*", "approval.decided"))
    _issue(person(decide_on="refund"))
    op = api.register(api.run(), "refund", PAY_1)
    assert [m.event_type for m in _messages(endpoint)] == ["operation.ready", "approval.decided"]
    decided = _messages(endpoint)[1].payload["data"]["approval"]
    assert (decided["id"], decided["status"]) == (op["approval"]["id"], "approved")
