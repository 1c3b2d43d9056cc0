"""``manage.py seed_demo``: every interesting state, demo people, and idempotence."""

from io import StringIO

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command

from operations.models import Event, Operation, Run, Tool

pytestmark = pytest.mark.slow


def _seed() -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def test_seed_demo_walks_every_state_and_runs_once(db):
    first = _seed()
    assert "Demo data created" in first
    statuses = set(Operation.objects.values_list("status", flat=True))
    assert {
        "awaiting_approval",
        "ready",
        "executing",
        "succeeded",
        "outcome_unknown",
        "compensating",
        "compensated",
        "rejected",
        "failed_permanent",
        "budget_exhausted",
        "cancelled",
    } <= statuses
    assert Run.objects.filter(status="cancelled").exists()
    refund = Tool.objects.get(pk="send_refund")
    assert refund.active_version.number == 1
    assert refund.versions.get(number=2).weakens  # waits for a person to activate it
    # Two weeks of history, written through the services with their times.
    days = {event.at.date() for event in Event.objects.filter(kind="registered")}
    assert len(days) >= 10
    assert authenticate(username="approver", password="approver-demo") is not None
    assert "approver   password approver-demo" in first

    counts = (Operation.objects.count(), Event.objects.count())
    second = _seed()
    assert "Demo data exists" in second
    assert "approver   password approver-demo" in second
    assert (Operation.objects.count(), Event.objects.count()) == counts
