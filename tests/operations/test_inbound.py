"""Inbound provider events: signed evidence that resolves unknown operations."""

import argparse
import io
import json
import re
import sys
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient
from standardwebhooks.webhooks import Webhook

from operations import signing
from operations.crypto import decrypt
from operations.management.commands import tool as tool_command
from operations.models import Event, InboundEvent, Operation, Tool
from tests.conftest import contract

INBOUND = {
    "idempotency_key": "/data/metadata/idempotency_key",
    "downstream_id": "/data/id",
    "type": "/type",
    "succeeded": ["refund.succeeded"],
    "failed": ["refund.failed"],
}


@pytest.fixture
def provider(api, capsys):
    api.tool("refund", contract("irreversible", approval={"mode": "never"}, inbound=INBOUND))
    call_command("tool", "inbound-secret", "refund")
    secret = capsys.readouterr().out.strip().splitlines()[-1]
    assert secret.startswith("whsec_")
    assert secret not in str(list(Event.objects.values_list("data", flat=True)))
    return Webhook(secret)


def _inbound_secret_parser() -> argparse.ArgumentParser:
    parser = tool_command.Command().create_parser("manage.py", "tool")
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices["inbound-secret"]


def test_the_tool_command_documents_only_options_it_has():
    parser = _inbound_secret_parser()
    has = {option for action in parser._actions for option in action.option_strings}
    helps = [action.help or "" for action in parser._actions]
    text = " ".join([tool_command.__doc__ or "", tool_command.Command.help, *helps])
    named = set(re.findall(r"--[a-z][a-z-]*", text))
    assert "--stdin" in named
    assert named <= has, f"documented but not accepted: {sorted(named - has)}"


def test_the_usage_in_the_tool_command_docstring_runs(api, capsys, monkeypatch):
    api.tool("refund", contract("irreversible", approval={"mode": "never"}, inbound=INBOUND))
    [usage] = re.findall(r"``python manage\.py (tool [^`]+)``", tool_command.__doc__ or "")
    required = re.sub(r"\s*\[[^]]*\]", "", usage).split()
    optional = re.findall(r"\[([^]]*)\]", usage)
    assert optional == ["--stdin"]
    call_command(*[word.replace("NAME", "refund") for word in required])
    generated = capsys.readouterr().out.strip().splitlines()[-1]
    assert decrypt(Tool.objects.get(pk="refund").inbound_secret_encrypted) == generated
    own = signing.new_secret()
    monkeypatch.setattr(sys, "stdin", io.StringIO(own + "\n"))
    call_command(*[word.replace("NAME", "refund") for word in required], *optional)
    assert "the secret you gave" in capsys.readouterr().out
    assert decrypt(Tool.objects.get(pk="refund").inbound_secret_encrypted) == own


def _send(signer, payload, *, msg_id="evt_1", at=None, body=None, tool="refund"):
    body = body if body is not None else json.dumps(payload).encode()
    at = at or timezone.now()
    signature = signer.sign(msg_id, at, body.decode())
    return APIClient().post(
        f"/api/v1/inbound/{tool}",
        body,
        content_type="application/json",
        HTTP_WEBHOOK_ID=msg_id,
        HTTP_WEBHOOK_TIMESTAMP=str(int(at.timestamp())),
        HTTP_WEBHOOK_SIGNATURE=signature,
    )


def _unknown(api):
    op = api.register(api.run(), "refund")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    return op


def _event(op, kind="refund.succeeded", ref="re_77"):
    return {
        "type": kind,
        "data": {"id": ref, "metadata": {"idempotency_key": op["idempotency_key"]}},
    }


def test_a_signed_success_event_resolves_an_unknown_operation(api, provider):
    op = _unknown(api)
    response = _send(provider, _event(op))
    assert response.status_code == 200
    assert response.json()["status"] == "applied"
    stored = Operation.objects.get(pk=op["id"])
    assert (stored.status, stored.downstream_id) == ("succeeded", "re_77")
    event = Event.objects.get(stream=op["id"], kind="reconciled")
    assert (event.actor, event.data["source"]) == ("system:inbound", "inbound")


def test_a_success_event_for_an_executing_operation_makes_the_attempt_stale(api, provider):
    op = api.register(api.run(), "refund")
    api.claim(op["id"])
    _send(provider, _event(op))
    assert Operation.objects.get(pk=op["id"]).status == "succeeded"
    assert api.outcome(op["id"], 1, {"kind": "succeeded"}, expect=409)["code"] == "stale_attempt"


def test_a_definitive_failure_takes_the_not_found_path(api, provider):
    op = _unknown(api)
    _send(provider, _event(op, kind="refund.failed"))
    # Irreversible: not found means a new approval before the next attempt.
    assert Operation.objects.get(pk=op["id"]).status == "awaiting_approval"


def test_matching_by_downstream_reference(api, provider):
    op = api.register(api.run(), "refund")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "succeeded", "downstream_id": "re_5"})
    response = _send(provider, {"type": "refund.updated", "data": {"id": "re_5"}})
    assert response.json() == {
        "id": response.json()["id"],
        "event_id": "evt_1",
        "status": "matched",
        "operation": op["id"],
        "duplicate": False,
    }
    assert Event.objects.filter(stream=op["id"], kind="inbound_evidence").count() == 1


def test_a_duplicate_delivery_answers_200_and_changes_nothing(api, provider):
    op = _unknown(api)
    first = _send(provider, _event(op))
    events = Event.objects.count()
    again = _send(provider, _event(op))
    assert again.status_code == 200
    assert again.json()["duplicate"] is True
    assert again.json()["id"] == first.json()["id"]
    assert Event.objects.count() == events
    assert InboundEvent.objects.count() == 1


def test_a_tampered_event_is_refused_and_nothing_is_recorded(api, provider):
    op = _unknown(api)
    body = json.dumps(_event(op)).encode()
    at = timezone.now()
    signature = provider.sign("evt_9", at, body.decode())
    response = APIClient().post(
        "/api/v1/inbound/refund",
        body.replace(b"re_77", b"re_78"),
        content_type="application/json",
        HTTP_WEBHOOK_ID="evt_9",
        HTTP_WEBHOOK_TIMESTAMP=str(int(at.timestamp())),
        HTTP_WEBHOOK_SIGNATURE=signature,
    )
    assert response.status_code == 401
    assert response.json()["code"] == "invalid_signature"
    assert not InboundEvent.objects.exists()
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"


@pytest.mark.parametrize("skew", [timedelta(minutes=-6), timedelta(minutes=6)])
def test_stale_or_future_timestamps_are_refused(api, provider, skew):
    op = _unknown(api)
    response = _send(provider, _event(op), at=timezone.now() + skew)
    assert response.status_code == 400
    assert response.json()["code"] == "stale_event"
    assert not InboundEvent.objects.exists()


def test_a_replay_of_an_old_event_is_refused_even_with_a_new_id(api, provider):
    op = _unknown(api)
    old = timezone.now() - timedelta(minutes=10)
    assert _send(provider, _event(op), msg_id="evt_new", at=old).status_code == 400


def test_an_unmatched_event_is_kept(api, provider):
    response = _send(provider, {"type": "refund.succeeded", "data": {"id": "re_unknown"}})
    assert response.json()["status"] == "unmatched"
    kept = InboundEvent.objects.get()
    assert kept.status == "unmatched"
    assert kept.payload["data"]["id"] == "re_unknown"


def test_tools_without_inbound_configuration_answer_404(api, provider):
    api.tool("plain", contract("idempotent"))
    assert _send(provider, {"type": "x"}, tool="plain").status_code == 404
    assert _send(provider, {"type": "x"}, tool="nope").status_code == 404


def test_inbound_mapping_changes_are_weakenings(api, provider):
    changed = dict(INBOUND, succeeded=["refund.created"])
    body = api.put(
        "/api/v1/tools/refund",
        contract("irreversible", approval={"mode": "never"}, inbound=changed),
    ).json()
    assert body["active"] is False
    assert "another inbound event mapping" in body["weakens"]
    assert Tool.objects.get(pk="refund").active_version.number == 1


def test_recorded_but_unapplied_events_are_applied_by_the_sweep(api, provider, monkeypatch):
    from operations import services
    from operations.services import inbound

    op = _unknown(api)

    def broken(**kwargs):
        raise RuntimeError("database hiccup")

    monkeypatch.setattr(inbound, "inbound_apply", broken)
    assert _send(provider, _event(op)).status_code == 200
    assert InboundEvent.objects.get().status == "received"
    monkeypatch.undo()
    InboundEvent.objects.update(received_at=timezone.now() - timedelta(seconds=11))
    assert services.inbound_apply_pending() == 1
    assert Operation.objects.get(pk=op["id"]).status == "succeeded"


def test_unmatched_events_are_shown_in_the_console(api, provider):
    from django.test import Client
    from guardian.shortcuts import assign_perm

    from tests.approvals.conftest import person

    _send(provider, {"type": "refund.succeeded", "data": {"id": "re_orphan"}}, msg_id="evt_o")
    support = person()
    assign_perm("operations.reconcile_tool", support, Tool.objects.get(pk="refund"))
    client = Client()
    client.force_login(support)
    html = client.get("/inbound/", {"status": "unmatched"}).content.decode()
    assert "evt_o" in html
    assert "re_orphan" in html
    outsider = Client()
    outsider.force_login(person())
    assert "evt_o" not in outsider.get("/inbound/").content.decode()


@pytest.mark.parametrize("stamp", ["\u00b2", "\u0661\u0662", "12\u00b3"])
def test_a_timestamp_of_non_ascii_digits_is_refused_as_a_bad_signature(api, provider, stamp):
    # str.isdigit() accepts superscripts and other scripts' digits that int() refuses:
    # the header must be refused like any other malformed timestamp, never a 500.
    op = _unknown(api)
    body = json.dumps(_event(op)).encode()
    response = APIClient().post(
        "/api/v1/inbound/refund",
        body,
        content_type="application/json",
        HTTP_WEBHOOK_ID="evt_digits",
        HTTP_WEBHOOK_TIMESTAMP=stamp,
        HTTP_WEBHOOK_SIGNATURE=provider.sign("evt_digits", timezone.now(), body.decode()),
    )
    assert response.status_code == 401
    assert response.json()["code"] == "invalid_signature"
    assert not InboundEvent.objects.exists()
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"
