"""The one notification layer (operations/dispatch/notices.py): notices written with the
change they tell, fanned out to each person's chosen channels, the people-facing
webhook, reminders before a request expires, retries, and never sent inside the
transaction of the change."""

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import time_machine
from django.core import mail
from django.db import connection
from django.utils import timezone
from guardian.shortcuts import assign_perm

from operations import services, signing
from operations.dispatch import notices
from operations.models import Event, Notice, NoticeDelivery, SlackMessage, Tool
from operations.selectors.notices import preference_channels
from operations.services.notices import RETRY_SCHEDULE
from tests.approvals.conftest import person
from tests.conftest import contract


def _tool(api, **approval):
    api.tool("refund", contract("irreversible", approval={"mode": "always", **approval}))


def _approver(username="ann", **fields):
    user = person(username=username, email=f"{username}@example.com", **fields)
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk="refund"))
    return user


@pytest.mark.django_db(transaction=True)
def test_mail_goes_out_after_the_commit_never_inside_the_transaction(api, monkeypatch):
    _tool(api)
    _approver()
    seen = []
    original = notices.send_mail

    def watching(**kwargs):
        seen.append(connection.in_atomic_block)
        return original(**kwargs)

    monkeypatch.setattr(notices, "send_mail", watching)
    op = api.register(api.run(principal="user:alice"), "refund")
    assert seen == [False]
    [sent] = mail.outbox
    assert sent.to == ["ann@example.com"]
    assert f"/approvals/{op['approval']['id']}/" in sent.body
    [delivery] = NoticeDelivery.objects.all()
    assert (delivery.channel, delivery.status) == ("mail", "delivered")


@pytest.mark.django_db(transaction=True)
def test_each_person_is_told_on_the_channels_they_chose(api, settings, fake_slack):
    settings.SLACK_BOT_TOKEN = fake_slack.bot_token
    settings.SLACK_API_URL = fake_slack.url
    _tool(api)
    ann = _approver()
    bea = _approver("bea")
    fake_slack.add_user("U0BEA", name="bea")
    services.slack_link(
        user=bea, slack_user_id="U0BEA", actor=services.Actor.system("test"), via="operator"
    )
    services.preference_set(user=ann, channels={"request_opened": []})
    services.preference_set(user=bea, channels={"request_opened": ["slack"]})
    assert preference_channels(ann)["request_opened"] == []
    assert preference_channels(ann)["request_reminder"] == ["mail"]  # the default
    op = api.register(api.run(principal="user:alice"), "refund")
    assert mail.outbox == []  # neither chose mail for new requests
    # Bea's direct messages hold the request with its buttons, kept up to date.
    [dm] = SlackMessage.objects.filter(request_id=op["approval"]["id"], address="U0BEA")
    assert dm.channel.startswith("D")
    services.approval_decide(
        request_id=op["approval"]["id"], user=ann, approve=False, comment="not this one"
    )
    notices.deliver_due()
    held = fake_slack.message(dm.channel, dm.ts)
    assert "Rejected" in held.text
    kinds = Event.objects.filter(stream=f"user:{bea.pk}").values_list("kind", flat=True)
    assert "notification_preferences_set" in list(kinds)


@pytest.mark.django_db
def test_a_typo_in_a_preference_is_refused_not_silently_dropped(db):
    ann = person()
    with pytest.raises(ValueError, match="Not a channel"):
        services.preference_set(user=ann, channels={"request_opened": ["smoke-signal"]})
    with pytest.raises(ValueError, match="Not something people are told of"):
        services.preference_set(user=ann, channels={"request_changed": ["mail"]})
    assert not Event.objects.filter(kind="notification_preferences_set").exists()


@pytest.mark.django_db
def test_a_reminder_goes_once_to_who_may_still_decide_before_the_request_expires(api, settings):
    settings.NOTIFY_REMINDER_BEFORE_S = 900
    _tool(api, request_ttl_s=3600, approvals_required=2)
    ann = _approver()
    _approver("bea")
    op = api.register(api.run(principal="user:alice"), "refund", expect=201)
    notices.deliver_due()
    mail.outbox.clear()
    assert services.reminders_due(now=timezone.now()) == 0  # not yet
    later = timezone.now() + timedelta(seconds=3600 - 600)
    with time_machine.travel(later, tick=False):
        assert services.reminders_due(now=timezone.now()) == 1
        assert services.reminders_due(now=timezone.now()) == 0  # once per request
        notices.deliver_due()
    assert sorted(m.to[0] for m in mail.outbox) == ["ann@example.com", "bea@example.com"]
    assert all("Expires soon" in m.subject for m in mail.outbox)
    # Who already decided is not reminded.
    services.approval_decide(request_id=op["approval"]["id"], user=ann, approve=True, comment="")
    mail.outbox.clear()
    Notice.objects.filter(kind=Notice.Kind.REQUEST_REMINDER).delete()
    with time_machine.travel(later, tick=False):
        assert services.reminders_due(now=timezone.now()) == 1
        notices.deliver_due()
    assert [m.to for m in mail.outbox] == [["bea@example.com"]]


@pytest.mark.django_db
def test_a_mail_server_that_fails_is_tried_again_on_the_schedule_then_given_up(api, monkeypatch):
    _tool(api)
    _approver()

    def refusing(**kwargs):
        raise ConnectionRefusedError("the mail server is down")

    monkeypatch.setattr(notices, "send_mail", refusing)
    api.register(api.run(principal="user:alice"), "refund")
    notices.deliver_due()
    delivery = NoticeDelivery.objects.get(channel="mail")
    assert delivery.status == "pending"
    assert "mail server is down" in delivery.last_error
    at = timezone.now()
    for step in RETRY_SCHEDULE:
        at += step + timedelta(seconds=1)
        with time_machine.travel(at, tick=False):
            notices.deliver_due()
    delivery.refresh_from_db()
    assert delivery.status == "failed"
    assert delivery.attempts == len(RETRY_SCHEDULE) + 1


@pytest.mark.django_db
def test_a_request_decided_before_its_mail_went_out_is_not_told(api):
    _tool(api)
    ann = _approver()
    bea = _approver("bea")
    op = api.register(api.run(principal="user:alice"), "refund")
    services.approval_decide(request_id=op["approval"]["id"], user=bea, approve=True, comment="")
    notices.deliver_due()
    assert [d.status for d in NoticeDelivery.objects.filter(user=ann)] in ([], ["skipped"])
    assert mail.outbox == []


class _Receiver(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.django_db
def test_the_people_facing_webhook_hears_every_notice_signed(api, settings):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    _Receiver.received = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = signing.new_secret()
    settings.NOTIFY_WEBHOOK_URL = f"http://127.0.0.1:{server.server_port}/people"
    settings.NOTIFY_WEBHOOK_SECRET = secret
    try:
        _tool(api)
        ann = _approver()
        op = api.register(api.run(principal="user:alice"), "refund")
        services.approval_decide(
            request_id=op["approval"]["id"], user=ann, approve=True, comment=""
        )
        notices.deliver_due()
    finally:
        server.shutdown()
    kinds = []
    for headers, body in _Receiver.received:
        headers = {k.lower(): v for k, v in headers.items()}
        assert signing.verify(
            secret,
            headers["webhook-id"],
            int(headers["webhook-timestamp"]),
            body,
            headers["webhook-signature"],
        )
        message = json.loads(body)
        kinds.append(message["type"])
        assert message["data"]["approval"]["id"] == op["approval"]["id"]
    assert kinds == ["people.request_opened", "people.request_changed"]


@pytest.mark.django_db(transaction=True)
def test_two_dispatchers_at_once_send_each_delivery_once(api, monkeypatch):
    """Real concurrent dispatchers on the database: the claim is a compare-and-set."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrency is proven on PostgreSQL (SQLite serializes writers)")
    _tool(api)
    for index in range(12):
        _approver(f"p{index}")
    sent = []
    lock = threading.Lock()

    def counting(**kwargs):
        with lock:
            sent.append(kwargs["recipient_list"][0])

    monkeypatch.setattr(notices, "send_mail", counting)
    with monkeypatch.context() as patch:
        # The registration's own after-commit delivery is held back: the two threads race.
        patch.setattr("operations.tasks.deliver_notices.delay", lambda: None)
        api.register(api.run(principal="user:alice"), "refund")
    barrier = threading.Barrier(2)

    def dispatcher():
        barrier.wait()
        try:
            notices.deliver_due()
            notices.deliver_due()
        finally:
            connection.close()

    threads = [threading.Thread(target=dispatcher) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(sent) == sorted(f"p{index}@example.com" for index in range(12))
    assert NoticeDelivery.objects.filter(status="delivered").count() == 12
