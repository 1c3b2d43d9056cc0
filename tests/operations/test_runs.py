"""Runs: budgets refuse registrations without writing anything; cancellation."""

from datetime import timedelta

import time_machine
from django.utils import timezone

from operations.models import Event, Operation, Run
from operations.services import sweep


def test_run_body(api):
    response = api.post(
        "/api/v1/runs",
        {
            "external_id": "conv-1",
            "principal": "user:alice",
            "budgets": {"max_tool_calls": 5, "max_spend": 10.5},
        },
    )
    assert response.status_code == 201
    body = response.json()
    assert body["id"].startswith("run_")
    assert body["status"] == "active"
    assert body["budgets"] == {
        "max_tool_calls": 5,
        "max_turns": None,
        "deadline_s": None,
        "max_spend": 10.5,
    }
    assert body["usage"]["tool_calls"] == 0


def test_tool_call_budget_refuses_and_writes_nothing(api):
    api.tool("t")
    run = api.run(max_tool_calls=1)
    api.register(run, "t")
    before = (Operation.objects.count(), Event.objects.count())
    refusal = api.register(run, "t", expect=409)
    assert refusal["code"] == "budget_exhausted"
    assert (Operation.objects.count(), Event.objects.count()) == before
    assert Run.objects.get(pk=run).tool_calls == 1


def test_spend_budget_refuses_after_costs_reach_it(api):
    api.tool("t")
    run = api.run(max_spend=1)
    op = api.register(run, "t")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "succeeded", "cost": 1.0})
    assert api.register(run, "t", expect=409)["code"] == "budget_exhausted"


def test_turn_budget_refuses_a_registration_past_it(api):
    api.tool("t")
    run = api.run(max_turns=2)
    api.register(run, "t", turn=2)
    before = (Operation.objects.count(), Event.objects.count())
    refusal = api.register(run, "t", turn=3, expect=409)
    assert (refusal["code"], refusal["budget"]) == ("budget_exhausted", "max_turns")
    assert (Operation.objects.count(), Event.objects.count()) == before
    stored = Run.objects.get(pk=run)
    assert (stored.turns, stored.tool_calls) == (2, 1)
    assert api.get(f"/api/v1/runs/{run}").json()["usage"]["turns"] == 2


def test_run_deadline_refuses_registrations_and_the_sweep_expires_the_run(api):
    api.tool("t")
    run = api.run(deadline_s=60)
    with time_machine.travel(timezone.now() + timedelta(seconds=61), tick=False):
        assert api.register(run, "t", expect=409)["code"] == "budget_exhausted"
        assert sweep().runs_expired == 1
        assert api.register(run, "t", expect=409)["code"] == "run_not_active"
    assert Run.objects.get(pk=run).status == "expired"


def test_cancel_cancels_waiting_operations_only(api):
    api.tool("t")
    run = api.run()
    waiting = api.register(run, "t")
    running = api.register(run, "t")
    api.claim(running["id"])
    body = api.post(f"/api/v1/runs/{run}/cancel").json()
    assert body["status"] == "cancelled"
    assert Operation.objects.get(pk=waiting["id"]).status == "cancelled"
    assert Operation.objects.get(pk=running["id"]).status == "executing"
    assert api.register(run, "t", expect=409)["code"] == "run_not_active"
    # The executing attempt is still classified by its outcome.
    assert api.outcome(running["id"], 1, {"kind": "succeeded"})["status"] == "succeeded"
