"""HOLD_NEW_TOOLS (issue 25, item 3): the first version of a new tool, or of a new
irreversible one, and a version that makes a tool irreversible, wait for a person to
activate them, so a new tool cannot arrive with approval mode "never" and run
(docs/api.md, Versions and activation)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from guardian.shortcuts import assign_perm

from approvals.errors import PermissionRefused
from operations import services
from operations.contracts import normalize_contract
from operations.machine import EventKind
from operations.models import Event, Operation, Tool, ToolVersion
from operations.services.tools import _activation_holds
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner

REPO = Path(__file__).resolve().parents[2]
NEVER = {"mode": "never"}


def _new_tool(name: str, effect_class: str) -> str:
    return (
        f"{name} is a new {'irreversible tool' if effect_class == 'irreversible' else 'tool'} "
        f'(no version of it is active yet), and HOLD_NEW_TOOLS is "{{mode}}": a person '
        "activates it"
    )


def _made_irreversible(name: str, was: str, mode: str) -> str:
    return (
        f"this version makes {name} irreversible (it was {was}), and HOLD_NEW_TOOLS is "
        f'"{mode}": a person activates it'
    )


def _activator(tool: str):
    someone = person()
    assign_perm("operations.activate_tool", someone, Tool.objects.get(pk=tool))
    return someone


def test_each_mode_holds_the_first_versions_it_names(api, settings):
    held = {
        "none": set(),
        "irreversible": {"irreversible"},
        "all": {"idempotent", "irreversible"},
    }
    for mode, classes in held.items():
        settings.HOLD_NEW_TOOLS = mode
        for effect_class in ("idempotent", "irreversible"):
            name = f"{effect_class}_{mode}"
            body = api.tool(name, contract(effect_class, approval=NEVER))
            reasons = [_new_tool(name, effect_class).format(mode=mode)]
            if effect_class in classes:
                assert (body["active"], body["active_version"], body["weakens"]) == (
                    False,
                    None,
                    reasons,
                ), name
                assert Tool.objects.get(pk=name).active_version is None
            else:
                assert (body["active"], body["active_version"], body["weakens"]) == (True, 1, [])
            stored = ToolVersion.objects.get(tool_id=name, number=1)
            assert stored.weakens == body["weakens"]
            assert (stored.activated_at is None) == (effect_class in classes)
            event = Event.objects.get(stream=f"tool:{name}", kind=EventKind.CONTRACT_REGISTERED)
            assert (event.data["active"], event.data["weakens"], event.data["holds"]) == (
                body["active"],
                [],
                body["weakens"],
            )


@pytest.mark.parametrize("mode", ["irreversible", "all"])
def test_a_version_that_makes_a_tool_irreversible_is_held_and_later_ones_are_not(
    api, settings, mode
):
    api.tool("undo", contract("compensable", approval=NEVER))  # before the setting
    settings.HOLD_NEW_TOOLS = mode
    raised = api.tool("undo", contract("irreversible", approval={"mode": "always"}))
    assert (raised["version"], raised["active_version"], raised["active"]) == (2, 1, False)
    assert raised["weakens"] == [_made_irreversible("undo", "compensable", mode)]
    # The proof alone would have let it by: a higher class and a stronger mode.
    services.tool_version_activate(
        version=ToolVersion.objects.get(tool_id="undo", number=2), user=_activator("undo")
    )
    stricter = api.tool("undo", contract("irreversible", approval={"mode": "always"}, retry={}))
    assert (stricter["version"], stricter["active"], stricter["weakens"]) == (3, True, [])
    # Without the setting the proof alone decides, as before it existed.
    settings.HOLD_NEW_TOOLS = "none"
    api.tool("refund", contract("compensable", approval=NEVER))
    raised = api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    assert (raised["active"], raised["weakens"]) == (True, [])


def test_a_weakening_and_a_hold_are_both_named_and_told_apart_in_the_event(api, settings):
    api.tool("undo", contract("compensable", approval={"mode": "always"}))
    settings.HOLD_NEW_TOOLS = "irreversible"
    body = api.tool("undo", contract("irreversible", approval=NEVER))
    weakening = "approval mode weakened from always to never"
    hold = _made_irreversible("undo", "compensable", "irreversible")
    assert (body["active"], body["weakens"]) == (False, [weakening, hold])
    event = Event.objects.filter(
        stream="tool:undo", kind=EventKind.CONTRACT_REGISTERED, data__version=2
    ).get()
    assert (event.data["weakens"], event.data["holds"]) == ([weakening], [hold])


def test_what_a_runner_sees_of_a_held_new_tool(api, settings):
    settings.HOLD_NEW_TOOLS = "all"
    response = api.put("/api/v1/tools/refund", contract("idempotent"))
    assert response.status_code == 201
    body = response.json()
    assert (body["version"], body["active_version"], body["active"]) == (1, None, False)
    assert body["weakens"] == [_new_tool("refund", "idempotent").format(mode="all")]
    # Putting it again answers the same held version.
    again = api.put("/api/v1/tools/refund", contract("idempotent"))
    assert (again.status_code, again.json()["version"], again.json()["active"]) == (200, 1, False)

    missing = api.get("/api/v1/tools/refund")
    assert missing.status_code == 404
    assert "no active version" in missing.json()["detail"]
    assert api.get("/api/v1/tools").json()["results"] == []

    run = api.run()
    refused = api.register(run, "refund", expect=409)
    assert refused["code"] == "tool_not_active"
    assert refused["detail"] == (
        "Tool refund has no active version: waiting for a person to activate version 1."
    )
    assert (refused["tool"], refused["waiting_version"]) == ("refund", 1)
    assert not Operation.objects.exists()
    # A changed contract is the next version, held too: the tool is still new.
    assert api.tool("refund", contract("idempotent", description="v2"))["active"] is False
    assert "activate version 2." in api.register(run, "refund", expect=409)["detail"]


def test_a_person_activates_a_held_version_but_never_the_runners_owner(db, settings):
    settings.HOLD_NEW_TOOLS = "irreversible"
    owner = person(is_superuser=True)
    api = make_runner(owner=owner)
    api.tool("wipe", contract("irreversible", approval=NEVER))
    version = ToolVersion.objects.get(tool_id="wipe", number=1)
    assign_perm("operations.activate_tool", owner, Tool.objects.get(pk="wipe"))
    with pytest.raises(PermissionRefused, match="own the runner"):
        services.tool_version_activate(version=version, user=owner)
    with pytest.raises(PermissionRefused, match="may not activate"):
        services.tool_version_activate(version=version, user=person())
    assert Tool.objects.get(pk="wipe").active_version is None
    assert not Event.objects.filter(stream="tool:wipe", kind=EventKind.CONTRACT_ACTIVATED)

    activator = _activator("wipe")
    services.tool_version_activate(version=version, user=activator)
    assert Tool.objects.get(pk="wipe").active_version_id == version.pk
    version.refresh_from_db()
    assert version.activated_by == activator
    activated = Event.objects.get(stream="tool:wipe", kind=EventKind.CONTRACT_ACTIVATED)
    assert activated.data == {"version": 1, "previous_version_id": None}
    op = api.register(api.run(), "wipe", {"payment_id": "pay_1", "amount_cents": 5})
    assert (op["tool_version"], op["status"]) == (1, "ready")
    answer = api.get("/api/v1/tools/wipe").json()
    assert (answer["active"], answer["active_version"]) == (True, 1)


def test_activation_policies_add_reasons_the_setting_cannot_take_away(api, settings):
    api.tool("payout", contract("irreversible"))
    tool = Tool.objects.get(pk="payout")
    body = normalize_contract(contract("irreversible"))
    settings.HOLD_NEW_TOOLS = "irreversible"
    seen = []

    def people_policy(*, tool, active, contract):
        seen.append((tool.name, active, contract["effect_class"]))
        return ["a policy of the payments team holds every payout version"]

    reasons = _activation_holds(tool=tool, active=None, contract=body, policies=[people_policy])
    assert reasons == [
        _new_tool("payout", "irreversible").format(mode="irreversible"),
        "a policy of the payments team holds every payout version",
    ]
    assert seen == [("payout", None, "irreversible")]
    settings.HOLD_NEW_TOOLS = "none"
    assert _activation_holds(tool=tool, active=None, contract=body, policies=[people_policy]) == [
        "a policy of the payments team holds every payout version"
    ]


def _hold_setting(value: str | None) -> subprocess.CompletedProcess:
    env = {key: val for key, val in os.environ.items() if key != "HOLD_NEW_TOOLS"}
    if value is not None:
        env["HOLD_NEW_TOOLS"] = value
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "from django.conf import settings; print(settings.HOLD_NEW_TOOLS)",
        ],
        cwd=REPO,
        env={**env, "DJANGO_SETTINGS_MODULE": "console.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_hold_new_tools_is_read_from_the_environment_and_a_bad_value_is_refused():
    for value, expected in ((None, "none"), ("all", "all"), (" Irreversible ", "irreversible")):
        done = _hold_setting(value)
        assert (done.returncode, done.stdout.strip()) == (0, expected), done.stderr
    done = _hold_setting("new")
    assert done.returncode != 0
    assert "HOLD_NEW_TOOLS: 'new' is not one of none, irreversible, all" in done.stderr
