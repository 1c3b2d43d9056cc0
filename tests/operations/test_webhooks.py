"""Webhooks: endpoints, the transactional outbox, Standard Webhooks signatures, retries."""

import ast
import json
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.utils import timezone
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from operations import services
from operations.dispatch import webhooks
from operations.machine import Status
from operations.models import DeliveryAttempt, OutboxMessage, WebhookEndpoint
from tests.conftest import contract
from tests.support.receiver import Receiver

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def receiver(settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    server = Receiver()
    yield server
    server.close()


def _endpoint(api, url, events=("operation.*", "approval.decided")):
    response = api.post("/api/v1/webhook-endpoints", {"url": url, "events": list(events)})
    assert response.status_code == 201, response.json()
    return response.json()


def test_registration_shows_the_secret_once(api, receiver):
    body = _endpoint(api, receiver.url)
    assert body["secret"].startswith("whsec_")
    stored = WebhookEndpoint.objects.get(pk=body["id"])
    assert body["secret"] not in stored.secret_encrypted
    listed = api.get("/api/v1/webhook-endpoints").json()
    assert [e["id"] for e in listed] == [body["id"]]
    assert "secret" not in listed[0]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",
        "http://localhost/hook",
        "http://10.0.0.5/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://192.168.1.1/hook",
    ],
)
def test_internal_targets_are_refused_unless_listed(api, url):
    response = api.post("/api/v1/webhook-endpoints", {"url": url, "events": ["operation.*"]})
    assert response.status_code == 422
    assert response.json()["code"] == "url_not_allowed"
    assert not WebhookEndpoint.objects.exists()


def test_unknown_event_patterns_are_refused(api, receiver):
    response = api.post("/api/v1/webhook-endpoints", {"url": receiver.url, "events": ["refund.*"]})
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "/events"
    assert "refund.*" in response.json()["errors"][0]["message"]


def _sent_event_types() -> set[str]:
    """What the server gives the outbox: ``operation.<status>`` for every status, and
    each literal ``event_type="..."`` passed in operations and approvals."""
    sent = {f"operation.{status.value}" for status in Status}
    for package in ("operations", "approvals"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.keyword)
                    and node.arg == "event_type"
                    and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, str)
                ):
                    sent.add(node.value.value)
    return sent


def test_every_event_type_sent_can_be_subscribed_to_by_name(api, receiver):
    sent = _sent_event_types()
    assert {"approval.decided", "approval.escalated", "operation.superseded"} <= sent
    for event_type in sorted(sent):
        response = api.post(
            "/api/v1/webhook-endpoints", {"url": receiver.url, "events": [event_type]}
        )
        assert response.status_code == 201, (event_type, response.json())


def test_outbox_rows_are_written_with_the_transition(api, receiver):
    _endpoint(api, receiver.url)
    api.tool("t")
    op = api.register(api.run(), "t")
    api.claim(op["id"])
    types = list(
        OutboxMessage.objects.filter(operation_id=op["id"])
        .order_by("created_at", "id")
        .values_list("event_type", flat=True)
    )
    assert types == ["operation.ready", "operation.executing"]
    message = OutboxMessage.objects.filter(operation_id=op["id"]).last()
    assert message.payload["type"] == "operation.executing"
    assert message.payload["data"]["operation"]["id"] == op["id"]
    assert message.payload["data"]["operation"]["status"] == "executing"


def test_a_rolled_back_change_leaves_no_message(api, receiver, monkeypatch):
    _endpoint(api, receiver.url)
    api.tool("t")
    op = api.register(api.run(), "t")
    before = OutboxMessage.objects.count()

    class Boom(Exception):
        pass

    # The claim's transaction is durable (never nested in a caller's), so the failure
    # is raised inside it: right after the claim wrote its outbox message.
    enqueue = services.core.outbox_enqueue

    def enqueue_then_fail(**kwargs):
        enqueue(**kwargs)
        assert OutboxMessage.objects.count() == before + 1
        raise Boom

    monkeypatch.setattr(services.core, "outbox_enqueue", enqueue_then_fail)
    with pytest.raises(Boom):
        services.attempt_claim(operation=op_obj(op), runner=api.runner, lease_s=30)
    assert OutboxMessage.objects.count() == before


def op_obj(body):
    from operations.models import Operation

    return Operation.objects.get(pk=body["id"])


def test_delivery_is_signed_per_standard_webhooks(api, receiver):
    secret = _endpoint(api, receiver.url, events=["operation.succeeded"])["secret"]
    api.tool("t")
    op = api.register(api.run(), "t")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "succeeded", "downstream_id": "re_1"})
    report = webhooks.deliver_due()
    assert (report.sent, report.delivered) == (1, 1)
    [request] = receiver.requests
    payload = Webhook(secret).verify(request.body, request.headers)
    assert payload["type"] == "operation.succeeded"
    assert payload["data"]["operation"]["downstream_id"] == "re_1"
    message = OutboxMessage.objects.get()
    assert request.headers["webhook-id"] == message.id
    assert message.status == "delivered"
    assert DeliveryAttempt.objects.get(message=message).status_code == 204
    tampered = request.body.replace(b"re_1", b"re_2")
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(tampered, request.headers)


def test_rotation_sends_both_signatures_during_the_overlap(api, receiver):
    created = _endpoint(api, receiver.url, events=["operation.ready"])
    old = created["secret"]
    rotated = api.post(f"/api/v1/webhook-endpoints/{created['id']}/rotate-secret").json()
    new = rotated["secret"]
    assert new != old
    api.tool("t")
    api.register(api.run(), "t")
    webhooks.deliver_due()
    [request] = receiver.requests
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(request.body, request.headers)
    Webhook(new).verify(request.body, request.headers)
    with time_machine.travel(timezone.now() + timedelta(hours=25), tick=False):
        api.register(api.run(), "t")
        webhooks.deliver_due()
        later = receiver.requests[-1]
        assert len(later.headers["webhook-signature"].split(" ")) == 1
        Webhook(new).verify(later.body, later.headers)
        with pytest.raises(WebhookVerificationError):
            Webhook(old).verify(later.body, later.headers)


def test_failures_retry_on_the_schedule_and_honour_retry_after(api, receiver):
    _endpoint(api, receiver.url, events=["operation.ready"])
    api.tool("t")
    api.register(api.run(), "t")
    receiver.status = 503
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        webhooks.deliver_due()
    message = OutboxMessage.objects.get()
    assert message.status == "pending"
    assert message.next_attempt_at == start + timedelta(seconds=5)
    receiver.headers = {"Retry-After": "600"}
    with time_machine.travel(start + timedelta(seconds=6), tick=False):
        assert webhooks.deliver_due().sent == 1
    message.refresh_from_db()
    # The schedule says 5 min; the receiver asked for 10.
    assert message.next_attempt_at == start + timedelta(seconds=6) + timedelta(minutes=10)
    receiver.status, receiver.headers = 200, {}
    with time_machine.travel(message.next_attempt_at, tick=False):
        webhooks.deliver_due()
    message.refresh_from_db()
    assert message.status == "delivered"
    assert list(message.delivery_attempts.values_list("status_code", flat=True)) == [503, 503, 200]


def test_gone_disables_the_endpoint(api, receiver):
    created = _endpoint(api, receiver.url, events=["operation.ready"])
    api.tool("t")
    api.register(api.run(), "t")
    api.register(api.run(), "t")
    receiver.status = 410
    webhooks.deliver_due(limit=1)
    endpoint = WebhookEndpoint.objects.get(pk=created["id"])
    assert not endpoint.is_active
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"disabled"}
    api.register(api.run(), "t")
    assert OutboxMessage.objects.count() == 2  # nothing new for a disabled endpoint


def test_every_message_gives_up_after_the_whole_schedule(api, receiver):
    _endpoint(api, receiver.url, events=["operation.ready"])
    api.tool("t")
    api.register(api.run(), "t")
    receiver.status = 500
    now = timezone.now()
    for _ in range(len(services.deliveries.RETRY_SCHEDULE) + 1):
        message = OutboxMessage.objects.get()
        with time_machine.travel(max(now, message.next_attempt_at), tick=False):
            webhooks.deliver_due()
        now = message.next_attempt_at
    message = OutboxMessage.objects.get()
    assert message.status == "failed"
    assert message.attempts == 10


def test_approval_decided_is_published(api, receiver):
    from tests.approvals.conftest import person

    _endpoint(api, receiver.url, events=["approval.decided"])
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    op = api.register(api.run(), "refund")
    services.approval_decide(
        request_id=op["approval"]["id"],
        user=person(decide_on="refund"),
        approve=False,
        comment="no",
    )
    webhooks.deliver_due()
    [request] = receiver.requests
    body = json.loads(request.body)
    assert body["type"] == "approval.decided"
    assert body["data"]["approval"]["status"] == "rejected"
    assert body["data"]["operation"]["error_detail"] == "no"


def test_prune_keeps_pending_and_recent_messages(api, receiver):
    _endpoint(api, receiver.url, events=["operation.ready"])
    api.tool("t")
    api.register(api.run(), "t")
    webhooks.deliver_due()
    api.register(api.run(), "t")  # pending
    with time_machine.travel(timezone.now() + timedelta(days=31), tick=False):
        assert services.delivery_prune(older_than=timedelta(days=30)) == 1
    assert list(OutboxMessage.objects.values_list("status", flat=True)) == ["pending"]


def test_a_person_can_redeliver(api, receiver):
    from django.test import Client
    from guardian.shortcuts import assign_perm

    from operations.models import Tool
    from tests.approvals.conftest import person

    _endpoint(api, receiver.url, events=["operation.ready"])
    api.tool("t")
    op = api.register(api.run(), "t")
    webhooks.deliver_due()
    user = person()
    assign_perm("operations.reconcile_tool", user, Tool.objects.get(pk="t"))
    client = Client()
    client.force_login(user)
    page = client.get(f"/operations/{op['id']}/").content.decode()
    message = OutboxMessage.objects.get()
    assert message.id in page
    assert "HTTP 204" in page
    client.post(f"/webhooks/{message.id}/redeliver")
    webhooks.deliver_due()
    assert len(receiver.requests) == 2
    assert receiver.requests[0].headers["webhook-id"] == receiver.requests[1].headers["webhook-id"]
