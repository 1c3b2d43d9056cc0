"""A tool belongs to the runner that registered it first (issue: the guarded cannot
lower the guard). Another runner's token changes neither its contract nor its breaker,
and invokes it only when the owner or a person allows it."""

import pytest
from guardian.shortcuts import assign_perm

from approvals.errors import PermissionRefused
from operations import services
from operations.errors import InvalidRequest, ToolNotOwned
from operations.models import Event, Tool, ToolVersion
from tests.approvals.conftest import person
from tests.conftest import contract


def person_reloaded(user):
    """The person as a new request sees them (Django caches permissions per object)."""
    return type(user).objects.get(pk=user.pk)


BREAKER = {"failure_codes": ["upstream_5xx"], "threshold": 1, "cooldown_s": 3600}


def _tool_state(name: str) -> tuple:
    return (
        ToolVersion.objects.filter(tool_id=name).count(),
        Event.objects.filter(stream=f"tool:{name}").count(),
        Tool.objects.get(pk=name).active_version_id,
    )


def _allow(owner, other, tool: str = "t", expect: int = 200):
    response = owner.put(f"/api/v1/tools/{tool}/invokers/{other.runner.name}", None)
    assert response.status_code == expect, response.json()
    return response.json()


@pytest.mark.parametrize(
    "change",
    [
        {"approval": {"mode": "always", "approvals_required": 5}},
        {"breaker": BREAKER},
        {"effect_class": "irreversible"},
    ],
)
def test_another_runner_cannot_change_a_tool_it_does_not_own(api, other_api, change):
    api.tool("t")
    before = _tool_state("t")
    response = other_api.put("/api/v1/tools/t", {**contract(), **change})
    assert response.status_code == 403
    assert response.json()["code"] == "tool_not_owned"
    assert _tool_state("t") == before


def test_the_same_contract_again_from_another_runner_is_refused_too(api, other_api):
    api.tool("t")
    response = other_api.put("/api/v1/tools/t", contract())
    assert (response.status_code, response.json()["code"]) == (403, "tool_not_owned")


def test_the_first_registering_runner_owns_the_tool(api):
    body = api.tool("t")
    assert body["owner"] == api.runner.name
    assert Tool.objects.get(pk="t").owner_id == api.runner.pk


def test_another_runner_invokes_only_once_the_owner_allows_it(api, other_api):
    api.tool("t")
    refused = other_api.register(other_api.run(), "t", expect=403)
    assert refused["code"] == "tool_forbidden"
    assert _allow(api, other_api) == {"tool": "t", "runner": other_api.runner.name, "allowed": True}
    op = other_api.register(other_api.run(), "t")
    assert op["status"] == "ready"
    assert Event.objects.filter(stream="tool:t", kind="tool_invoker_allowed").count() == 1


def test_the_owner_takes_the_permission_away_and_the_next_claim_is_refused(api, other_api):
    api.tool("t")
    _allow(api, other_api)
    op = other_api.register(other_api.run(), "t")
    response = api.client.delete(f"/api/v1/tools/t/invokers/{other_api.runner.name}")
    assert response.status_code == 200
    assert response.json()["allowed"] is False
    refused = other_api.claim(op["id"], expect=403)
    assert refused["code"] == "tool_forbidden"


def test_only_the_owner_allows_other_runners(api, other_api):
    api.tool("t")
    third = services.runner_create(name="third", actor=services.Actor.system("test"))[0]
    response = other_api.put(f"/api/v1/tools/t/invokers/{third.name}", None)
    assert (response.status_code, response.json()["code"]) == (403, "tool_not_owned")
    assert not third.service_user.has_perm("operations.invoke_tool", Tool.objects.get(pk="t"))


def test_a_person_who_manages_runners_transfers_a_tool(api, other_api):
    api.tool("t")
    tool = Tool.objects.get(pk="t")
    with pytest.raises(PermissionRefused):
        services.tool_transfer(tool=tool, to_runner=other_api.runner, user=person())
    operator = person()
    assign_perm("operations.change_runner", operator)
    services.tool_transfer(tool=tool, to_runner=other_api.runner, user=operator)
    assert other_api.put("/api/v1/tools/t", contract("irreversible")).status_code == 200
    assert api.put("/api/v1/tools/t", contract()).status_code == 403
    event = Event.objects.get(stream="tool:t", kind="tool_transferred")
    assert event.data == {"from": api.runner.name, "to": other_api.runner.name}


def test_a_runner_no_longer_allowed_cannot_trip_the_breaker(api, other_api):
    body = contract("idempotent", breaker=BREAKER)
    api.tool("t", body)
    _allow(api, other_api)
    op = other_api.register(other_api.run(), "t")
    other_api.claim(op["id"])
    api.client.delete(f"/api/v1/tools/t/invokers/{other_api.runner.name}")
    other_api.outcome(op["id"], 1, {"kind": "failed", "code": "upstream_5xx"})
    tool = Tool.objects.get(pk="t")
    assert (tool.breaker_state, tool.breaker_failures) == ("closed", 0)
    # The owner's own failure still counts: the breaker protects the service.
    own = api.register(api.run(), "t")
    api.claim(own["id"])
    api.outcome(own["id"], 1, {"kind": "failed", "code": "upstream_5xx"})
    assert Tool.objects.get(pk="t").breaker_state == "open"


def test_a_person_transfers_and_allows_from_the_tool_page(api, other_api):
    from django.test import Client

    api.tool("t")
    operator = person()
    assign_perm("operations.change_runner", operator)
    assign_perm("operations.activate_tool", operator, Tool.objects.get(pk="t"))
    client = Client()
    client.force_login(operator)
    page = client.get("/tools/t/").content.decode()
    assert "Transfer the tool to it" in page
    client.post("/tools/t/owner", {"runner": other_api.runner.name, "action": "allow"})
    assert other_api.register(other_api.run(), "t")["status"] == "ready"
    client.post("/tools/t/owner", {"runner": other_api.runner.name, "action": "transfer"})
    assert Tool.objects.get(pk="t").owner_id == other_api.runner.pk
    # Someone who may see the tool but not manage runners is shown no form and refused.
    viewer = person()
    assign_perm("operations.activate_tool", viewer, Tool.objects.get(pk="t"))
    client.force_login(viewer)
    assert "Transfer the tool to it" not in client.get("/tools/t/").content.decode()
    client.post("/tools/t/owner", {"runner": api.runner.name, "action": "transfer"})
    assert Tool.objects.get(pk="t").owner_id == other_api.runner.pk


def test_a_runner_cannot_allow_itself_back_onto_its_own_tool(api):
    api.tool("t")
    runner = api.runner
    runner.restrict_tools = True
    runner.save(update_fields=["restrict_tools"])
    response = api.put(f"/api/v1/tools/t/invokers/{runner.name}", None)
    assert (response.status_code, response.json()["code"]) == (403, "tool_not_owned")
    assert api.register(api.run(), "t", expect=403)["code"] == "tool_forbidden"


def test_the_ownership_check_is_made_on_the_locked_row(api, other_api):
    """A transfer that committed after the caller loaded the tool wins."""
    api.tool("t")
    stale = Tool.objects.get(pk="t")
    operator = person()
    assign_perm("operations.change_runner", operator)
    services.tool_transfer(tool=stale, to_runner=other_api.runner, user=operator)
    third = services.runner_create(name="third-runner", actor=services.Actor.system("t"))[0]
    with pytest.raises(ToolNotOwned, match="belongs to another runner"):
        services.tool_invoker_set(
            tool=stale, runner=third, allow=True, actor=services.Actor.of_runner(api.runner)
        )
    assert not third.service_user.has_perm("operations.invoke_tool", Tool.objects.get(pk="t"))


def test_a_person_who_manages_runners_reaches_any_tool_page(api):
    api.tool("t")
    from django.test import Client

    operator = person()
    assign_perm("operations.change_runner", operator)
    client = Client()
    client.force_login(operator)
    assert "Transfer the tool to it" in client.get("/tools/t/").content.decode()


def test_only_a_person_with_change_tool_sets_who_decides_on_a_tool(api):
    api.tool("t", contract())
    tool = Tool.objects.get(pk="t")
    alice = person()
    staff = person(is_staff=True)
    with pytest.raises(PermissionRefused):
        services.tool_permissions_set(tool=tool, holder=alice, perms=["decide_tool"], user=staff)
    assert not alice.has_perm("operations.decide_tool", tool)
    assert not Event.objects.filter(kind="tool_permissions_changed").exists()

    assign_perm("operations.change_tool", staff)
    staff = person_reloaded(staff)
    services.tool_permissions_set(tool=tool, holder=alice, perms=["decide_tool"], user=staff)
    assert person_reloaded(alice).has_perm("operations.decide_tool", tool)
    event = Event.objects.get(kind="tool_permissions_changed")
    assert (event.stream, event.actor_user_id) == ("tool:t", staff.pk)


def test_setting_the_same_permissions_again_writes_no_event(api):
    api.tool("t", contract())
    tool = Tool.objects.get(pk="t")
    alice, admin = person(), person(is_superuser=True)
    for _ in range(2):
        services.tool_permissions_set(tool=tool, holder=alice, perms=["reconcile_tool"], user=admin)
    assert Event.objects.filter(kind="tool_permissions_changed").count() == 1


def test_invoke_and_model_permissions_are_not_set_as_a_persons_tool_permissions(api):
    api.tool("t", contract())
    tool = Tool.objects.get(pk="t")
    alice, admin = person(), person(is_superuser=True)
    for perm in ("invoke_tool", "change_tool"):
        with pytest.raises(InvalidRequest):
            services.tool_permissions_set(tool=tool, holder=alice, perms=[perm], user=admin)
    assert not person_reloaded(alice).has_perm("operations.invoke_tool", tool)
    assert not Event.objects.filter(kind="tool_permissions_changed").exists()
