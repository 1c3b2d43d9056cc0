"""Webhook delivery through the services: what a receiver's answer may change, and what a
hostile receiver cannot do to the dispatcher."""

import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

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
    workers = 4
    receiver = Receiver(status=410, hold_until=workers)
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


# --- A hostile receiver's answer ------------------------------------------------------


@pytest.mark.parametrize(
    ("retry_after", "wait"),
    [
        ("²", timedelta(seconds=5)),  # str.isdigit() admits it, int() refuses it
        ("1" * 5000, timedelta(hours=24)),  # int() refuses more than 4300 digits
        ("1" * 20, timedelta(hours=24)),  # past what timedelta holds
        ("0" * 30 + "600", timedelta(minutes=10)),
        ("-600", timedelta(seconds=5)),
    ],
    ids=["superscript", "5000-digits", "20-digits", "leading-zeros", "negative"],
)
def test_a_hostile_retry_after_sets_a_bounded_delay_without_raising(
    api, receiver, retry_after, wait
):
    _endpoint(api, receiver.url)
    api.tool("t")
    api.register(api.run(), "t")
    receiver.status, receiver.headers = 503, {"Retry-After": retry_after}
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        assert webhooks.deliver_due().sent == 1
    message = OutboxMessage.objects.get()
    assert (message.status, message.next_attempt_at) == ("pending", start + wait)
    attempt = DeliveryAttempt.objects.get(message=message)
    assert (attempt.status_code, attempt.finished_at) == (503, start)


def test_a_refusal_body_with_nul_is_recorded_without_it(api, receiver):
    """PostgreSQL refuses U+0000 in a text column: stored as is, the attempt's record
    would fail and the message be sent again every lease, never on the schedule."""
    _endpoint(api, receiver.url)
    api.tool("t")
    api.register(api.run(), "t")
    receiver.status, receiver.body = 500, b"bad\x00request"
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        webhooks.deliver_due()
    attempt = DeliveryAttempt.objects.get()
    assert (attempt.status_code, attempt.error) == (500, "bad\ufffdrequest")
    message = OutboxMessage.objects.get()
    assert (message.status, message.next_attempt_at) == ("pending", start + timedelta(seconds=5))


class EndlessAnswer:
    """A receiver that answers ``status`` and then a body that never ends."""

    def __init__(self, status: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(status)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"x" * 65536
                try:
                    while True:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                except OSError:  # the dispatcher hung up
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hooks"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.parametrize("status", [200, 500])
@pytest.mark.django_db(transaction=True)
def test_an_endless_answer_does_not_hold_the_dispatcher(settings, status):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    server = EndlessAnswer(status)
    try:
        api = make_runner()
        _endpoint(api, server.url)
        api.tool("t")
        api.register(api.run(), "t")
        done = threading.Event()

        def dispatch():
            try:
                webhooks.deliver_due()
            finally:
                connection.close()
                done.set()

        started = time.monotonic()
        threading.Thread(target=dispatch, daemon=True).start()
        assert done.wait(timeout=20), "the dispatcher is still reading the answer"
        assert time.monotonic() - started < 20
    finally:
        server.close()
    attempt = DeliveryAttempt.objects.get()
    assert attempt.status_code == status
    assert len(attempt.error) <= 200
    expected = "delivered" if status == 200 else "pending"
    assert OutboxMessage.objects.get().status == expected


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
