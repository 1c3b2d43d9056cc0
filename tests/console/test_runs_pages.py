"""Runs: who sees which run, budgets as text and bars, and cancel."""

from django.contrib.auth.models import Permission

from operations.models import Event, Operation, Run
from tests.approvals.conftest import person

from .conftest import client_for


def test_runs_visible_are_those_with_an_operation_the_person_may_see(world, viewer, superuser):
    html = client_for(viewer).get("/runs/").content.decode()
    assert world.visible_run in html
    assert world.hidden_run not in html
    everything = client_for(superuser).get("/runs/").content.decode()
    assert world.visible_run in everything
    assert world.hidden_run in everything
    assert client_for(viewer).get(f"/runs/{world.hidden_run}/").status_code == 404
    assert client_for(person()).get(f"/runs/{world.visible_run}/").status_code == 404


def test_run_page_shows_budgets_as_text_and_svg_bars(api, world, viewer):
    run = api.run("user:carol", max_tool_calls=4, max_spend=1.0, max_turns=10, deadline_s=3600)
    op = api.register(run, "refund", turn=3)
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "succeeded", "cost": 0.9})
    response = client_for(viewer).get(f"/runs/{run}/")
    html = response.content.decode()
    bars = {bar.label: bar for bar in response.context["budgets"]}
    assert bars["Tool calls"].description == "Tool calls: 1 of 4 (25%)"
    assert bars["Spend"].tone == "warn"  # 90 % spent
    assert bars["Turns"].used_text == "3"
    assert bars["Time"].limit_text == "1 h"
    assert '<svg class="meter"' in html
    assert 'width="25.0"' in html
    assert "style=" not in html  # the console runs under a CSP without unsafe-inline
    assert op["id"] in html


def test_a_run_without_limits_says_so(world, viewer):
    html = client_for(viewer).get(f"/runs/{world.visible_run}/").content.decode()
    assert "no limit" in html


def test_run_page_lists_only_visible_operations(api, world, viewer):
    api.register(world.visible_run, "wipe", operation_key="hidden-in-visible-run")
    response = client_for(viewer).get(f"/runs/{world.visible_run}/")
    ids = [op.id for op in response.context["page"].items]
    assert ids == [op["id"] for op in reversed(world.visible)]


def test_cancel_needs_the_change_run_permission(world, viewer):
    client = client_for(viewer)
    page = client.get(f"/runs/{world.visible_run}/").content.decode()
    assert "Cancel run" not in page
    response = client.post(f"/runs/{world.visible_run}/cancel")
    assert response.status_code == 403
    assert "You may not cancel runs." in response.content.decode()
    assert Run.objects.get(pk=world.visible_run).status == "active"


def test_cancel_ends_the_run_and_its_waiting_operations(world, viewer):
    viewer.user_permissions.add(
        Permission.objects.get(content_type__app_label="operations", codename="change_run")
    )
    client = client_for(viewer)
    assert "Cancel run" in client.get(f"/runs/{world.visible_run}/").content.decode()
    response = client.post(f"/runs/{world.visible_run}/cancel", follow=True)
    assert response.redirect_chain[-1][0] == f"/runs/{world.visible_run}/"
    assert "cancelled" in response.content.decode()
    assert Run.objects.get(pk=world.visible_run).status == "cancelled"
    assert set(
        Operation.objects.filter(run_id=world.visible_run).values_list("status", flat=True)
    ) == {"cancelled"}
    event = Event.objects.get(stream=world.visible_run, kind="run_cancelled")
    assert event.actor == "user:viewer"
    again = client.post(f"/runs/{world.visible_run}/cancel", follow=True)
    assert "already cancelled" in again.content.decode()


def test_cancel_of_an_invisible_run_is_not_found(world, viewer):
    viewer.user_permissions.add(
        Permission.objects.get(content_type__app_label="operations", codename="change_run")
    )
    assert client_for(viewer).post(f"/runs/{world.hidden_run}/cancel").status_code == 404
    assert Run.objects.get(pk=world.hidden_run).status == "active"
