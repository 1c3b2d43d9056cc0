"""Tools: visibility, versions and their differences, access, and activation."""

from guardian.shortcuts import assign_perm

from operations.models import Event, Tool
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner
from tests.operations.test_policies import steward

from .conftest import client_for


def test_tools_visible_to_deciders_reconcilers_and_activators(world, viewer, superuser):
    activator = person()
    assign_perm("operations.activate_tool", activator, Tool.objects.get(pk="wipe"))
    assert [t["tool"].name for t in client_for(viewer).get("/tools/").context["rows"]] == ["refund"]
    rows = client_for(activator).get("/tools/").context["rows"]
    assert [(row["tool"].name, row["perms"]) for row in rows] == [("wipe", ["activate"])]
    assert len(client_for(superuser).get("/tools/").context["rows"]) == 2
    assert client_for(viewer).get("/tools/wipe/").status_code == 404
    assert client_for(person()).get("/tools/").context["rows"] == []


def _weakened(api):
    strict = contract("irreversible", approval={"mode": "always"})
    api.tool("payout", strict)
    api.tool("payout", {**strict, "approval": {"mode": "never"}})
    return Tool.objects.get(pk="payout")


def test_tool_page_shows_versions_weakening_and_a_readable_diff(api, viewer):
    tool = _weakened(api)
    assign_perm("operations.decide_tool", viewer, tool)
    response = client_for(viewer).get("/tools/payout/")
    html = response.content.decode()
    assert "approval mode weakened from always to never" in html
    comparison = response.context["comparison"]
    assert (comparison["from"].number, comparison["to"].number) == (1, 2)
    assert [row["path"] for row in comparison["changes"]] == ["/approval/mode"]
    assert "Activate v2" not in html  # deciding is not activating
    older = client_for(viewer).get("/tools/payout/", {"from": 2, "to": 1}).context["comparison"]
    assert (older["from"].number, older["to"].number) == (2, 1)


def test_tool_page_says_who_may_act_and_which_runners_may_invoke(api, world, viewer):
    from django.contrib.auth.models import Group

    group = Group.objects.create(name="Support")
    assign_perm("operations.reconcile_tool", group, Tool.objects.get(pk="refund"))
    restricted = make_runner("restricted-bot")
    restricted.runner.restrict_tools = True
    restricted.runner.save()
    response = client_for(viewer).get("/tools/refund/")
    access = {row["label"]: row for row in response.context["access"]}
    assert access["Decide"]["users"] == ["viewer"]
    assert access["Reconcile"]["groups"] == ["Support"]
    runners = response.context["runners"]
    assert api.runner in runners["allowed"]
    assert restricted.runner in runners["refused"]
    assign_perm(
        "operations.invoke_tool", restricted.runner.service_user, Tool.objects.get(pk="refund")
    )
    runners = client_for(viewer).get("/tools/refund/").context["runners"]
    assert restricted.runner in runners["allowed"]


def test_activating_a_weakening_version(api):
    tool = _weakened(api)
    operator = person()
    assign_perm("operations.activate_tool", operator, tool)
    client = client_for(operator)
    assert "Activate v2" in client.get("/tools/payout/").content.decode()
    response = client.post("/tools/payout/versions/2/activate", follow=True)
    assert "payout v2 is now the active contract." in response.content.decode()
    tool.refresh_from_db()
    assert tool.active_version.number == 2
    event = Event.objects.filter(stream="tool:payout", kind="contract_activated").get()
    assert event.actor == f"user:{operator.username}"


def test_activation_refusal_is_shown_as_a_message(db):
    owner = person()
    api = make_runner(owner=owner)
    tool = _weakened(api)
    assign_perm("operations.activate_tool", owner, tool)
    response = client_for(owner).post("/tools/payout/versions/2/activate", follow=True)
    assert "You own the runner that registered this version" in response.content.decode()
    tool.refresh_from_db()
    assert tool.active_version.number == 1
    deciding = person()
    assign_perm("operations.decide_tool", deciding, tool)
    refused = client_for(deciding).post("/tools/payout/versions/2/activate", follow=True)
    assert "You may not activate versions of this tool." in refused.content.decode()
    missing = client_for(owner).post("/tools/payout/versions/9/activate", follow=True)
    assert "payout has no version 9." in missing.content.decode()


def test_tool_page_says_what_each_rule_does_when_its_argument_is_absent(api, viewer):
    schema = {
        "type": "object",
        "required": ["payment_id"],
        "properties": {"payment_id": {"type": "string"}, "amount_cents": {"type": "integer"}},
    }
    rules = [
        {"path": "/amount_cents", "op": "gt", "value": 50000},
        {"path": "/payment_id", "op": "eq", "value": "vip", "when_missing": "skip"},
    ]
    api.tool(
        "payout",
        contract("irreversible", input_schema=schema, approval={"mode": "rules", "rules": rules}),
    )
    assign_perm("operations.decide_tool", viewer, Tool.objects.get(pk="payout"))
    html = client_for(viewer).get("/tools/payout/").content.decode()
    assert "a person decides when /amount_cents is absent" in html
    assert "passes an operation without /payment_id" in html


def test_a_held_new_tool_is_activated_on_its_page_by_a_person_not_the_owner(db, settings):
    settings.HOLD_NEW_TOOLS = "all"
    owner = person()
    api = make_runner(owner=owner)
    api.tool("payout", contract("idempotent"))
    tool = Tool.objects.get(pk="payout")
    operator = person()
    for someone in (owner, operator):
        assign_perm("operations.activate_tool", someone, tool)
    html = client_for(operator).get("/tools/payout/").content.decode()
    assert "payout is a new tool (no version of it is active yet)" in html
    assert "Activate v1" in html
    assert "Activate v1" not in client_for(owner).get("/tools/payout/").content.decode()
    refused = client_for(owner).post("/tools/payout/versions/1/activate", follow=True)
    assert "You own the runner that registered this version" in refused.content.decode()
    tool.refresh_from_db()
    assert tool.active_version is None
    response = client_for(operator).post("/tools/payout/versions/1/activate", follow=True)
    assert "payout v1 is now the active contract." in response.content.decode()
    tool.refresh_from_db()
    assert tool.active_version.number == 1
    assert api.register(api.run(), "payout")["status"] == "ready"


def test_a_version_waiting_for_activation_links_its_simulation(api):
    """Simulation before activating (docs/policies.md#simulation): the held v2 asks
    nobody where v1 asked for every operation."""
    strict = contract("irreversible", approval={"mode": "always"})
    api.tool("payout", strict)
    run = api.run()
    for amount in (5, 50):
        api.register(run, "payout", {"payment_id": "p", "amount_cents": amount})
    api.tool("payout", {**strict, "approval": {"mode": "never"}})
    tool = Tool.objects.get(pk="payout")
    activator, decider, steward_deciding = person(), person(), steward()
    assign_perm("operations.activate_tool", activator, tool)
    assign_perm("operations.decide_tool", decider, tool)
    assign_perm("operations.decide_tool", steward_deciding, tool)
    link = '<a href="/tools/payout/versions/2/simulate">Simulate this version</a>'

    for allowed in (activator, steward_deciding):
        assert link in client_for(allowed).get("/tools/payout/").content.decode()
        response = client_for(allowed).get("/tools/payout/versions/2/simulate?days=2")
        assert response.status_code == 200
        body = response.content.decode()
        assert "2 operations replayed." in body
        assert '<th scope="row">no longer asking</th><td class="num">2</td>' in body
    # The active version has no such link, and a decider neither sees it nor opens it.
    page = client_for(activator).get("/tools/payout/").content.decode()
    assert "/versions/1/simulate" not in page
    assert link not in client_for(decider).get("/tools/payout/").content.decode()
    assert client_for(decider).get("/tools/payout/versions/2/simulate").status_code == 403
    assert client_for(person()).get("/tools/payout/versions/2/simulate").status_code == 404
    # Nothing was activated.
    tool.refresh_from_db()
    assert tool.active_version.number == 1
