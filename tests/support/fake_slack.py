"""A fake Slack on loopback for the Slack approval tests.

It answers the Web API methods Effectgate calls, as ``slack_sdk``'s ``WebClient`` sends
them (JSON or form bodies, the bot token as ``Authorization: Bearer``), records every
call, fails on demand (rate limits, errors, 500s, slow answers) and builds interaction
payloads in Slack's shapes, signed as Slack signs them. It keeps what Slack keeps: the
messages as posted and updated, the trigger ids it issued (valid 3 s, once), the modals
opened, the direct-message channels of the people a test registered.

    with FakeSlack() as slack:
        client = WebClient(token=slack.bot_token, base_url=slack.url)
        client.chat_postMessage(channel="C0APPROVALS", text="Refund?", blocks=[...])
        payload = slack.block_actions(user_id="U0ALICE", action_id="approve", ...)
        answer = slack.send_interaction(live_server_url + "/integrations/slack/interactions",
                                        payload)
"""

import copy
import hashlib
import hmac
import itertools
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx

BOT_TOKEN = "xoxb-0000000000-fake-bot-token"
SIGNING_SECRET = "a fake Slack app's signing secret, nothing else"
# The deprecated verification token that Slack still puts in every payload; Effectgate
# must not rely on it (the signature is the check), so it is a dummy.
VERIFICATION_TOKEN = "fake-deprecated-verification-token"
TEAM_ID = "T0EGTEST01"
TEAM_DOMAIN = "effectgate-test"
API_APP_ID = "A0EGTEST01"
BOT_USER_ID = "U0EGBOT001"
BOT_ID = "B0EGBOT001"
# Slack shows the person an error when the app has not answered an interaction in 3 s,
# and a trigger id can open a modal only within 3 s of the interaction that issued it.
ANSWER_DEADLINE_S = 3.0
TRIGGER_TTL_S = 3.0
# Slack refuses a request older than 5 minutes (and its SDK's verifier does too).
SIGNATURE_MAX_AGE_S = 5 * 60
SLACKBOT_USER_AGENT = "Slackbot 1.0 (+https://api.slack.com/robots)"

# Slack's limits on what Effectgate sends (Block Kit reference, chat.postMessage,
# views.open): hitting one in production is an error, so the fake refuses too.
MAX_BODY_BYTES = 1 << 20
MAX_MESSAGE_BLOCKS = 50
MAX_MODAL_BLOCKS = 100
MAX_ID_CHARS = 255  # block_id, action_id, callback_id
MAX_BUTTON_VALUE_CHARS = 2000
MAX_PRIVATE_METADATA_CHARS = 3000
MAX_TEXT_CHARS = 40000
# Arguments that a form body carries as JSON strings; a JSON body carries them as JSON.
JSON_ARGUMENTS = ("blocks", "attachments", "view", "metadata")


class SlackRefusal(Exception):
    """What a Web API method answers as ``{"ok": false, "error": ...}``."""

    def __init__(self, error: str, detail: str = "") -> None:
        super().__init__(error)
        self.error = error
        self.detail = detail

    def answer(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": False, "error": self.error}
        if self.detail:
            body["response_metadata"] = {"messages": [f"[ERROR] {self.detail}"]}
        return body


@dataclass(frozen=True)
class Call:
    """One request the fake received: a Web API method, or ``"response_url"``."""

    method: str
    # The bearer token was the bot token (for a response URL: the URL was one it issued).
    token_ok: bool
    # The arguments, from the query string and the body, JSON arguments decoded.
    args: dict[str, Any]
    content_type: str
    # The request's headers, lower-cased, without Authorization.
    headers: dict[str, str]
    status: int
    response: dict[str, Any] | str
    # The fault it was answered with: "rate_limited", "error", "server_error", "slow".
    fault: str | None
    # time.monotonic() when it arrived.
    at: float


@dataclass
class Message:
    """A message in a channel as Slack holds it now; ``versions`` has each text and
    blocks it was posted or updated with, oldest first."""

    channel: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    thread_ts: str | None = None
    edited_ts: str | None = None
    versions: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Ephemeral:
    """A message only ``user`` sees (chat.postEphemeral, or a response URL's default)."""

    channel: str
    user: str
    ts: str
    text: str
    blocks: list[dict[str, Any]]


@dataclass
class User:
    id: str
    name: str
    real_name: str
    email: str | None
    email_confirmed: bool
    deleted: bool
    is_bot: bool
    team_id: str

    def payload(self) -> dict[str, Any]:
        """The ``user`` object of users.info."""
        profile: dict[str, Any] = {
            "real_name": self.real_name,
            "real_name_normalized": self.real_name,
            "display_name": self.name,
            "display_name_normalized": self.name,
            "team": self.team_id,
        }
        if self.email is not None:
            profile["email"] = self.email
        return {
            "id": self.id,
            "team_id": self.team_id,
            "name": self.name,
            "deleted": self.deleted,
            "real_name": self.real_name,
            "profile": profile,
            "is_admin": False,
            "is_owner": False,
            "is_primary_owner": False,
            "is_restricted": False,
            "is_ultra_restricted": False,
            "is_bot": self.is_bot,
            "is_app_user": False,
            "updated": 1700000000,
            "is_email_confirmed": self.email_confirmed,
        }


@dataclass(frozen=True)
class InteractionAnswer:
    """What the app answered to an interaction, and how long it took."""

    status_code: int
    headers: dict[str, str]
    body: bytes
    elapsed_s: float

    @property
    def in_time(self) -> bool:
        """Slack would have accepted it: answered before its 3 s deadline."""
        return self.elapsed_s < ANSWER_DEADLINE_S

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class _Fault:
    kind: str
    status: int = 200
    error: str = ""
    retry_after_s: int = 0
    delay_s: float = 0.0


@dataclass
class _Trigger:
    user_id: str | None
    expires_at: float
    used: bool = False


@dataclass(frozen=True)
class _ResponseUrl:
    channel: str
    message_ts: str
    user_id: str


def slack_signature(body: bytes, *, signing_secret: str, timestamp: int | str) -> str:
    """Slack's request signature: ``v0=`` and the hex HMAC-SHA256, keyed by the app's
    signing secret, of ``v0:{timestamp}:{body}``."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return "v0=" + hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()


def _form_or_json_value(name: str, value: Any) -> Any:
    if name in JSON_ARGUMENTS and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as error:
            code = "invalid_blocks_format" if name == "blocks" else "invalid_arguments"
            raise SlackRefusal(code, f"{name} is not JSON") from error
    return value


def _truthy(value: Any) -> bool:
    return value in (True, 1, "1", "true")


def _check_blocks(blocks: Any, *, limit: int, code: str) -> list[dict[str, Any]]:
    """Refuse what Slack refuses in a surface's blocks; return them with the block ids
    and action ids Slack fills in where a block or an element has none."""
    if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
        raise SlackRefusal(code, "blocks must be an array of objects")
    if len(blocks) > limit:
        raise SlackRefusal(code, f"no more than {limit} items allowed [json-pointer:/blocks]")
    filled = copy.deepcopy(blocks)
    seen: set[str] = set()
    for index, block in enumerate(filled):
        if not isinstance(block.get("type"), str):
            raise SlackRefusal(code, f"missing required field: type [json-pointer:/blocks/{index}]")
        block_id = block.setdefault("block_id", secrets.token_urlsafe(3))
        if not isinstance(block_id, str) or len(block_id) > MAX_ID_CHARS or block_id in seen:
            raise SlackRefusal(code, f"invalid or repeated block_id [json-pointer:/blocks/{index}]")
        seen.add(block_id)
        elements = list(block.get("elements") or []) if block["type"] == "actions" else []
        for key in ("accessory", "element"):
            if isinstance(block.get(key), dict):
                elements.append(block[key])
        for element in elements:
            action_id = element.setdefault("action_id", secrets.token_urlsafe(3))
            if not isinstance(action_id, str) or len(action_id) > MAX_ID_CHARS:
                raise SlackRefusal(code, f"invalid action_id [json-pointer:/blocks/{index}]")
            if len(str(element.get("value", ""))) > MAX_BUTTON_VALUE_CHARS:
                raise SlackRefusal(
                    code, f"must be less than {MAX_BUTTON_VALUE_CHARS} characters (value)"
                )
    return filled


def _find_action(blocks: list[dict[str, Any]], action_id: str) -> tuple[str, dict[str, Any]]:
    """The block id and the element of ``action_id`` in a message's blocks."""
    for block in blocks:
        candidates = list(block.get("elements") or []) if block.get("type") == "actions" else []
        if isinstance(block.get("accessory"), dict):
            candidates.append(block["accessory"])
        for element in candidates:
            if isinstance(element, dict) and element.get("action_id") == action_id:
                return block.get("block_id", ""), element
    return "", {}


class FakeSlack:
    """Slack's Web API at ``url`` (``http://127.0.0.1:PORT/api/``, as ``WebClient``'s
    ``base_url``) and its response URLs, on an ephemeral port, until ``close()``."""

    def __init__(
        self,
        *,
        bot_token: str = BOT_TOKEN,
        signing_secret: str = SIGNING_SECRET,
        team_id: str = TEAM_ID,
        team_domain: str = TEAM_DOMAIN,
        trigger_ttl_s: float = TRIGGER_TTL_S,
    ) -> None:
        self.bot_token = bot_token
        self.signing_secret = signing_secret
        self.team_id = team_id
        self.team_domain = team_domain
        self.api_app_id = API_APP_ID
        self.bot_user_id = BOT_USER_ID
        self.bot_id = BOT_ID
        self.trigger_ttl_s = trigger_ttl_s
        # The server's threads and the test's thread share everything below: every read
        # and write holds the lock, and waiting for calls uses its condition.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._calls: list[Call] = []
        self._faults: dict[str, deque[_Fault]] = {}
        self._messages: dict[str, dict[str, Message]] = {}
        self._ephemerals: list[Ephemeral] = []
        self._views: dict[str, dict[str, Any]] = {}
        self._users: dict[str, User] = {}
        self._dms: dict[str, str] = {}
        self._triggers: dict[str, _Trigger] = {}
        self._response_urls: dict[str, _ResponseUrl] = {}
        self._serial = itertools.count(1)
        self._methods: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._chat_post_message,
            "chat.update": self._chat_update,
            "chat.postEphemeral": self._chat_post_ephemeral,
            "views.open": self._views_open,
            "users.info": self._users_info,
            "conversations.open": self._conversations_open,
        }
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                fake._serve(self)

            def do_GET(self) -> None:
                fake._serve(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        # shutdown() waits until serve_forever notices, which it checks every
        # poll_interval (half a second by default): that would be each test's teardown.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    # Lifecycle and configuration.

    def __enter__(self) -> "FakeSlack":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """The Web API's base URL, as ``WebClient(base_url=...)`` takes it."""
        return f"{self.base_url}/api/"

    def settings(self) -> dict[str, Any]:
        """Effectgate's Slack settings for this fake (for ``override_settings``)."""
        return {
            "SLACK_API_URL": self.url,
            "SLACK_BOT_TOKEN": self.bot_token,
            "SLACK_SIGNING_SECRET": self.signing_secret,
        }

    def add_user(
        self,
        user_id: str,
        *,
        name: str | None = None,
        real_name: str | None = None,
        email: str | None = None,
        email_confirmed: bool = True,
        deleted: bool = False,
        is_bot: bool = False,
        team_id: str | None = None,
    ) -> User:
        """A person of the workspace, for users.info, conversations.open and posts to
        ``user_id``."""
        user = User(
            id=user_id,
            name=name or user_id.lower(),
            real_name=real_name or (name or user_id.lower()).title(),
            email=email,
            email_confirmed=email_confirmed,
            deleted=deleted,
            is_bot=is_bot,
            team_id=team_id or self.team_id,
        )
        with self._lock:
            self._users[user_id] = user
        return user

    def dm_channel(self, user_id: str) -> str:
        """The id of the app's direct-message channel with ``user_id`` (opened if need be)."""
        with self._lock:
            return self._dm_locked(user_id)[0]

    # Faults: each call to ``method`` takes the next one queued for it, if any.

    def rate_limit(self, method: str, *, times: int = 1, retry_after_s: int = 1) -> None:
        """The next ``times`` calls answer 429 with ``Retry-After`` and change nothing."""
        self._queue(method, times, _Fault("rate_limited", 429, "ratelimited", retry_after_s))

    def fail(self, method: str, *, error: str, times: int = 1) -> None:
        """The next ``times`` calls answer ``{"ok": false, "error": error}`` (HTTP 200, as
        Slack answers errors) and change nothing."""
        self._queue(method, times, _Fault("error", 200, error))

    def server_error(self, method: str, *, times: int = 1, status: int = 500) -> None:
        """The next ``times`` calls answer ``status`` and change nothing."""
        self._queue(method, times, _Fault("server_error", status, "fatal_error"))

    def slow(self, method: str, *, seconds: float, times: int = 1) -> None:
        """The next ``times`` calls take effect at once but answer after ``seconds``: a
        client that gives up earlier never learns that its message was posted."""
        self._queue(method, times, _Fault("slow", delay_s=seconds))

    def _queue(self, method: str, times: int, fault: _Fault) -> None:
        with self._lock:
            queue = self._faults.setdefault(method, deque())
            queue.extend(copy.copy(fault) for _ in range(times))

    # What the fake holds, as snapshots the server's threads no longer change.

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._calls)

    def calls_to(self, method: str) -> list[Call]:
        with self._lock:
            return [call for call in self._calls if call.method == method]

    def wait_for(self, method: str, count: int = 1, timeout: float = 5.0) -> list[Call]:
        """The calls to ``method`` once there are at least ``count`` (for senders that
        call Slack from another thread or process); fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                calls = [call for call in self._calls if call.method == method]
                remaining = deadline - time.monotonic()
                if len(calls) >= count or remaining <= 0:
                    break
                self._changed.wait(remaining)
            seen = [call.method for call in self._calls]
        assert len(calls) >= count, (
            f"{len(calls)} of {count} calls to {method} after {timeout} s; calls: {seen}"
        )
        return calls

    @property
    def messages(self) -> dict[str, dict[str, Message]]:
        """Channel id to ``{ts: Message}``, in the order they were posted."""
        with self._lock:
            return copy.deepcopy(self._messages)

    def message(self, channel: str, ts: str | None = None) -> Message:
        """The message ``ts`` of ``channel``, or its latest."""
        with self._lock:
            posted = self._messages.get(channel, {})
            assert posted, f"no message in {channel}; channels: {sorted(self._messages)}"
            key = ts if ts is not None else next(reversed(posted))
            assert key in posted, f"no message {key} in {channel}; there are {list(posted)}"
            return copy.deepcopy(posted[key])

    @property
    def ephemerals(self) -> list[Ephemeral]:
        with self._lock:
            return list(self._ephemerals)

    @property
    def views(self) -> dict[str, dict[str, Any]]:
        """View id to the modal as views.open answered it."""
        with self._lock:
            return copy.deepcopy(self._views)

    # Triggers.

    def new_trigger_id(self, *, user_id: str | None = None) -> str:
        """A trigger id that views.open accepts once, within ``trigger_ttl_s``."""
        trigger_id = (
            f"{int(time.time())}{next(self._serial):03d}.{secrets.randbelow(10**13):013d}."
            f"{secrets.token_hex(16)}"
        )
        with self._lock:
            self._triggers[trigger_id] = _Trigger(
                user_id=user_id, expires_at=time.monotonic() + self.trigger_ttl_s
            )
        return trigger_id

    def expire_trigger_id(self, trigger_id: str) -> None:
        """Let ``trigger_id``'s 3 s pass now."""
        with self._lock:
            self._triggers[trigger_id].expires_at = time.monotonic() - 1

    # Interactions, as Slack sends them to the app's request URL.

    def block_actions(
        self,
        *,
        user_id: str,
        action_id: str,
        channel: str,
        message_ts: str,
        value: str | None = None,
        team_id: str | None = None,
        trigger_id: str | None = None,
        block_id: str | None = None,
        channel_name: str | None = None,
    ) -> dict[str, Any]:
        """The ``block_actions`` payload of ``user_id`` clicking the button
        ``action_id`` of the message ``message_ts`` in ``channel``. The block id, the
        button's text and value come from the message the fake holds; ``value`` or
        ``block_id`` given replace them (a forged click). A new trigger id is issued
        unless one is given; the response URL points at the fake."""
        team = team_id or self.team_id
        with self._lock:
            held = self._messages.get(channel, {}).get(message_ts)
            message = (
                self._message_payload(held)
                if held
                else {"type": "message", "ts": message_ts, "text": "", "blocks": []}
            )
        found_block_id, element = _find_action(message["blocks"], action_id)
        action: dict[str, Any] = {
            "action_id": action_id,
            "block_id": block_id or found_block_id or secrets.token_urlsafe(3),
            "text": element.get("text", {"type": "plain_text", "text": action_id}),
            "type": element.get("type", "button"),
            "action_ts": self._now_ts(),
        }
        chosen = value if value is not None else element.get("value")
        if chosen is not None:
            action["value"] = chosen
        if "style" in element:
            action["style"] = element["style"]
        return {
            "type": "block_actions",
            "user": self._user_ref(user_id, team),
            "api_app_id": self.api_app_id,
            "token": VERIFICATION_TOKEN,
            "container": {
                "type": "message",
                "message_ts": message_ts,
                "channel_id": channel,
                "is_ephemeral": False,
            },
            "trigger_id": trigger_id or self.new_trigger_id(user_id=user_id),
            "team": {"id": team, "domain": self.team_domain},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": channel, "name": channel_name or self._channel_name(channel)},
            "message": message,
            "state": {"values": {}},
            "response_url": self._new_response_url(channel, message_ts, user_id),
            "actions": [action],
        }

    def view_submission(
        self,
        *,
        user_id: str,
        values: dict[str, dict[str, Any]],
        callback_id: str | None = None,
        private_metadata: str | None = None,
        team_id: str | None = None,
        view_id: str | None = None,
    ) -> dict[str, Any]:
        """The ``view_submission`` payload of ``user_id`` submitting a modal with
        ``values`` (``{block_id: {action_id: text}}``; a text becomes a plain-text
        input's state, a dict is taken as the element's state). The modal is ``view_id``,
        else the latest the fake opened with ``callback_id`` (any, without one); its
        callback id and private metadata are Slack's echo of what was opened unless given
        (a forged submission). Without an opened modal, one is made up."""
        team = team_id or self.team_id
        with self._lock:
            opened = [
                view
                for view in self._views.values()
                if (view_id is None or view["id"] == view_id)
                and (callback_id is None or view["callback_id"] == callback_id)
            ]
            view = copy.deepcopy(opened[-1]) if opened else None
        if view is None:
            new_id = view_id or self._view_id()
            view = {
                "id": new_id,
                "team_id": team,
                "type": "modal",
                "blocks": [],
                "private_metadata": "",
                "callback_id": "",
                "hash": self._view_hash(),
                "title": {"type": "plain_text", "text": "Modal"},
                "clear_on_close": False,
                "notify_on_close": False,
                "root_view_id": new_id,
                "previous_view_id": None,
                "app_id": self.api_app_id,
                "external_id": "",
                "app_installed_team_id": team,
                "bot_id": self.bot_id,
            }
        if callback_id is not None:
            view["callback_id"] = callback_id
        if private_metadata is not None:
            view["private_metadata"] = private_metadata
        view["state"] = {
            "values": {
                block: {
                    action: state
                    if isinstance(state, dict)
                    else {"type": "plain_text_input", "value": state}
                    for action, state in actions.items()
                }
                for block, actions in values.items()
            }
        }
        return {
            "type": "view_submission",
            "team": {"id": team, "domain": self.team_domain},
            "user": self._user_ref(user_id, team),
            "api_app_id": self.api_app_id,
            "token": VERIFICATION_TOKEN,
            "trigger_id": self.new_trigger_id(user_id=user_id),
            "view": view,
            "response_urls": [],
            "is_enterprise_install": False,
            "enterprise": None,
        }

    def interaction_request(
        self,
        payload: dict[str, Any],
        *,
        signing_secret: str | None = None,
        timestamp: int | None = None,
        age_s: float = 0,
        forge_signature: bool = False,
        retry_num: int | None = None,
        retry_reason: str = "http_timeout",
    ) -> tuple[bytes, dict[str, str]]:
        """The body and headers of Slack's POST of ``payload``: a form body
        ``payload=<JSON>``, signed with ``signing_secret`` (the fake's own by default)
        at ``timestamp`` (now less ``age_s`` by default: ``age_s=600`` is a replay too
        old to accept). ``forge_signature`` signs with another secret. ``retry_num``
        adds the headers Slack sets when it sends a request again."""
        body = urlencode(
            {"payload": json.dumps(payload, separators=(",", ":"), ensure_ascii=False)}
        ).encode()
        stamp = timestamp if timestamp is not None else int(time.time() - age_s)
        secret = signing_secret if signing_secret is not None else self.signing_secret
        if forge_signature:
            secret = "not " + secret
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "User-Agent": SLACKBOT_USER_AGENT,
            "X-Slack-Request-Timestamp": str(stamp),
            "X-Slack-Signature": slack_signature(body, signing_secret=secret, timestamp=stamp),
        }
        if retry_num is not None:
            headers["X-Slack-Retry-Num"] = str(retry_num)
            headers["X-Slack-Retry-Reason"] = retry_reason
        return body, headers

    def send_interaction(
        self,
        url: str,
        payload: dict[str, Any],
        *,
        timeout: float = 10.0,
        **signing: Any,
    ) -> InteractionAnswer:
        """POST ``payload`` to the app at ``url`` as Slack does (``signing`` as for
        ``interaction_request``), timing the answer: it counts for Slack only within
        ``ANSWER_DEADLINE_S`` (``answer.in_time``); ``timeout`` is longer, so that a late
        answer is measured rather than lost."""
        body, headers = self.interaction_request(payload, **signing)
        with httpx.Client(timeout=timeout, follow_redirects=False) as client:
            started = time.perf_counter()
            response = client.post(url, content=body, headers=headers)
            elapsed = time.perf_counter() - started
        return InteractionAnswer(
            status_code=response.status_code,
            headers=dict(response.headers),
            body=response.content,
            elapsed_s=elapsed,
        )

    # The HTTP side.

    def _serve(self, handler: BaseHTTPRequestHandler) -> None:
        arrived = time.monotonic()
        target = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._write(handler, 413, "request_too_large", {})
            return
        body = handler.rfile.read(length) if length else b""
        content_type = handler.headers.get("Content-Type", "")
        headers = {k.lower(): v for k, v in handler.headers.items() if k.lower() != "authorization"}
        if target.path.startswith("/api/"):
            method = target.path.removeprefix("/api/")
            authorization = handler.headers.get("Authorization", "")
            token = authorization[7:] if authorization.startswith("Bearer ") else None
            token_ok = token is not None and hmac.compare_digest(token, self.bot_token)
            try:
                args = self._arguments(target.query, body, content_type)
                refusal = None
            except SlackRefusal as error:
                args, refusal = {}, error
            status, answer, fault = self._api(method, token, token_ok, args, refusal)
        elif target.path.startswith("/actions/"):
            method, token_ok = "response_url", False
            try:
                args = json.loads(body or b"{}")
                if not isinstance(args, dict):
                    raise ValueError("not an object")
            except ValueError:
                args = {"raw": body.decode("utf-8", "replace")}
                status, answer, fault = 400, "invalid_payload", None
            else:
                status, answer, fault, token_ok = self._response_url(target.path, args)
        else:
            self._write(handler, 404, "not_found", {})
            return
        extra = {}
        if fault and fault.kind == "rate_limited":
            extra["Retry-After"] = str(fault.retry_after_s)
        with self._changed:
            self._calls.append(
                Call(
                    method=method,
                    token_ok=token_ok,
                    args=args,
                    content_type=content_type,
                    headers=headers,
                    status=status,
                    response=answer,
                    fault=fault.kind if fault else None,
                    at=arrived,
                )
            )
            self._changed.notify_all()
        if fault and fault.delay_s:
            time.sleep(fault.delay_s)
        self._write(handler, status, answer, extra)

    @staticmethod
    def _write(
        handler: BaseHTTPRequestHandler,
        status: int,
        answer: dict[str, Any] | str,
        headers: dict[str, str],
    ) -> None:
        if isinstance(answer, dict):
            data, kind = json.dumps(answer).encode(), "application/json; charset=utf-8"
        else:
            data, kind = answer.encode(), "text/html"
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", kind)
            handler.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up waiting (a slow answer past its timeout): as with
            # Slack, what the call did stays done.
            pass

    @staticmethod
    def _arguments(query: str, body: bytes, content_type: str) -> dict[str, Any]:
        args: dict[str, Any] = dict(parse_qsl(query, keep_blank_values=True))
        if body and content_type.startswith("application/json"):
            try:
                document = json.loads(body)
            except ValueError as error:
                raise SlackRefusal("invalid_json") from error
            if not isinstance(document, dict):
                raise SlackRefusal("invalid_json")
            args.update(document)
        elif body:
            args.update(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        return {name: _form_or_json_value(name, value) for name, value in args.items()}

    def _api(
        self,
        method: str,
        token: str | None,
        token_ok: bool,
        args: dict[str, Any],
        refusal: SlackRefusal | None,
    ) -> tuple[int, dict[str, Any], _Fault | None]:
        if method not in self._methods:
            return 200, {"ok": False, "error": "unknown_method", "req_method": method}, None
        if token is None:
            return 200, {"ok": False, "error": "not_authed"}, None
        if not token_ok:
            return 200, {"ok": False, "error": "invalid_auth"}, None
        with self._lock:
            queue = self._faults.get(method)
            fault = queue.popleft() if queue else None
            if fault and fault.kind != "slow":
                return fault.status, {"ok": False, "error": fault.error}, fault
            if refusal is not None:
                return 200, refusal.answer(), fault
            # A method changes what the fake holds whole or not at all: the lock is held
            # throughout, and a refusal is raised before any change.
            try:
                return 200, self._methods[method](args), fault
            except SlackRefusal as error:
                return 200, error.answer(), fault

    def _response_url(
        self, path: str, args: dict[str, Any]
    ) -> tuple[int, str, _Fault | None, bool]:
        with self._lock:
            queue = self._faults.get("response_url")
            fault = queue.popleft() if queue else None
            hook = self._response_urls.get(path)
            if hook is None:
                return 404, "no_service", fault, False
            if fault and fault.kind != "slow":
                return fault.status, fault.error, fault, True
            try:
                self._respond(hook, args)
            except SlackRefusal as error:
                return 400, error.error, fault, True
            return 200, "ok", fault, True

    def _respond(self, hook: _ResponseUrl, args: dict[str, Any]) -> None:
        """What a post to a response URL does: replace or delete the message the
        interaction came from, or post a new one to the channel or to the person."""
        message = self._messages.get(hook.channel, {}).get(hook.message_ts)
        if _truthy(args.get("delete_original")):
            if message is not None:
                del self._messages[hook.channel][hook.message_ts]
        elif _truthy(args.get("replace_original")):
            if message is None:
                raise SlackRefusal("message_not_found")
            self._edit(message, args)
        else:
            text, blocks = self._content(args, require=True)
            if args.get("response_type") == "in_channel":
                self._post(hook.channel, text, blocks, args.get("thread_ts"))
            else:
                self._ephemerals.append(
                    Ephemeral(hook.channel, hook.user_id, self._next_ts(), text, blocks)
                )

    # The Web API methods; each runs with the lock held.

    def _auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "ok": True,
            "url": f"https://{self.team_domain}.slack.com/",
            "team": "Effectgate Test",
            "user": "effectgate",
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _chat_post_message(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args.get("channel"))
        text, blocks = self._content(args, require=True)
        message = self._post(channel, text, blocks, args.get("thread_ts"))
        return {
            "ok": True,
            "channel": channel,
            "ts": message.ts,
            "message": self._message_payload(message),
        }

    def _chat_update(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = args.get("channel")
        if not channel:
            raise SlackRefusal("channel_not_found")
        message = self._messages.get(channel, {}).get(str(args.get("ts", "")))
        if message is None:
            raise SlackRefusal("message_not_found")
        self._edit(message, args)
        return {
            "ok": True,
            "channel": channel,
            "ts": message.ts,
            "text": message.text,
            "message": self._message_payload(message),
        }

    def _chat_post_ephemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        channel = self._channel(args.get("channel"))
        user = args.get("user")
        if not user:
            raise SlackRefusal("user_not_in_channel")
        text, blocks = self._content(args, require=True)
        ephemeral = Ephemeral(channel, str(user), self._next_ts(), text, blocks)
        self._ephemerals.append(ephemeral)
        return {"ok": True, "message_ts": ephemeral.ts}

    def _views_open(self, args: dict[str, Any]) -> dict[str, Any]:
        trigger_id = args.get("trigger_id")
        if not trigger_id:
            raise SlackRefusal("invalid_arguments", "missing required field: trigger_id")
        view = args.get("view")
        if not isinstance(view, dict) or view.get("type") != "modal":
            raise SlackRefusal("invalid_arguments", "view must be an object of type modal")
        trigger = self._triggers.get(str(trigger_id))
        if trigger is None:
            raise SlackRefusal("invalid_trigger_id")
        if trigger.used:
            raise SlackRefusal("exchanged_trigger_id")
        if time.monotonic() > trigger.expires_at:
            raise SlackRefusal("expired_trigger_id")
        blocks = _check_blocks(
            view.get("blocks", []), limit=MAX_MODAL_BLOCKS, code="invalid_arguments"
        )
        private_metadata = str(view.get("private_metadata", ""))
        if len(private_metadata) > MAX_PRIVATE_METADATA_CHARS:
            raise SlackRefusal(
                "invalid_arguments",
                f"must be less than {MAX_PRIVATE_METADATA_CHARS} characters (private_metadata)",
            )
        callback_id = str(view.get("callback_id", ""))
        if len(callback_id) > MAX_ID_CHARS:
            raise SlackRefusal("invalid_arguments", "callback_id is too long")
        trigger.used = True
        view_id = self._view_id()
        opened = {
            "id": view_id,
            "team_id": self.team_id,
            "type": "modal",
            "title": view.get("title"),
            "close": view.get("close"),
            "submit": view.get("submit"),
            "blocks": blocks,
            "private_metadata": private_metadata,
            "callback_id": callback_id,
            "state": {"values": {}},
            "hash": self._view_hash(),
            "clear_on_close": bool(view.get("clear_on_close", False)),
            "notify_on_close": bool(view.get("notify_on_close", False)),
            "root_view_id": view_id,
            "previous_view_id": None,
            "app_id": self.api_app_id,
            "external_id": str(view.get("external_id", "")),
            "app_installed_team_id": self.team_id,
            "bot_id": self.bot_id,
        }
        self._views[view_id] = opened
        return {"ok": True, "view": copy.deepcopy(opened)}

    def _users_info(self, args: dict[str, Any]) -> dict[str, Any]:
        user = self._users.get(str(args.get("user", "")))
        if user is None:
            raise SlackRefusal("user_not_found")
        return {"ok": True, "user": user.payload()}

    def _conversations_open(self, args: dict[str, Any]) -> dict[str, Any]:
        users = [u for u in str(args.get("users") or "").split(",") if u]
        if not users and args.get("channel"):
            channel_id = str(args["channel"])
            if channel_id not in self._dms.values():
                raise SlackRefusal("channel_not_found")
            user_id = next(u for u, dm in self._dms.items() if dm == channel_id)
            users = [user_id]
        if not users:
            raise SlackRefusal("users_list_not_supplied")
        if len(users) > 1:
            # Slack would open a group conversation; Effectgate writes to one person.
            raise SlackRefusal("invalid_arguments", "the fake opens one-person DMs only")
        if users[0] not in self._users:
            raise SlackRefusal("user_not_found")
        channel_id, already_open = self._dm_locked(users[0])
        channel: dict[str, Any] = {"id": channel_id}
        if _truthy(args.get("return_im")):
            channel.update(
                {
                    "created": 1700000000,
                    "is_im": True,
                    "is_org_shared": False,
                    "user": users[0],
                    "last_read": "0000000000.000000",
                    "latest": None,
                    "unread_count": 0,
                    "unread_count_display": 0,
                    "is_open": True,
                    "priority": 0,
                }
            )
        answer: dict[str, Any] = {"ok": True, "channel": channel}
        if already_open:
            answer.update({"no_op": True, "already_open": True})
        return answer

    # Helpers; those that read or change state run with the lock held.

    def _channel(self, value: Any) -> str:
        """The channel a post goes to: a person's id means the app's DM with them."""
        if not value:
            raise SlackRefusal("channel_not_found")
        channel = str(value)
        if channel[:1] in ("U", "W"):
            if channel not in self._users:
                raise SlackRefusal("channel_not_found")
            return self._dm_locked(channel)[0]
        return channel

    def _dm_locked(self, user_id: str) -> tuple[str, bool]:
        if user_id in self._dms:
            return self._dms[user_id], True
        self._dms[user_id] = f"D0EG{next(self._serial):06d}"
        return self._dms[user_id], False

    @staticmethod
    def _content(args: dict[str, Any], *, require: bool) -> tuple[str, list[dict[str, Any]]]:
        text = args.get("text")
        blocks = args.get("blocks")
        if require and not text and not blocks and not args.get("attachments"):
            raise SlackRefusal("no_text")
        if text is not None and len(str(text)) > MAX_TEXT_CHARS:
            raise SlackRefusal("msg_too_long")
        checked = (
            _check_blocks(blocks, limit=MAX_MESSAGE_BLOCKS, code="invalid_blocks")
            if blocks is not None
            else []
        )
        return ("" if text is None else str(text)), checked

    def _post(
        self, channel: str, text: str, blocks: list[dict[str, Any]], thread_ts: Any
    ) -> Message:
        message = Message(
            channel=channel,
            ts=self._next_ts(),
            text=text,
            blocks=blocks,
            thread_ts=str(thread_ts) if thread_ts else None,
            versions=[{"text": text, "blocks": copy.deepcopy(blocks)}],
        )
        self._messages.setdefault(channel, {})[message.ts] = message
        return message

    def _edit(self, message: Message, args: dict[str, Any]) -> None:
        """chat.update's change: the text and the blocks given replace the message's;
        what is not given stays (an empty list of blocks removes them)."""
        if "text" not in args and "blocks" not in args and "attachments" not in args:
            raise SlackRefusal("no_text")
        text, blocks = self._content(args, require=False)
        if "text" in args:
            message.text = text
        if "blocks" in args:
            message.blocks = blocks
        message.edited_ts = self._now_ts()
        message.versions.append({"text": message.text, "blocks": copy.deepcopy(message.blocks)})

    def _message_payload(self, message: Message) -> dict[str, Any]:
        """A bot's message as Slack shows it in an answer or a payload."""
        payload: dict[str, Any] = {
            "type": "message",
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "app_id": self.api_app_id,
            "text": message.text,
            "ts": message.ts,
            "team": self.team_id,
            "blocks": copy.deepcopy(message.blocks),
        }
        if message.thread_ts:
            payload["thread_ts"] = message.thread_ts
        if message.edited_ts:
            payload["edited"] = {"user": self.bot_user_id, "ts": message.edited_ts}
        return payload

    def _next_ts(self) -> str:
        """Message timestamps, unique and increasing: 1700000000.000100, .000200, ..."""
        micros = 1_700_000_000_000_000 + 100 * next(self._serial)
        return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"

    @staticmethod
    def _now_ts() -> str:
        return f"{time.time():.6f}"

    def _view_id(self) -> str:
        return f"V0EG{next(self._serial):06d}"

    @staticmethod
    def _view_hash() -> str:
        return f"{int(time.time())}.{secrets.token_hex(4)}"

    def _new_response_url(self, channel: str, message_ts: str, user_id: str) -> str:
        path = f"/actions/{self.team_id}/{next(self._serial)}/{secrets.token_urlsafe(18)}"
        with self._lock:
            self._response_urls[path] = _ResponseUrl(channel, message_ts, user_id)
        return self.base_url + path

    def _user_ref(self, user_id: str, team_id: str) -> dict[str, Any]:
        with self._lock:
            user = self._users.get(user_id)
        name = user.name if user else user_id.lower()
        return {"id": user_id, "username": name, "name": name, "team_id": team_id}

    @staticmethod
    def _channel_name(channel: str) -> str:
        return "directmessage" if channel.startswith("D") else f"channel-{channel.lower()}"
