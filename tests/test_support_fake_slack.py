"""The fake Slack (tests/support/fake_slack.py) answers slack_sdk's real client as Slack
does, records what it was sent, fails when told, and signs interactions so that
slack_sdk's own verifier accepts them."""

import json
import re
import threading
import time
from urllib.parse import parse_qs

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.webhook import WebhookClient

from tests.support.fake_slack import (
    MAX_BUTTON_VALUE_CHARS,
    MAX_MESSAGE_BLOCKS,
    MAX_PRIVATE_METADATA_CHARS,
    SIGNING_SECRET,
    FakeSlack,
)
from tests.support.receiver import Receiver

TS = re.compile(r"^\d{10}\.\d{6}$")

APPROVAL_BLOCKS = [
    {"type": "section", "text": {"type": "mrkdwn", "text": "*refund* 500 EUR on pay_1"}},
    {
        "type": "actions",
        "block_id": "decide",
        "elements": [
            {
                "type": "button",
                "action_id": "approve",
                "text": {"type": "plain_text", "text": "Approve"},
                "style": "primary",
                "value": "op_1:approve",
            },
            {
                "type": "button",
                "action_id": "reject",
                "text": {"type": "plain_text", "text": "Reject"},
                "style": "danger",
                "value": "op_1:reject",
            },
        ],
    },
]

REASON_MODAL = {
    "type": "modal",
    "callback_id": "reject_reason",
    "private_metadata": "op_1",
    "title": {"type": "plain_text", "text": "Reject"},
    "submit": {"type": "plain_text", "text": "Reject"},
    "blocks": [
        {
            "type": "input",
            "block_id": "reason",
            "label": {"type": "plain_text", "text": "Why?"},
            "element": {"type": "plain_text_input", "action_id": "text"},
        }
    ],
}


def client_for(fake: FakeSlack, **kwargs) -> WebClient:
    return WebClient(token=fake.bot_token, base_url=fake.url, **kwargs)


def refusal(call) -> SlackApiError:
    with pytest.raises(SlackApiError) as caught:
        call()
    return caught.value


def test_the_real_client_posts_then_updates_a_message_in_place(fake_slack):
    client = client_for(fake_slack)
    assert client.auth_test()["team_id"] == fake_slack.team_id

    first = client.chat_postMessage(channel="C0APPROVALS", text="Refund?", blocks=APPROVAL_BLOCKS)
    second = client.chat_postMessage(channel="C0APPROVALS", text="Another")
    assert first["ok"]
    assert first["channel"] == "C0APPROVALS"
    assert TS.match(first["ts"])
    assert float(second["ts"]) > float(first["ts"])
    assert first["message"]["text"] == "Refund?"
    assert first["message"]["bot_id"] == fake_slack.bot_id
    # Slack fills in the block ids a message's blocks lack, and keeps those given.
    assert first["message"]["blocks"][0]["block_id"]
    assert first["message"]["blocks"][1]["block_id"] == "decide"

    decided = [{"type": "section", "text": {"type": "mrkdwn", "text": "Approved by alice"}}]
    updated = client.chat_update(
        channel="C0APPROVALS", ts=first["ts"], text="Approved", blocks=decided
    )
    assert (updated["channel"], updated["ts"]) == ("C0APPROVALS", first["ts"])
    assert updated["message"]["edited"]["user"] == fake_slack.bot_user_id

    message = fake_slack.message("C0APPROVALS", first["ts"])
    assert message.text == "Approved"
    assert message.blocks[0]["text"]["text"] == "Approved by alice"
    assert [version["text"] for version in message.versions] == ["Refund?", "Approved"]
    assert list(fake_slack.messages["C0APPROVALS"]) == [first["ts"], second["ts"]]
    assert fake_slack.message("C0APPROVALS").ts == second["ts"]

    (call,) = fake_slack.calls_to("chat.update")
    assert call.token_ok
    assert call.status == 200
    assert call.fault is None
    assert call.content_type.startswith("application/json")
    assert call.args["blocks"] == decided
    assert "authorization" not in call.headers
    assert [c.method for c in fake_slack.calls] == [
        "auth.test",
        "chat.postMessage",
        "chat.postMessage",
        "chat.update",
    ]


def test_an_update_of_a_message_it_never_posted_is_refused(fake_slack):
    client = client_for(fake_slack)
    posted = client.chat_postMessage(channel="C0APPROVALS", text="Refund?")

    error = refusal(lambda: client.chat_update(channel="C0APPROVALS", ts="1.000001", text="x"))
    assert error.response["error"] == "message_not_found"
    elsewhere = refusal(lambda: client.chat_update(channel="C0OTHER", ts=posted["ts"], text="x"))
    assert elsewhere.response["error"] == "message_not_found"
    assert fake_slack.message("C0APPROVALS").versions == [{"text": "Refund?", "blocks": []}]


def test_a_form_body_is_read_as_slack_reads_it_with_blocks_as_json(fake_slack):
    client = client_for(fake_slack)
    answer = client.api_call(
        "chat.postMessage",
        params={"channel": "C0APPROVALS", "text": "Refund?", "blocks": json.dumps(APPROVAL_BLOCKS)},
    )
    (call,) = fake_slack.calls_to("chat.postMessage")
    assert call.content_type == "application/x-www-form-urlencoded"
    assert call.args["blocks"][1]["elements"][0]["value"] == "op_1:approve"
    assert fake_slack.message("C0APPROVALS", answer["ts"]).blocks[1]["block_id"] == "decide"

    malformed = refusal(
        lambda: client.api_call("chat.postMessage", params={"channel": "C1", "blocks": "[{"})
    )
    assert malformed.response["error"] == "invalid_blocks_format"


def test_a_wrong_or_missing_token_is_refused_and_changes_nothing(fake_slack):
    wrong = WebClient(token="xoxb-somebody-else", base_url=fake_slack.url)
    error = refusal(lambda: wrong.chat_postMessage(channel="C0APPROVALS", text="Refund?"))
    assert error.response["error"] == "invalid_auth"
    nobody = WebClient(base_url=fake_slack.url)
    assert refusal(lambda: nobody.auth_test()).response["error"] == "not_authed"

    assert [(c.method, c.token_ok) for c in fake_slack.calls] == [
        ("chat.postMessage", False),
        ("auth.test", False),
    ]
    assert fake_slack.messages == {}


def test_a_method_slack_does_not_have_is_unknown(fake_slack):
    error = refusal(lambda: client_for(fake_slack).api_call("chat.sendCarrierPigeon"))
    assert error.response["error"] == "unknown_method"


def test_a_modal_opens_once_with_a_trigger_id_it_issued_within_its_lifetime(fake_slack):
    client = client_for(fake_slack)
    trigger_id = fake_slack.new_trigger_id(user_id="U0ALICE")

    opened = client.views_open(trigger_id=trigger_id, view=REASON_MODAL)
    view = opened["view"]
    assert view["id"].startswith("V")
    assert view["root_view_id"] == view["id"]
    assert (view["callback_id"], view["private_metadata"]) == ("reject_reason", "op_1")
    assert view["state"] == {"values": {}}
    assert view["hash"]
    assert fake_slack.views[view["id"]]["blocks"][0]["element"]["action_id"] == "text"

    again = refusal(lambda: client.views_open(trigger_id=trigger_id, view=REASON_MODAL))
    assert again.response["error"] == "exchanged_trigger_id"
    made_up = refusal(lambda: client.views_open(trigger_id="1.2.abc", view=REASON_MODAL))
    assert made_up.response["error"] == "invalid_trigger_id"
    late = fake_slack.new_trigger_id()
    fake_slack.expire_trigger_id(late)
    expired = refusal(lambda: client.views_open(trigger_id=late, view=REASON_MODAL))
    assert expired.response["error"] == "expired_trigger_id"
    assert len(fake_slack.views) == 1


def test_a_trigger_id_expires_after_its_lifetime_by_the_clock():
    with FakeSlack(trigger_ttl_s=0.05) as fake:
        trigger_id = fake.new_trigger_id()
        time.sleep(0.1)
        error = refusal(
            lambda: client_for(fake).views_open(trigger_id=trigger_id, view=REASON_MODAL)
        )
    assert error.response["error"] == "expired_trigger_id"


def test_people_are_looked_up_and_written_to_in_their_direct_messages(fake_slack):
    fake_slack.add_user("U0ALICE", name="alice", real_name="Alice Liddell", email="a@example.com")
    fake_slack.add_user("U0BOB", name="bob", email="b@example.com", email_confirmed=False)
    client = client_for(fake_slack)

    alice = client.users_info(user="U0ALICE")["user"]
    assert (alice["id"], alice["team_id"], alice["name"]) == (
        "U0ALICE",
        fake_slack.team_id,
        "alice",
    )
    assert alice["real_name"] == "Alice Liddell"
    assert alice["profile"]["email"] == "a@example.com"
    assert (alice["deleted"], alice["is_bot"], alice["is_email_confirmed"]) == (False, False, True)
    assert client.users_info(user="U0BOB")["user"]["is_email_confirmed"] is False
    unknown = refusal(lambda: client.users_info(user="U0NOBODY"))
    assert unknown.response["error"] == "user_not_found"

    opened = client.conversations_open(users="U0ALICE")
    dm = opened["channel"]["id"]
    assert dm.startswith("D")
    assert "already_open" not in opened
    reopened = client.conversations_open(users=["U0ALICE"], return_im=True)
    assert reopened["channel"]["id"] == dm
    assert reopened["already_open"] is True
    assert reopened["channel"]["is_im"] is True
    assert reopened["channel"]["user"] == "U0ALICE"
    assert fake_slack.dm_channel("U0ALICE") == dm

    # A post to a person's id lands in the app's DM with them, whose id Slack answers.
    posted = client.chat_postMessage(channel="U0ALICE", text="Refund?")
    assert posted["channel"] == dm
    assert fake_slack.message(dm).text == "Refund?"
    nobody = refusal(lambda: client.chat_postMessage(channel="U0NOBODY", text="Refund?"))
    assert nobody.response["error"] == "channel_not_found"

    ephemeral = client.chat_postEphemeral(channel="C0APPROVALS", user="U0BOB", text="Not yours")
    assert TS.match(ephemeral["message_ts"])
    assert [(e.user, e.text) for e in fake_slack.ephemerals] == [("U0BOB", "Not yours")]


def test_what_slack_refuses_in_blocks_and_modals_is_refused(fake_slack):
    client = client_for(fake_slack)
    many = [{"type": "divider"}] * (MAX_MESSAGE_BLOCKS + 1)
    too_many = refusal(lambda: client.chat_postMessage(channel="C1", text="x", blocks=many))
    assert too_many.response["error"] == "invalid_blocks"
    big_value = [
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "action_id": "approve",
                    "text": {"type": "plain_text", "text": "Approve"},
                    "value": "v" * (MAX_BUTTON_VALUE_CHARS + 1),
                }
            ],
        }
    ]
    long_value = refusal(lambda: client.chat_postMessage(channel="C1", text="x", blocks=big_value))
    assert long_value.response["error"] == "invalid_blocks"
    twice = [{"type": "divider", "block_id": "same"}, {"type": "divider", "block_id": "same"}]
    repeated = refusal(lambda: client.chat_postMessage(channel="C1", text="x", blocks=twice))
    assert repeated.response["error"] == "invalid_blocks"
    empty = refusal(lambda: client.api_call("chat.postMessage", json={"channel": "C1"}))
    assert empty.response["error"] == "no_text"

    modal = {**REASON_MODAL, "private_metadata": "m" * (MAX_PRIVATE_METADATA_CHARS + 1)}
    trigger_id = fake_slack.new_trigger_id()
    big = refusal(lambda: client.views_open(trigger_id=trigger_id, view=modal))
    assert big.response["error"] == "invalid_arguments"
    # A refused modal leaves its trigger id unused, as nothing was opened.
    assert client.views_open(trigger_id=trigger_id, view=REASON_MODAL)["ok"]
    assert fake_slack.messages == {}


def test_a_rate_limit_answers_429_with_retry_after_and_posts_nothing(fake_slack):
    fake_slack.rate_limit("chat.postMessage", retry_after_s=7)
    client = client_for(fake_slack)

    error = refusal(lambda: client.chat_postMessage(channel="C0APPROVALS", text="Refund?"))
    assert error.response.status_code == 429
    assert error.response.headers["Retry-After"] == "7"
    assert error.response["error"] == "ratelimited"
    assert fake_slack.messages == {}
    # The fault was for one call: the next goes through.
    assert client.chat_postMessage(channel="C0APPROVALS", text="Refund?")["ok"]
    assert [c.fault for c in fake_slack.calls_to("chat.postMessage")] == ["rate_limited", None]


def test_slack_sdks_rate_limit_handler_waits_retry_after_and_goes_through(fake_slack):
    fake_slack.rate_limit("chat.postMessage", retry_after_s=0)
    client = client_for(fake_slack, retry_handlers=[RateLimitErrorRetryHandler(max_retry_count=1)])
    assert client.chat_postMessage(channel="C0APPROVALS", text="Refund?")["ok"]
    assert [c.status for c in fake_slack.calls_to("chat.postMessage")] == [429, 200]
    assert len(fake_slack.messages["C0APPROVALS"]) == 1


def test_an_error_and_a_server_error_fail_the_next_calls_and_change_nothing(fake_slack):
    fake_slack.fail("chat.update", error="cant_update_message", times=2)
    fake_slack.server_error("chat.postMessage")
    client = client_for(fake_slack)

    crashed = refusal(lambda: client.chat_postMessage(channel="C0APPROVALS", text="Refund?"))
    assert crashed.response.status_code == 500
    posted = client.chat_postMessage(channel="C0APPROVALS", text="Refund?")
    for _ in range(2):
        error = refusal(
            lambda: client.chat_update(channel="C0APPROVALS", ts=posted["ts"], text="x")
        )
        assert error.response.status_code == 200
        assert error.response["error"] == "cant_update_message"
    assert fake_slack.message("C0APPROVALS").text == "Refund?"
    assert client.chat_update(channel="C0APPROVALS", ts=posted["ts"], text="Approved")["ok"]


def test_a_slow_answer_comes_late_but_the_post_happened_at_once(fake_slack):
    fake_slack.slow("chat.postMessage", seconds=0.5)
    client = client_for(fake_slack)

    started = time.monotonic()
    answer = client.chat_postMessage(channel="C0APPROVALS", text="Refund?")
    assert time.monotonic() - started >= 0.5
    assert fake_slack.calls_to("chat.postMessage")[0].fault == "slow"
    assert fake_slack.message("C0APPROVALS").ts == answer["ts"]


def test_a_post_that_timed_out_for_the_client_was_posted_once_all_the_same(fake_slack):
    # The outcome Effectgate must not take for a failure: the client saw a timeout (which
    # slack_sdk's default retry handler does not send again), and the message is there.
    fake_slack.slow("chat.postMessage", seconds=0.6)
    client = client_for(fake_slack, timeout=0.2)
    with pytest.raises(TimeoutError):
        client.chat_postMessage(channel="C0APPROVALS", text="Refund?")
    (call,) = fake_slack.wait_for("chat.postMessage")
    assert call.fault == "slow"
    assert call.response["ok"]
    assert fake_slack.message("C0APPROVALS").ts == call.response["ts"]
    time.sleep(0.5)
    assert len(fake_slack.calls_to("chat.postMessage")) == 1


def test_waiting_for_a_call_from_another_thread(fake_slack):
    client = client_for(fake_slack)

    def later() -> None:
        time.sleep(0.1)
        client.chat_postMessage(channel="C0APPROVALS", text="Refund?")

    thread = threading.Thread(target=later)
    thread.start()
    (call,) = fake_slack.wait_for("chat.postMessage", timeout=5)
    thread.join()
    assert call.args["text"] == "Refund?"
    with pytest.raises(AssertionError, match=r"1 of 2 calls to chat.postMessage"):
        fake_slack.wait_for("chat.postMessage", count=2, timeout=0.1)


def test_slack_sdks_verifier_accepts_a_signed_interaction_and_refuses_forged_or_old_ones(
    fake_slack,
):
    verifier = SignatureVerifier(SIGNING_SECRET)
    payload = {"type": "block_actions", "actions": [{"value": "op_1:approve ünïcode"}]}

    body, headers = fake_slack.interaction_request(payload, signing_secret=SIGNING_SECRET)
    assert headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert verifier.is_valid_request(body, headers)
    assert json.loads(parse_qs(body.decode())["payload"][0]) == payload
    assert "X-Slack-Retry-Num" not in headers

    forged_body, forged = fake_slack.interaction_request(payload, forge_signature=True)
    assert not verifier.is_valid_request(forged_body, forged)
    old_body, old = fake_slack.interaction_request(payload, age_s=6 * 60)
    assert not verifier.is_valid_request(old_body, old)
    # The signature covers the body: the same headers on another body do not verify.
    assert not verifier.is_valid_request(body.replace(b"approve", b"reject_"), headers)
    assert not SignatureVerifier("another app's secret").is_valid_request(body, headers)

    at = int(time.time()) - 30
    _, fixed = fake_slack.interaction_request(payload, timestamp=at, retry_num=1)
    assert fixed["X-Slack-Request-Timestamp"] == str(at)
    assert (fixed["X-Slack-Retry-Num"], fixed["X-Slack-Retry-Reason"]) == ("1", "http_timeout")


def test_a_sent_interaction_is_signed_and_its_answer_timed():
    receiver = Receiver(status=200, body=b"", delay=0.2)
    try:
        with FakeSlack() as fake:
            answer = fake.send_interaction(receiver.url, {"type": "block_actions"}, retry_num=2)
    finally:
        receiver.close()
    (request,) = receiver.requests
    assert SignatureVerifier(SIGNING_SECRET).is_valid_request(request.body, request.headers)
    assert request.headers["x-slack-retry-num"] == "2"
    assert request.headers["user-agent"].startswith("Slackbot")
    assert answer.status_code == 200
    assert 0.2 <= answer.elapsed_s < 3
    assert answer.in_time


def test_a_click_on_a_posted_button_and_the_modal_it_opens_have_slacks_shapes(fake_slack):
    fake_slack.add_user("U0ALICE", name="alice")
    client = client_for(fake_slack)
    posted = client.chat_postMessage(channel="C0APPROVALS", text="Refund?", blocks=APPROVAL_BLOCKS)

    click = fake_slack.block_actions(
        user_id="U0ALICE", action_id="reject", channel="C0APPROVALS", message_ts=posted["ts"]
    )
    assert click["type"] == "block_actions"
    assert click["user"] == {
        "id": "U0ALICE",
        "username": "alice",
        "name": "alice",
        "team_id": fake_slack.team_id,
    }
    assert click["team"] == {"id": fake_slack.team_id, "domain": fake_slack.team_domain}
    assert click["api_app_id"] == fake_slack.api_app_id
    assert click["token"]
    assert click["container"] == {
        "type": "message",
        "message_ts": posted["ts"],
        "channel_id": "C0APPROVALS",
        "is_ephemeral": False,
    }
    assert click["channel"]["id"] == "C0APPROVALS"
    assert click["message"]["ts"] == posted["ts"]
    assert click["message"]["blocks"] == posted["message"]["blocks"]
    (action,) = click["actions"]
    assert (action["action_id"], action["block_id"], action["value"]) == (
        "reject",
        "decide",
        "op_1:reject",
    )
    assert action["type"] == "button"
    assert action["style"] == "danger"
    assert action["action_ts"]

    # Its trigger id opens the reason modal; the submission echoes what was opened.
    view = client.views_open(trigger_id=click["trigger_id"], view=REASON_MODAL)["view"]
    submitted = fake_slack.view_submission(
        user_id="U0ALICE", callback_id="reject_reason", values={"reason": {"text": "Wrong amount"}}
    )
    assert submitted["type"] == "view_submission"
    assert submitted["user"]["id"] == "U0ALICE"
    assert submitted["team"]["id"] == fake_slack.team_id
    assert submitted["view"]["id"] == view["id"]
    assert submitted["view"]["hash"] == view["hash"]
    assert submitted["view"]["private_metadata"] == "op_1"
    assert submitted["view"]["state"]["values"] == {
        "reason": {"text": {"type": "plain_text_input", "value": "Wrong amount"}}
    }
    forged = fake_slack.view_submission(
        user_id="U0ALICE",
        callback_id="reject_reason",
        private_metadata="op_2",
        values={"reason": {"text": "x"}},
    )
    assert forged["view"]["private_metadata"] == "op_2"
    # A forged click carries the value it is given, whatever the button held.
    tampered = fake_slack.block_actions(
        user_id="U0ALICE",
        action_id="approve",
        channel="C0APPROVALS",
        message_ts=posted["ts"],
        value="op_9:approve",
    )
    assert tampered["actions"][0]["value"] == "op_9:approve"


def test_a_response_url_replaces_the_message_or_answers_the_person_and_is_recorded(fake_slack):
    client = client_for(fake_slack)
    posted = client.chat_postMessage(channel="C0APPROVALS", text="Refund?", blocks=APPROVAL_BLOCKS)
    click = fake_slack.block_actions(
        user_id="U0ALICE", action_id="approve", channel="C0APPROVALS", message_ts=posted["ts"]
    )
    assert click["response_url"].startswith(fake_slack.base_url + "/actions/")

    webhook = WebhookClient(click["response_url"])
    assert webhook.send(text="Only you see this").status_code == 200
    replaced = webhook.send(text="Approved by alice", blocks=[], replace_original=True)
    assert (replaced.status_code, replaced.body) == (200, "ok")

    message = fake_slack.message("C0APPROVALS", posted["ts"])
    assert (message.text, message.blocks) == ("Approved by alice", [])
    assert [(e.user, e.text) for e in fake_slack.ephemerals] == [("U0ALICE", "Only you see this")]
    calls = fake_slack.calls_to("response_url")
    assert [c.args.get("replace_original") for c in calls] == [None, True]
    assert all(c.token_ok for c in calls)
    unknown = WebhookClient(fake_slack.base_url + "/actions/T1/1/made-up").send(text="x")
    assert unknown.status_code == 404
