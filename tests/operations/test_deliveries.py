"""Webhook delivery through the services: what a receiver's answer may change, and
which URLs an endpoint may have."""

import io
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.core.management import call_command
from django.db import connection

from operations import errors, hosts, services
from operations.dispatch import webhooks
from operations.models import DeliveryAttempt, Event, OutboxMessage, Runner, WebhookEndpoint
from tests.conftest import make_runner
from tests.support.receiver import Receiver

GONE = "the receiver answered 410 Gone"


@pytest.fixture
def receiver(settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    server = Receiver()
    yield server
    server.close()


def _endpoint(api, url: str, events=("operation.ready",)) -> str:
    response = api.post("/api/v1/webhook-endpoints", {"url": url, "events": list(events)})
    assert response.status_code == 201, response.json()
    return response.json()["id"]


def _audit_verify() -> str:
    out = io.StringIO()
    call_command("audit", "verify", stdout=out)  # raises CommandError when anything fails
    return out.getvalue()


def _runner_events(api, kind: str):
    return Event.objects.filter(stream=f"runner:{api.runner.id}", kind=kind)


# --- 410 Gone: the endpoint is disabled through the service, with its event ----------


def test_gone_disables_the_endpoint_with_one_event_that_names_why(api, receiver):
    endpoint_id = _endpoint(api, receiver.url)
    api.tool("t")
    api.register(api.run(), "t")
    api.register(api.run(), "t")
    receiver.status = 410
    report = webhooks.deliver_due()
    assert (report.sent, report.failed) == (1, 1)  # the second message was dropped unsent
    shown = api.get(f"/api/v1/webhook-endpoints/{endpoint_id}").json()
    assert (shown["is_active"], shown["disabled_reason"]) == (False, GONE)
    endpoint = WebhookEndpoint.objects.get(pk=endpoint_id)
    assert (endpoint.is_active, endpoint.disabled_reason) == (False, GONE)
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"disabled"}
    [event] = _runner_events(api, "webhook_endpoint_disabled")
    assert event.actor == "system:webhooks"
    assert event.data == {
        "endpoint": endpoint_id,
        "url": receiver.url,
        "reason": GONE,
        "dropped_messages": 2,
    }
    assert "Every chain verifies." in _audit_verify()


def test_gone_takes_the_endpoint_out_of_the_runners_subscriptions(api, receiver):
    """The runner row's summary of its active endpoints' patterns, which decides whether a
    registration may take the lean path, no longer lists a disabled endpoint's."""
    _endpoint(api, receiver.url)
    api.tool("t")
    api.register(api.run(), "t")
    assert Runner.objects.get(pk=api.runner.pk).webhook_events == ["operation.ready"]
    receiver.status = 410
    webhooks.deliver_due()
    assert Runner.objects.get(pk=api.runner.pk).webhook_events == []
    out = io.StringIO()
    call_command("lean_fill", stdout=out)
    assert "0 runners' webhook patterns" in out.getvalue()


def test_disabling_an_endpoint_twice_writes_one_event(api, receiver):
    endpoint = WebhookEndpoint.objects.get(pk=_endpoint(api, receiver.url))
    actor = services.Actor.system("test")
    assert services.webhook_endpoint_disable(endpoint=endpoint, actor=actor, reason="first")
    assert not services.webhook_endpoint_disable(endpoint=endpoint, actor=actor, reason="again")
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).disabled_reason == "first"
    assert _runner_events(api, "webhook_endpoint_disabled").count() == 1


@pytest.mark.django_db(transaction=True)
def test_dispatchers_told_gone_at_once_disable_the_endpoint_once(settings):
    """Four dispatchers each send one message of the endpoint, all in flight together,
    and each is answered 410: one disables it, the others find their message dropped."""
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    receiver = Receiver(status=410, delay=0.5)
    workers = 4
    try:
        api = make_runner()
        endpoint_id = _endpoint(api, receiver.url)
        api.tool("t")
        run = api.run()
        for _ in range(workers * 2):
            api.register(run, "t")
        barrier = threading.Barrier(workers)

        def dispatch(_):
            barrier.wait()
            try:
                return webhooks.deliver_due()
            finally:
                connection.close()

        with ThreadPoolExecutor(workers) as pool:
            reports = list(pool.map(dispatch, range(workers)))
    finally:
        receiver.close()
    assert sum(report.sent for report in reports) == len(receiver.requests) == workers
    assert not WebhookEndpoint.objects.get(pk=endpoint_id).is_active
    assert _runner_events(api, "webhook_endpoint_disabled").count() == 1
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"disabled"}
    assert not DeliveryAttempt.objects.filter(finished_at=None).exists()
    assert "Every chain verifies." in _audit_verify()


def test_an_endpoint_deleted_while_its_message_is_sent_does_not_stop_the_batch(
    api, receiver, monkeypatch
):
    first = _endpoint(api, receiver.url)
    second = _endpoint(api, receiver.url)
    api.tool("t")
    api.register(api.run(), "t")
    signed = webhooks.headers_for

    def delete_first_then_sign(message, body, now):
        if message.endpoint_id == first:
            services.webhook_endpoint_delete(
                endpoint=WebhookEndpoint.objects.get(pk=first),
                actor=services.Actor.of_runner(api.runner),
            )
        return signed(message, body, now)

    monkeypatch.setattr(webhooks, "headers_for", delete_first_then_sign)
    webhooks.deliver_due()
    assert not WebhookEndpoint.objects.filter(pk=first).exists()
    assert list(OutboxMessage.objects.values_list("endpoint_id", "status")) == [
        (second, "delivered")
    ]
    assert len(receiver.requests) == 2


# --- The URL rule, in the service ------------------------------------------------------


REFUSED = (
    "10.0.0.5 resolves to an address that is not allowed (10.0.0.5). Targets must be "
    "public addresses or listed in WEBHOOK_ALLOWED_HOSTS."
)


def test_the_endpoint_service_refuses_a_url_the_policy_refuses(api):
    with pytest.raises(errors.UrlNotAllowed) as refused:
        services.webhook_endpoint_create(
            runner=api.runner, url="http://10.0.0.5/hook", events=["operation.*"]
        )
    assert refused.value.detail == REFUSED
    assert not WebhookEndpoint.objects.exists()
    assert not _runner_events(api, "webhook_endpoint_created").exists()


def test_the_api_refuses_with_the_services_message(api):
    response = api.post(
        "/api/v1/webhook-endpoints", {"url": "http://10.0.0.5/hook", "events": ["operation.*"]}
    )
    assert response.status_code == 422
    assert (response.json()["code"], response.json()["detail"]) == ("url_not_allowed", REFUSED)
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_url_is_resolved_before_any_transaction_opens(monkeypatch):
    resolved_in_transaction = []
    resolve = hosts.resolve

    def recording_resolve(host, port):
        resolved_in_transaction.append(connection.in_atomic_block)
        return resolve(host, port)

    monkeypatch.setattr(hosts, "resolve", recording_resolve)
    api = make_runner()
    response = api.post(
        "/api/v1/webhook-endpoints", {"url": "http://93.184.215.14/hook", "events": ["*"]}
    )
    assert response.status_code == 201, response.json()
    assert resolved_in_transaction == [False]
    assert WebhookEndpoint.objects.filter(pk=response.json()["id"]).exists()
