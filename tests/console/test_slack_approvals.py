"""Slack approvals end to end (docs/notifications.md, Slack): Effectgate posts a request
to a fake Slack on loopback (tests/support/fake_slack.py) through ``slack_sdk``, the fake
signs interactions as Slack does and sends them to the live server's interactivity URL,
and the decision is the console's own: the console, the API and the Slack message agree.

PostgreSQL in CI: the live server answers from its own thread, so the data is committed
(``transaction=True``) and the decision's notices go out after a real commit.
"""

import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import Group
from django.core import mail
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals.models import ApprovalRequest, Decision, ExternalIdentity, Grant
from operations import services
from operations.audit.state import state_verify
from operations.dispatch import notices
from operations.models import Event, Notice, NoticeDelivery, SlackMessage, Tool
from tests.approvals.conftest import person
from tests.conftest import EUR_CENTS, REFUND_SCHEMA, contract

pytestmark = pytest.mark.django_db(transaction=True)

CHANNEL = "C0APPROVALS"
PATH = "/integrations/slack/interactions"
SCHEMA = {
    **REFUND_SCHEMA,
    "properties": {
        **REFUND_SCHEMA["properties"],
        "card_token": {"type": "string", "x-sensitive": True},
    },
}
SECRET_CARD = "tok_SECRET_4242424242"
ARGUMENTS = {"payment_id": "pay_77", "amount_cents": 12550, "card_token": SECRET_CARD}


@pytest.fixture
def slack_on(settings, fake_slack):
    settings.SLACK_BOT_TOKEN = fake_slack.bot_token
    settings.SLACK_SIGNING_SECRET = fake_slack.signing_secret
    settings.SLACK_API_URL = fake_slack.url
    settings.SLACK_APPROVALS_CHANNEL = CHANNEL
    settings.SLACK_TEAM_ID = fake_slack.team_id
    settings.CONSOLE_BASE_URL = "https://effectgate.example.com"
    return fake_slack


def _refund_tool(api, *, effect="irreversible", required=1, **approval):
    api.tool(
        "refund",
        contract(
            effect,
            input_schema=SCHEMA,
            display={"fields": {"/amount_cents": EUR_CENTS}},
            approval={
                "mode": "rules",
                "rules": [{"path": "/amount_cents", "op": "gt", "value": 10000}],
                "approvals_required": required,
                **approval,
            },
        ),
    )


def _pending(api, principal="user:alice"):
    op = api.register(
        api.run(principal=principal),
        "refund",
        ARGUMENTS,
        approval={"require": True, "reason": "Customer says the parcel never arrived"},
    )
    assert op["status"] == "awaiting_approval", op
    return op


def _approver(fake, *, username="ann", slack_id="U0ANN", tool="refund", link=True, **fields):
    user = person(username=username, email=f"{username}@example.com", **fields)
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk=tool))
    fake.add_user(slack_id, name=username, email=f"{username}@example.com")
    if link:
        services.slack_link(
            user=user, slack_user_id=slack_id, actor=services.Actor.system("test"), via="operator"
        )
    return user


def _posted(fake, op):
    """The one message posted for ``op``'s request, as the fake holds it now."""
    record = SlackMessage.objects.get(request_id=op["approval"]["id"])
    return fake.message(record.channel, record.ts)


def _click(fake, live_server, message, *, user, action="approve", **options):
    payload = fake.block_actions(
        user_id=user,
        action_id=action,
        channel=message.channel,
        message_ts=message.ts,
        value=options.pop("value", None),
    )
    return fake.send_interaction(live_server.url + PATH, payload, **options)


def _texts(blocks) -> str:
    """Every text a message's blocks show, in one string."""
    found = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "text" and isinstance(value, str):
                    found.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(blocks)
    return "\n".join(found)


def _buttons(message) -> list[str]:
    return [
        element.get("action_id")
        for block in message.blocks
        if block.get("type") == "actions"
        for element in block["elements"]
    ]


def _written() -> dict[str, int]:
    """How many rows of what a decision could write there are."""
    return {
        "decisions": Decision.objects.count(),
        "grants": Grant.objects.count(),
        "notices": Notice.objects.count(),
        "links": ExternalIdentity.objects.count(),
        "events": Event.objects.count(),
    }


def test_a_request_is_posted_with_what_a_person_needs_and_no_secret(api, slack_on):
    _refund_tool(api)
    op = _pending(api)
    [post] = slack_on.calls_to("chat.postMessage")
    assert post.token_ok
    assert post.args["channel"] == CHANNEL
    message = _posted(slack_on, op)
    text = _texts(message.blocks)
    assert "Approval needed: refund" in text
    assert "*Amount*\n€125.50" in text  # the amount as the contract displays it
    assert "Payment id: pay_77, Amount: €125.50, Card token: (sensitive)" in text
    assert "*For*\nuser:alice" in text  # the principal
    assert "Customer says the parcel never arrived" in text  # the runner's reason
    assert "Amount over €100.00" in text  # the rule, in words
    assert "0 of 1; 1 more needed" in text
    assert "<!date^" in text  # the expiry, in the reader's time zone
    assert _buttons(message) == ["approve", "reject", "open"]
    request = ApprovalRequest.objects.get(pk=op["approval"]["id"])
    values = {
        element.get("value")
        for block in message.blocks
        if block.get("type") == "actions"
        for element in block["elements"]
    }
    assert f"{request.id}:{request.intent_hash}" in values
    urls = [e.get("url") for b in message.blocks for e in b.get("elements", []) if e.get("url")]
    assert urls == [f"https://effectgate.example.com/approvals/{request.id}/"]
    # No x-sensitive value in any call to Slack, nor the bot token in a body.
    for call in slack_on.calls:
        assert SECRET_CARD not in repr(call.args)
        assert slack_on.bot_token not in repr(call.args)


def test_approve_from_slack_and_the_console_the_api_and_the_message_agree(
    api, slack_on, live_server
):
    _refund_tool(api)
    ann = _approver(slack_on)
    op = _pending(api)
    message = _posted(slack_on, op)
    answer = _click(slack_on, live_server, message, user="U0ANN")
    assert answer.status_code == 200
    assert answer.in_time, f"Slack waits 3 s; the answer took {answer.elapsed_s:.2f} s"
    # The API: the operation may run now, on a grant bound to the intent shown.
    assert api.operation(op["id"])["status"] == "ready"
    assert api.claim(op["id"])["attempt"] == 1
    # The console: the request is decided, by Ann, from Slack.
    console = Client()
    console.force_login(ann)
    page = console.get(f"/approvals/{op['approval']['id']}/").content.decode()
    assert "approved" in page.lower()
    assert "ann" in page
    decision = Event.objects.get(stream=op["id"], kind="decision")
    assert decision.actor == "user:ann"
    assert decision.data["via"] == "slack"
    # Slack: the same message, updated in place: who decided, no buttons left.
    update = slack_on.wait_for("chat.update")[-1]
    assert update.args["ts"] == message.ts
    now = _posted(slack_on, op)
    assert "Approved: refund" in _texts(now.blocks)
    assert "ann" in _texts(now.blocks)
    assert "approved" in _texts(now.blocks)
    assert _buttons(now) == ["open"]
    assert list(state_verify()) == []


def test_a_retry_of_the_same_click_decides_nothing_twice(api, slack_on, live_server):
    _refund_tool(api, required=2)
    _approver(slack_on)
    op = _pending(api)
    message = _posted(slack_on, op)
    payload = slack_on.block_actions(
        user_id="U0ANN", action_id="approve", channel=message.channel, message_ts=message.ts
    )
    first = slack_on.send_interaction(live_server.url + PATH, payload)
    again = slack_on.send_interaction(live_server.url + PATH, payload, retry_num=1)
    assert (first.status_code, again.status_code) == (200, 200)
    assert Decision.objects.filter(request_id=op["approval"]["id"]).count() == 1
    assert not Event.objects.filter(kind="slack_decision_refused").exists()


def _principal_click(fake, live_server, api):
    _refund_tool(api)
    _approver(fake, username="alice", slack_id="U0ALICE")
    op = _pending(api, principal="user:alice")
    return op, lambda: _click(fake, live_server, _posted(fake, op), user="U0ALICE")


def _unlinked_click(fake, live_server, api):
    _refund_tool(api)
    _approver(fake, link=False)
    op = _pending(api)
    return op, lambda: _click(fake, live_server, _posted(fake, op), user="U0ANN")


def _unpermitted_click(fake, live_server, api):
    _refund_tool(api)
    bob = person(username="bob", email="bob@example.com")
    fake.add_user("U0BOB", name="bob")
    services.slack_link(
        user=bob, slack_user_id="U0BOB", actor=services.Actor.system("test"), via="operator"
    )
    op = _pending(api)
    return op, lambda: _click(fake, live_server, _posted(fake, op), user="U0BOB")


def _stale_click(fake, live_server, api):
    _refund_tool(api)
    _approver(fake)
    op = _pending(api)
    forged = f"{op['approval']['id']}:{'0' * 64}"
    return op, lambda: _click(fake, live_server, _posted(fake, op), user="U0ANN", value=forged)


def _bad_signature(fake, live_server, api):
    _refund_tool(api)
    _approver(fake)
    op = _pending(api)
    return op, lambda: _click(
        fake, live_server, _posted(fake, op), user="U0ANN", forge_signature=True
    )


def _old_timestamp(fake, live_server, api):
    _refund_tool(api)
    _approver(fake)
    op = _pending(api)
    return op, lambda: _click(fake, live_server, _posted(fake, op), user="U0ANN", age_s=301)


REFUSALS = {
    "principal": (_principal_click, 200, "slack_decision_refused", "principal"),
    "unlinked": (_unlinked_click, 200, "slack_decision_refused", "not linked"),
    "no permission": (_unpermitted_click, 200, "slack_decision_refused", "permission"),
    "stale intent hash": (_stale_click, 200, "slack_decision_refused", "not the one you were"),
    "bad signature": (_bad_signature, 401, "slack_request_refused", "bad_signature"),
    "old timestamp": (_old_timestamp, 401, "slack_request_refused", "old_timestamp"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refused_click_writes_its_refusal_event_and_nothing_else(
    api, slack_on, live_server, case
):
    make, status, kind, words = REFUSALS[case]
    op, send = make(slack_on, live_server, api)
    before_events = set(Event.objects.values_list("pk", flat=True))
    written = _written()
    answer = send()
    assert answer.status_code == status
    new = Event.objects.exclude(pk__in=before_events).order_by("pk")
    refusals = [event for event in new if event.kind == kind]
    assert len(refusals) == 1, [event.kind for event in new]
    refusal = refusals[0]
    assert words in repr(refusal.data), refusal.data
    # Nothing after the refusal: the refusal is the last event written, no decision, no
    # grant, no link, no notice of a change, and the operation still waits.
    assert new.last().pk == refusal.pk
    assert Decision.objects.count() == written["decisions"]
    assert Grant.objects.count() == written["grants"]
    assert not Notice.objects.filter(kind=Notice.Kind.REQUEST_CHANGED).exists()
    assert api.operation(op["id"])["status"] == "awaiting_approval"
    if kind == "slack_decision_refused":
        assert refusal.stream == op["id"]
        # The person is told why, privately (an ephemeral message only they see).
        [told] = slack_on.ephemerals
        assert told.text.startswith("Nothing was decided.")
    else:
        assert refusal.stream == "slack"
        assert slack_on.ephemerals == []
    assert list(state_verify()) == []


def test_the_refusal_is_the_only_write_of_a_refused_click(api, slack_on, live_server):
    """Counted precisely for one case: every table a decision writes, before and after."""
    _refund_tool(api)
    _approver(slack_on, link=False)
    op = _pending(api)
    message = _posted(slack_on, op)
    before = _written()
    answer = _click(slack_on, live_server, message, user="U0ANN")
    assert answer.status_code == 200
    after = _written()
    assert after == {**before, "events": before["events"] + 1}
    assert NoticeDelivery.objects.filter(channel="slack_update").count() == 0


def test_a_quorum_of_two_completes_with_one_decision_from_slack_and_one_from_the_console(
    api, slack_on, live_server
):
    _refund_tool(api, required=2)
    _approver(slack_on)
    bea = _approver(slack_on, username="bea", slack_id="U0BEA", link=False)
    op = _pending(api)
    message = _posted(slack_on, op)
    assert _click(slack_on, live_server, message, user="U0ANN").status_code == 200
    assert api.operation(op["id"])["status"] == "awaiting_approval"
    halfway = _posted(slack_on, op)
    assert "1 of 2; 1 more needed" in _texts(halfway.blocks)
    assert _buttons(halfway) == ["approve", "reject", "open"]
    console = Client()
    console.force_login(bea)
    response = console.post(
        f"/approvals/{op['approval']['id']}/decide", {"decision": "approve", "comment": "ok"}
    )
    assert response.status_code == 302
    assert api.operation(op["id"])["status"] == "ready"
    done = _posted(slack_on, op)
    assert "Approved: refund" in _texts(done.blocks)
    assert "ann" in _texts(done.blocks)
    assert "bea" in _texts(done.blocks)
    assert _buttons(done) == ["open"]
    deciders = Event.objects.get(stream=op["id"], kind="granted").data["deciders"]
    assert len(deciders) == 2
    assert list(state_verify()) == []


def test_reject_asks_for_a_reason_in_a_modal_and_the_runner_receives_it(api, slack_on, live_server):
    _refund_tool(api)
    _approver(slack_on)
    op = _pending(api)
    message = _posted(slack_on, op)
    assert _click(slack_on, live_server, message, user="U0ANN", action="reject").status_code == 200
    [opened] = slack_on.calls_to("views.open")
    assert opened.args["view"]["callback_id"] == "effectgate_reject"
    assert api.operation(op["id"])["status"] == "awaiting_approval"  # nothing decided yet
    empty = slack_on.view_submission(user_id="U0ANN", values={"reason": {"reason_input": " "}})
    answer = slack_on.send_interaction(live_server.url + PATH, empty)
    assert answer.json()["response_action"] == "errors"
    submitted = slack_on.view_submission(
        user_id="U0ANN", values={"reason": {"reason_input": "Refunded last week already"}}
    )
    assert slack_on.send_interaction(live_server.url + PATH, submitted).status_code == 200
    body = api.operation(op["id"])
    assert body["status"] == "rejected"
    assert "Refunded last week already" in repr(body)
    assert "Rejected: refund" in _texts(_posted(slack_on, op).blocks)


def test_a_decision_that_needs_a_second_factor_shows_only_the_console_link(
    api, slack_on, settings, live_server
):
    settings.REQUIRE_TOTP_FOR_IRREVERSIBLE = True
    _refund_tool(api)
    _approver(slack_on)
    op = _pending(api)
    message = _posted(slack_on, op)
    assert _buttons(message) == ["open"]
    assert "second factor" in _texts(message.blocks)
    # A forged Approve click is refused by the decision service itself.
    value = f"{op['approval']['id']}:{ApprovalRequest.objects.get().intent_hash}"
    assert _click(slack_on, live_server, message, user="U0ANN", value=value).status_code == 200
    assert api.operation(op["id"])["status"] == "awaiting_approval"
    assert Event.objects.filter(stream=op["id"], kind="slack_decision_refused").count() == 1


def test_expiry_and_withdrawal_update_the_message_in_place(api, slack_on):
    _refund_tool(api, request_ttl_s=600)
    expiring = _pending(api)
    with time_machine.travel(timezone.now() + timedelta(seconds=601), tick=False):
        assert services.sweep().approvals_expired == 1
        notices.deliver_due()
    assert "Expired without a decision" in _texts(_posted(slack_on, expiring).blocks)
    assert _buttons(_posted(slack_on, expiring)) == ["open"]
    cancelled = _pending(api, principal="user:carol")
    response = api.post(f"/api/v1/runs/{cancelled['run']}/cancel", {"reason": "astray"})
    assert response.status_code == 200, response.json()
    notices.deliver_due()
    assert "Withdrawn" in _texts(_posted(slack_on, cancelled).blocks)


def test_an_escalation_posts_to_the_groups_channel_and_mails_its_members(api, slack_on):
    group = Group.objects.create(name="Finance leads")
    lead = person(username="lead", email="lead@example.com")
    lead.groups.add(group)
    admin = person(username="admin", is_superuser=True)
    services.route_set(user=admin, group=group, channel="#finance-leads")
    _refund_tool(api, escalate_after_s=3600, escalate_to="Finance leads")
    op = _pending(api)
    mail.outbox.clear()
    with time_machine.travel(timezone.now() + timedelta(seconds=3601), tick=False):
        assert services.sweep().approvals_escalated == 1
        notices.deliver_due()
    posts = [call.args["channel"] for call in slack_on.calls_to("chat.postMessage")]
    assert posts == [CHANNEL, "finance-leads"]
    assert "Escalated to" in _texts(_posted_in(slack_on, op, "finance-leads").blocks)
    [sent] = mail.outbox
    assert sent.to == ["lead@example.com"]
    assert "Escalated to Finance leads" in sent.subject
    routed = Event.objects.get(stream=f"group:{group.pk}", kind="notifications_routed")
    assert routed.data == {"slack_channel": "finance-leads", "before": None}


def _posted_in(fake, op, address):
    record = SlackMessage.objects.get(request_id=op["approval"]["id"], address=address)
    return fake.message(record.channel, record.ts)


def test_a_person_links_their_slack_account_from_the_link_slack_gave_them(
    api, slack_on, live_server
):
    _refund_tool(api)
    ann = _approver(slack_on, link=False)
    op = _pending(api)
    _click(slack_on, live_server, _posted(slack_on, op), user="U0ANN")
    [told] = slack_on.ephemerals
    assert told.user == "U0ANN"
    link = re.search(r"https://effectgate\.example\.com(/account/slack/link\?token=\S+)", told.text)
    assert link, told.text
    console = Client()
    console.force_login(ann)
    page = console.get(link.group(1))
    assert page.status_code == 200
    assert b"U0ANN" in page.content
    token = re.search(r'name="token" value="([^"]+)"', page.content.decode()).group(1)
    assert console.post("/account/slack/link", {"token": token}).status_code == 302
    assert ExternalIdentity.objects.get(issuer="slack", user=ann).subject == "U0ANN"
    linked = Event.objects.get(stream=f"user:{ann.pk}", kind="identity_linked")
    assert linked.data["via"] == "console"
    assert linked.data["subject"] == "U0ANN"
    # A forged or expired token links nothing.
    assert console.post("/account/slack/link", {"token": token + "x"}).status_code == 302
    assert ExternalIdentity.objects.filter(issuer="slack").count() == 1
    # Now the same button decides as Ann.
    _click(slack_on, live_server, _posted(slack_on, op), user="U0ANN")
    assert api.operation(op["id"])["status"] == "ready"


def test_an_operator_links_and_unlinks_with_the_command(db, slack_on, capsys):
    ann = person(username="ann")
    call_command("slack", "link", "ann", "U0ANN")
    assert ExternalIdentity.objects.get(issuer="slack", user=ann).subject == "U0ANN"
    bob = person(username="bob")
    with pytest.raises(Exception, match="linked to another person"):
        call_command("slack", "link", "bob", "U0ANN")
    assert not ExternalIdentity.objects.filter(user=bob).exists()
    call_command("slack", "links")
    assert "ann\tU0ANN" in capsys.readouterr().out
    call_command("slack", "unlink", "ann")
    assert not ExternalIdentity.objects.filter(issuer="slack").exists()
    kinds = list(Event.objects.filter(stream=f"user:{ann.pk}").values_list("kind", flat=True))
    assert kinds == ["identity_linked", "identity_unlinked"]


def test_linking_by_a_confirmed_email_only_where_the_setting_allows_it(
    api, slack_on, settings, live_server
):
    _refund_tool(api)
    _approver(slack_on, link=False)
    op = _pending(api)
    message = _posted(slack_on, op)
    _click(slack_on, live_server, message, user="U0ANN")
    assert not ExternalIdentity.objects.filter(issuer="slack").exists()  # off by default
    settings.SLACK_LINK_BY_VERIFIED_EMAIL = True
    _click(slack_on, live_server, message, user="U0ANN")
    assert ExternalIdentity.objects.get(issuer="slack").subject == "U0ANN"
    assert api.operation(op["id"])["status"] == "ready"


def test_an_unconfirmed_email_or_a_superusers_links_nothing(api, slack_on, settings, live_server):
    settings.SLACK_LINK_BY_VERIFIED_EMAIL = True
    _refund_tool(api)
    root = person(username="root", email="root@example.com", is_superuser=True)
    assign_perm("operations.decide_tool", root, Tool.objects.get(pk="refund"))
    slack_on.add_user("U0ROOT", name="root", email="root@example.com")
    slack_on.add_user("U0EVE", name="eve", email="ann@example.com", email_confirmed=False)
    _approver(slack_on, link=False)
    op = _pending(api)
    message = _posted(slack_on, op)
    _click(slack_on, live_server, message, user="U0ROOT")
    _click(slack_on, live_server, message, user="U0EVE")
    assert not ExternalIdentity.objects.filter(issuer="slack").exists()
    assert api.operation(op["id"])["status"] == "awaiting_approval"


def test_a_rate_limited_post_is_sent_again_after_slacks_retry_after(api, slack_on):
    slack_on.rate_limit("chat.postMessage", retry_after_s=7)
    _refund_tool(api)
    op = _pending(api)
    delivery = NoticeDelivery.objects.get(channel="slack", address=CHANNEL)
    assert delivery.status == "pending"
    assert "ratelimited" in delivery.last_error
    assert delivery.next_attempt_at >= timezone.now() + timedelta(seconds=6)
    with time_machine.travel(timezone.now() + timedelta(seconds=8), tick=False):
        notices.deliver_due()
    delivery.refresh_from_db()
    assert delivery.status == "delivered"
    assert len(slack_on.calls_to("chat.postMessage")) == 2
    assert _buttons(_posted(slack_on, op)) == ["approve", "reject", "open"]


def test_a_channel_that_does_not_exist_fails_at_once(api, slack_on):
    slack_on.fail("chat.postMessage", error="channel_not_found")
    _refund_tool(api)
    _pending(api)
    delivery = NoticeDelivery.objects.get(channel="slack", address=CHANNEL)
    assert delivery.status == "failed"
    assert delivery.last_error == "Slack: channel_not_found"


def test_interactions_answer_404_while_slack_is_not_configured(db, client):
    assert client.post(PATH, {"payload": "{}"}).status_code == 404


def test_the_link_offered_to_an_unlinked_person_is_never_recorded(api, slack_on, live_server):
    """The link goes to the person privately; the ledger (which runners read) keeps only
    the refusal."""
    _refund_tool(api)
    _approver(slack_on, link=False)
    op = _pending(api)
    _click(slack_on, live_server, _posted(slack_on, op), user="U0ANN")
    [refusal] = Event.objects.filter(kind="slack_decision_refused")
    assert refusal.data["refusal"] == "unlinked"
    assert "token" not in repr(refusal.data)
    assert "/account/slack/link" not in repr(list(Event.objects.values_list("data", flat=True)))
    events = api.get(f"/api/v1/operations/{op['id']}/events").content.decode()
    assert "token=" not in events
    [told] = slack_on.ephemerals
    assert "/account/slack/link?token=" in told.text


def _offered_link(fake, live_server, op, user):
    _click(fake, live_server, _posted(fake, op), user=user)
    told = [e for e in fake.ephemerals if e.user == user][-1]
    return re.search(r"(/account/slack/link\?token=\S+)", told.text).group(1)


def test_a_link_passed_on_to_someone_else_links_nothing(api, slack_on, live_server):
    """Mallory's Slack would decide as Ann if Ann followed Mallory's link: the page
    links only the person whose email Slack confirms for the account, and only once."""
    _refund_tool(api)
    ann = _approver(slack_on, link=False)
    slack_on.add_user("U0MAL", name="mallory", email="mallory@example.com")
    op = _pending(api)
    mallorys = _offered_link(slack_on, live_server, op, "U0MAL")
    console = Client()
    console.force_login(ann)
    page = console.get(mallorys)
    assert b"not yours" in page.content
    token = mallorys.split("token=", 1)[1]
    console.post("/account/slack/link", {"token": token})
    assert not ExternalIdentity.objects.filter(issuer="slack").exists()
    # Her own link works once; the same link again does nothing.
    own = _offered_link(slack_on, live_server, op, "U0ANN").split("token=", 1)[1]
    console.post("/account/slack/link", {"token": own})
    assert ExternalIdentity.objects.get(issuer="slack").user == ann
    services.slack_unlink(user=ann, actor=services.Actor.system("test"))
    console.post("/account/slack/link", {"token": own})
    assert not ExternalIdentity.objects.filter(issuer="slack").exists()


def test_a_click_from_a_person_of_another_organisation_is_refused(api, slack_on, live_server):
    """A channel shared with another organisation (Slack Connect): the click's workspace
    is ours, the person's is theirs."""
    _refund_tool(api)
    _approver(slack_on)
    op = _pending(api)
    message = _posted(slack_on, op)
    payload = slack_on.block_actions(
        user_id="U0ANN", action_id="approve", channel=message.channel, message_ts=message.ts
    )
    payload["user"]["team_id"] = "TFOREIGN"
    answer = slack_on.send_interaction(live_server.url + PATH, payload)
    assert answer.status_code == 401
    assert api.operation(op["id"])["status"] == "awaiting_approval"
    [refused] = Event.objects.filter(stream="slack", kind="slack_request_refused")
    assert refused.data["refusal"] == "other_workspace"


def test_a_person_of_another_organisation_is_never_linked_by_email(
    api, slack_on, settings, live_server
):
    settings.SLACK_LINK_BY_VERIFIED_EMAIL = True
    _refund_tool(api)
    _approver(slack_on, link=False, slack_id="U0UNUSED")
    slack_on.add_user("U0EXT", name="ext", email="ann@example.com", team_id="TFOREIGN")
    op = _pending(api)
    answer = _click(slack_on, live_server, _posted(slack_on, op), user="U0EXT")
    assert answer.status_code == 200  # refused as unlinked: the profile is another team's
    [looked_up] = slack_on.calls_to("users.info")
    assert looked_up.args["user"] == "U0EXT"
    assert not ExternalIdentity.objects.filter(issuer="slack").exists()
    assert api.operation(op["id"])["status"] == "awaiting_approval"


def test_pressing_a_refused_button_again_and_again_records_one_refusal(api, slack_on, live_server):
    _refund_tool(api)
    _approver(slack_on, link=False)
    op = _pending(api)
    message = _posted(slack_on, op)
    for _ in range(5):
        assert _click(slack_on, live_server, message, user="U0ANN").status_code == 200
    assert Event.objects.filter(kind="slack_decision_refused").count() == 1
    assert len(slack_on.ephemerals) == 5  # each press is still told why


def test_what_an_agent_wrote_can_neither_mention_a_channel_nor_forge_a_link(api, slack_on):
    _refund_tool(api)
    hostile = "<!channel> <https://evil.example/approve|Approve here> & " + "<" * 3000
    api.register(
        api.run(),
        "refund",
        {**ARGUMENTS, "payment_id": hostile},
        approval={"require": True, "reason": hostile[:1990]},
    )
    [post] = slack_on.calls_to("chat.postMessage")
    shown = post.args["text"] + _texts(post.args["blocks"])
    assert "<!channel>" not in shown
    assert "<https://evil.example" not in shown
    assert "&lt;!channel&gt;" in post.args["text"]
    for block in post.args["blocks"]:
        for text in [block.get("text"), *block.get("fields", []), *block.get("elements", [])]:
            if isinstance(text, dict) and text.get("type") == "mrkdwn":
                assert text["verbatim"] is True
                assert len(text["text"]) <= 3000
    delivery = NoticeDelivery.objects.get(channel="slack")
    assert delivery.status == "delivered"


def test_a_rejection_refused_in_the_modal_says_so_again_when_submitted_again(
    api, slack_on, live_server
):
    _refund_tool(api)
    _approver(slack_on)
    op = _pending(api)
    _click(slack_on, live_server, _posted(slack_on, op), user="U0ANN", action="reject")
    # Meanwhile someone else decided: the submission is refused, and so is its resubmission.
    other = _approver(slack_on, username="bea", slack_id="U0BEA", link=False)
    services.approval_decide(request_id=op["approval"]["id"], user=other, approve=True, comment="")
    submitted = slack_on.view_submission(user_id="U0ANN", values={"reason": {"reason_input": "no"}})
    first = slack_on.send_interaction(live_server.url + PATH, submitted)
    again = slack_on.send_interaction(live_server.url + PATH, submitted)
    assert first.json()["response_action"] == "errors"
    assert again.json() == first.json()
    assert Event.objects.filter(kind="slack_decision_refused").count() == 1


def test_a_body_that_is_not_utf8_is_refused_not_a_server_error(db, slack_on, client):
    response = client.post(
        PATH,
        b"payload=\xff\xfe",
        content_type="application/x-www-form-urlencoded",
        HTTP_X_SLACK_REQUEST_TIMESTAMP=str(int(timezone.now().timestamp())),
        HTTP_X_SLACK_SIGNATURE="v0=" + "0" * 64,
    )
    assert response.status_code == 401


def test_a_tool_kept_out_of_slack_is_not_posted(api, slack_on):
    _refund_tool(api)
    admin = person(username="admin", is_superuser=True)
    services.route_set(user=admin, tool=Tool.objects.get(pk="refund"), channel="-")
    _pending(api)
    assert slack_on.calls_to("chat.postMessage") == []
    with pytest.raises(ValueError, match="Slack channel"):
        services.route_set(user=admin, tool=Tool.objects.get(pk="refund"), channel="#" + "x" * 90)
