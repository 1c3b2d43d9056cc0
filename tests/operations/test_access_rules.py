"""Every branch of operations.access, the one authority for "may X do Y", and the
console showing exactly what the services allow."""

import pytest
from django.contrib.auth.models import Group
from django.test import Client, override_settings
from guardian.shortcuts import assign_perm

from approvals.errors import PermissionRefused
from approvals.models import ApprovalRequest
from operations import access, services
from operations.models import Event, Tool, ToolVersion
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner


@pytest.fixture
def tool(api) -> Tool:
    api.tool("t", contract("irreversible", approval={"mode": "always"}))
    return Tool.objects.get(pk="t")


def test_a_permission_counts_on_the_tool_everywhere_or_through_a_group(tool):
    nobody, direct, everywhere, grouped = person(), person(), person(), person()
    assign_perm(access.RECONCILE, direct, tool)
    assign_perm(access.RECONCILE, everywhere)
    group = Group.objects.create(name="support")
    assign_perm(access.RECONCILE, group, tool)
    grouped.groups.add(group)
    assert [access.may_reconcile(u, tool) for u in (nobody, direct, everywhere, grouped)] == [
        False,
        True,
        True,
        True,
    ]


def test_an_inactive_person_may_do_nothing(tool):
    user = person(is_active=False)
    for perm in (access.DECIDE, access.RECONCILE, access.ACTIVATE):
        assign_perm(perm, user, tool)
    assign_perm(access.CANCEL_RUN, user)
    assign_perm(access.MANAGE_RUNNERS, user)
    assert not access.may_reconcile(user, tool)
    assert not access.may_hold_decide(user, tool)
    assert not access.may_operate_breaker(user, tool)
    assert not access.may_cancel_run(user)
    assert not access.may_manage_runners(user)
    assert access.activate_refusal(user, tool.active_version) is not None
    assert list(access.tools_for_user(user)) == []


def test_activation_is_refused_to_the_owner_of_the_registering_runner(db):
    owner = person()
    api = make_runner(owner=owner)
    api.tool("t")
    version = ToolVersion.objects.get(tool_id="t")
    stranger, colleague = person(), person()
    for user in (owner, colleague):
        assign_perm(access.ACTIVATE, user, version.tool)
    assert access.activate_refusal(stranger, version) == (
        "You may not activate versions of this tool."
    )
    assert "You own the runner" in access.activate_refusal(owner, version)
    assert access.activate_refusal(colleague, version) is None


def _pending(api) -> ApprovalRequest:
    op = api.register(api.run(principal="user:pat"), "t")
    return ApprovalRequest.objects.get(pk=op["approval"]["id"])


def test_each_reason_a_person_may_not_decide(api, tool):
    request = _pending(api)
    op = request.operation
    decider = person()
    assert access.decide_refusal(user=decider, request=request, op=op) == (
        "You do not hold the permission to decide for this tool."
    )
    assign_perm(access.DECIDE, decider, tool)
    assert access.decide_refusal(user=decider, request=request, op=op) is None
    pat = person(username="pat")
    assign_perm(access.DECIDE, pat, tool)
    assert "principal" in access.decide_refusal(user=pat, request=request, op=op)
    with override_settings(REQUIRE_TOTP_FOR_IRREVERSIBLE=True):
        refusal = access.decide_refusal(user=decider, request=request, op=op)
        assert refusal == access.SECOND_FACTOR_REFUSAL
        assert (
            access.decide_refusal(user=decider, request=request, op=op, otp_verified=True) is None
        )


def test_a_runner_invokes_its_own_tools_and_those_it_was_allowed_on(api, other_api, tool):
    assert access.runner_may_invoke(api.runner, tool)
    assert not access.runner_may_invoke(other_api.runner, tool)
    services.tool_invoker_set(
        tool=tool, runner=other_api.runner, allow=True, actor=services.Actor.of_runner(api.runner)
    )
    assert access.runner_may_invoke(other_api.runner, tool)
    api.runner.restrict_tools = True
    assert not access.runner_may_invoke(api.runner, tool)


def test_allowing_a_runner_on_a_tool_is_refused_to_an_actor_that_is_neither_runner_nor_person(
    api, other_api, tool
):
    """The owner or a person who administers tools decides; a system actor is neither,
    and is refused as such rather than failing on the person it does not have."""
    with pytest.raises(PermissionRefused):
        services.tool_invoker_set(
            tool=tool, runner=other_api.runner, allow=True, actor=services.Actor.system("cli")
        )
    assert not access.runner_may_invoke(other_api.runner, tool)
    assert not Event.objects.filter(kind="tool_invoker_allowed").exists()


def test_cancelling_a_run_is_enforced_by_the_service(api):
    run = api.run()
    from operations.models import Run

    with pytest.raises(PermissionRefused):
        services.run_cancel(run=Run.objects.get(pk=run), actor=services.Actor.of_user(person()))
    assert Run.objects.get(pk=run).status == "active"
    operator = person()
    assign_perm(access.CANCEL_RUN, operator)
    services.run_cancel(run=Run.objects.get(pk=run), actor=services.Actor.of_user(operator))
    assert Run.objects.get(pk=run).status == "cancelled"


def test_the_revoke_form_is_shown_only_to_people_who_may_revoke(api, tool):
    request = _pending(api)
    approver = person()
    assign_perm(access.DECIDE, approver, tool)
    services.approval_decide(request_id=request.id, user=approver, approve=True, comment="")
    support = person()
    assign_perm(access.RECONCILE, support, tool)
    for user, shown in ((approver, True), (support, False)):
        client = Client()
        client.force_login(user)
        html = client.get(f"/approvals/{request.id}/").content.decode()
        assert ("Revoke grant" in html) is shown
        assert access.may_revoke(user, tool) is shown


def test_the_registering_owner_stays_barred_after_the_runner_changes_hands(db):
    owner, colleague = person(), person()
    api = make_runner(owner=owner)
    api.tool("t")
    api.put("/api/v1/tools/t", contract("read_only"))  # weaker: waits for a person
    version = ToolVersion.objects.get(tool_id="t", number=2)
    assign_perm(access.ACTIVATE, owner, version.tool)
    api.runner.owner = colleague
    api.runner.save(update_fields=["owner"])
    version.refresh_from_db()
    assert "You own the runner" in access.activate_refusal(owner, version)


def test_who_is_barred_is_recorded_at_opening_and_judged_again_at_each_decision(db):
    """One rule, ``access.barred_at_open``: the request records whom it bars when it
    opens, and each decision bars them again from the operation itself, so a person the
    principal named at registration stays barred after a rename even where the
    request's own list no longer names them (a row an older release wrote, or one
    changed in SQL)."""
    owner, pat, declarer = person(), person(username="pat"), person()
    api = make_runner(owner=owner)
    api.tool("t", contract("irreversible", approval={"mode": "always"}))
    tool = Tool.objects.get(pk="t")
    op_id = api.register(api.run(principal="user:pat"), "t")["id"]
    request = ApprovalRequest.objects.get(operation_id=op_id)
    op = request.operation
    assert request.context["barred_user_ids"] == sorted([owner.pk, pat.pk])
    assert access.barred_at_open(op) == sorted([owner.pk, pat.pk])
    assert access.barred_at_open(op, also=[declarer.pk, None]) == sorted(
        [owner.pk, pat.pk, declarer.pk]
    )
    opened = Event.objects.get(stream=op_id, kind="approval_requested")
    assert opened.data["terms"]["barred_user_ids"] == request.context["barred_user_ids"]

    pat.username = "patricia"
    pat.save(update_fields=["username"])
    assign_perm(access.DECIDE, pat, tool)
    ApprovalRequest.objects.filter(pk=request.pk).update(context={"barred_user_ids": []})
    request.refresh_from_db()
    refusal = access.decide_refusal(user=pat, request=request, op=op)
    assert refusal is not None
    assert "principal" in refusal
    with pytest.raises(PermissionRefused):
        services.approval_decide(request_id=request.pk, user=pat, approve=True, comment="")
    assert ApprovalRequest.objects.get(pk=request.pk).status == "pending"
    assert not request.decisions.exists()
