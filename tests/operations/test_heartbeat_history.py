"""Heartbeats extend the lease on the attempt row; the operation's history gets one
event per HEARTBEAT_EVENT_EVERY of them, so a long call does not grow it unbounded."""

from datetime import timedelta

import time_machine
from django.utils import timezone

from operations import services
from operations.models import Attempt, Event
from tests.conftest import contract


def test_a_long_call_writes_one_heartbeat_event_per_ten(api, settings):
    settings.HEARTBEAT_EVENT_EVERY = 10
    api.tool("refund", contract("idempotent"))
    op = api.register(api.run(), "refund", claim={"lease_s": 30})
    leases = []
    for _ in range(25):
        response = api.post(f"/api/v1/operations/{op['id']}/attempts/1/heartbeat", {"lease_s": 30})
        assert response.status_code == 200, response.json()
        leases.append(response.json()["lease_until"])
    attempt = Attempt.objects.get(operation_id=op["id"])
    assert attempt.heartbeats == 25
    assert leases == sorted(leases)  # every beat extended the lease
    events = list(Event.objects.filter(stream=op["id"], kind="heartbeat").order_by("seq"))
    assert [event.data["heartbeats"] for event in events] == [1, 11, 21]
    assert api.outcome(op["id"], 1, {"kind": "succeeded"})["status"] == "succeeded"


def test_an_expired_lease_says_how_far_heartbeats_had_extended_it(api, settings):
    api.tool("refund", contract("irreversible"))
    op = api.register(api.run(), "refund", claim={"lease_s": 30})
    for _ in range(3):
        api.post(f"/api/v1/operations/{op['id']}/attempts/1/heartbeat", {"lease_s": 30})
    lease_until = Attempt.objects.get(operation_id=op["id"]).lease_until
    with time_machine.travel(timezone.now() + timedelta(seconds=31), tick=False):
        assert services.sweep().leases_expired == 1
    expired = Event.objects.get(stream=op["id"], kind="lease_expired")
    assert expired.data["heartbeats"] == 3
    assert expired.data["lease_until"] == lease_until.isoformat().replace("+00:00", "Z")
