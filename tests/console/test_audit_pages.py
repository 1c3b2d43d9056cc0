"""The audit log: visibility, filters, keyset pages, streamed exports, sign-ins."""

import csv
import io
import json
import re
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.http import StreamingHttpResponse
from django.test import Client
from django.utils import timezone

from console import accounts, pagination
from operations import services
from operations.machine import EventKind
from operations.models import Event

from .conftest import client_for


def _events(response) -> list[Event]:
    return list(response.context["page"].items)


def test_people_read_the_events_of_the_tools_they_may_see(world, viewer, superuser):
    seen = _events(client_for(viewer).get("/audit/"))
    assert seen
    assert {event.tool_name for event in seen} == {"refund"}
    everything = _events(client_for(superuser).get("/audit/"))
    streams = {event.stream for event in everything}
    assert world.hidden[0]["id"] in streams
    assert any(stream.startswith("runner:") for stream in streams)
    assert "tool:wipe" in streams


def test_filters_by_actor_action_tool_and_time(world, superuser):
    client = client_for(superuser)
    runner_name = world.api.runner.name
    by_actor = _events(client.get("/audit/", {"actor": runner_name}))
    assert by_actor
    assert {event.actor for event in by_actor} == {f"runner:{runner_name}"}
    assert _events(client.get("/audit/", {"actor": f"runner:{runner_name}"})) == by_actor
    system = _events(client.get("/audit/", {"actor": "system:test"}))
    assert {event.kind for event in system} >= {"runner_created"}
    assert _events(client.get("/audit/", {"actor": "test"})) == system
    assert _events(client.get("/audit/", {"actor": "user:nobody"})) == []
    outcomes = _events(client.get("/audit/", {"kind": "outcome"}))
    assert [event.operation_id for event in outcomes] == [world.hidden[0]["id"]]
    wipe = _events(client.get("/audit/", {"tool": "wipe"}))
    assert {event.tool_name for event in wipe} == {"wipe"}
    later = (timezone.now() + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M")
    assert _events(client.get("/audit/", {"since": later})) == []
    assert len(_events(client.get("/audit/", {"until": later}))) == len(
        _events(client.get("/audit/"))
    )


def test_the_action_filter_suggests_every_event_kind(superuser):
    """The suggestions are the ledger's vocabulary, people's second factors and the
    breakers included, and they still filter."""
    accounts.user_account_record(
        user=superuser, kind=EventKind.SECOND_FACTOR_FAILED, data={"during": "verify"}
    )
    client = client_for(superuser)
    response = client.get("/audit/")
    assert response.status_code == 200
    datalist = re.search(
        r'<datalist id="audit-kinds">(.*?)</datalist>', response.content.decode(), re.S
    )
    assert datalist is not None
    offered = re.findall(r'<option value="([^"]*)">', datalist.group(1))
    assert offered == [kind.value for kind in EventKind]
    failed = _events(client.get("/audit/", {"kind": "second_factor_failed"}))
    assert [(event.stream, event.kind) for event in failed] == [
        (f"user:{superuser.pk}", "second_factor_failed")
    ]
    assert Event.objects.filter(kind="second_factor_failed").count() == 1


def test_keyset_pages_of_events(world, superuser, monkeypatch):
    monkeypatch.setattr(pagination, "PAGE_SIZE", 5)
    client = client_for(superuser)
    first = client.get("/audit/").context["page"]
    second = client.get("/audit/", {"before": first.older}).context["page"]
    assert second.items[0].id < first.items[-1].id
    assert client.get("/audit/", {"before": "not-a-number"}).status_code == 200


def _body(response: StreamingHttpResponse) -> str:
    assert isinstance(response, StreamingHttpResponse)
    return b"".join(response.streaming_content).decode()


def test_csv_export_streams_the_filtered_events_oldest_first(world, viewer):
    response = client_for(viewer).get("/audit/export.csv", {"kind": "registered"})
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment;" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(_body(response))))
    assert [row["operation_id"] for row in rows] == [op["id"] for op in world.visible]
    assert {row["kind"] for row in rows} == {"registered"}
    assert json.loads(rows[0]["data"])["operation_key"] == world.visible[0]["operation_key"]
    assert rows[0]["hash"] == Event.objects.get(operation_id=rows[0]["operation_id"], seq=1).hash


def test_json_lines_export_has_one_event_per_line(world, superuser):
    response = client_for(superuser).get("/audit/export.jsonl", {"tool": "wipe"})
    assert response["Content-Type"].startswith("application/jsonl")
    records = [json.loads(line) for line in _body(response).splitlines()]
    assert records
    assert {record["tool_name"] for record in records} == {"wipe"}
    assert [r["id"] for r in records] == sorted(r["id"] for r in records)
    assert records[0]["at"].endswith("Z")


def test_exports_never_contain_events_of_hidden_tools(world, viewer):
    for fmt in ("csv", "jsonl"):
        body = _body(client_for(viewer).get(f"/audit/export.{fmt}"))
        assert world.hidden[0]["id"] not in body
        assert "wipe" not in body
    assert client_for(viewer).get("/audit/export.xml").status_code == 404


def test_csv_cells_that_look_like_formulas_are_neutralised(world, superuser):
    user = get_user_model().objects.create_user("=cmd|calc", password="pw-for-tests-1")
    accounts.user_session_record(user=user, kind="signed_in")
    body = _body(client_for(superuser).get("/audit/export.csv", {"kind": "signed_in"}))
    assert "'user:=cmd|calc" not in body  # starts with "user:", not a formula
    services.event_append(
        stream="user:x",
        kind="=HYPERLINK",
        actor=services.Actor.system("test"),
    )
    body = _body(client_for(superuser).get("/audit/export.csv", {"kind": "=HYPERLINK"}))
    assert ",'=HYPERLINK," in body


def test_sign_in_and_sign_out_are_audited(db):
    get_user_model().objects.create_user("dana", password="pw-for-tests-1")
    client = Client()
    response = client.post("/login/", {"username": "dana", "password": "pw-for-tests-1"})
    assert response.status_code == 302
    client.post("/logout/")
    events = list(Event.objects.filter(stream__startswith="user:").order_by("seq"))
    assert [(e.kind, e.actor, e.seq) for e in events] == [
        ("signed_in", "user:dana", 1),
        ("signed_out", "user:dana", 2),
    ]
    assert events[0].data == {"ip": "127.0.0.1"}
    assert events[1].prev_hash == events[0].hash
