"""Slack's Web API, through ``slack_sdk`` (docs/notifications.md, Slack): an approval
request as a Block Kit message, posted, updated in place, a rejection's modal, a
private answer to one person, a person's profile.

Everything a message says comes from ``selectors.notices.request_view``: the summary
and amount the contract displays (``x-sensitive`` values hidden), the principal, the
runner's reason, why people are asked, the approvals still needed and the expiry. Text
a runner wrote is escaped for Slack's mrkdwn (``&``, ``<``, ``>``), so it can neither
mention a channel nor forge a link, and every text is cut to what Slack takes.

The Web API is reached at ``SLACK_API_URL`` (Slack's own by default; a fake on loopback
in the tests) with ``SLACK_BOT_TOKEN``, never logged; each call waits at most
``SLACK_TIMEOUT_S``.
"""

import re
from typing import Any

from django.conf import settings
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from ..selectors.notices import RequestView

APPROVE, REJECT, OPEN = "approve", "reject", "open"
REJECT_CALLBACK = "effectgate_reject"
REASON_BLOCK, REASON_ACTION = "reason", "reason_input"
# Slack's limits: a section's text, a field, a header, a button's value.
TEXT_MAX, FIELD_MAX, HEADER_MAX, VALUE_MAX = 2900, 1900, 150, 2000
# Errors a retry cannot mend: the delivery fails at once, with the error as its record.
PERMANENT = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "invalid_auth",
        "account_inactive",
        "token_revoked",
        "not_authed",
        "missing_scope",
        "invalid_blocks",
        "msg_too_long",
        "message_not_found",
        "cant_update_message",
        "user_not_found",
    }
)


def configured() -> bool:
    return bool(settings.SLACK_BOT_TOKEN)


def client() -> WebClient:
    return WebClient(
        token=settings.SLACK_BOT_TOKEN,
        base_url=settings.SLACK_API_URL,
        timeout=max(1, round(settings.SLACK_TIMEOUT_S)),
    )


ENTITY = re.compile(r"&[a-z]{0,3}$")


def escape(text: str, limit: int = TEXT_MAX) -> str:
    """Text for mrkdwn: Slack's three control characters escaped, then cut to ``limit``
    characters without splitting an escape (escaping may make text four times longer)."""
    escaped = text[: limit * 4].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if len(escaped) <= limit:
        return escaped
    return ENTITY.sub("", escaped[: limit - 1]) + "…"


def _mrkdwn(text: str) -> dict[str, Any]:
    """A mrkdwn text object whose text Slack does not parse further (``verbatim``: no
    mention, channel or link is made of what a runner wrote)."""
    return {"type": "mrkdwn", "text": text or " ", "verbatim": True}


def _plain(text: str, limit: int) -> dict[str, Any]:
    cut = text if len(text) <= limit else text[: limit - 1] + "…"
    return {"type": "plain_text", "text": cut or " ", "emoji": False}


def button_value(view: RequestView) -> str:
    """What an Approve or Reject button carries: the request and the intent shown."""
    return f"{view.request_id}:{view.intent_hash}"[:VALUE_MAX]


def _when(view: RequestView) -> str:
    stamp = int(view.expires_at.timestamp())
    fallback = view.expires_at.strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{stamp}^{{date_short_pretty}} {{time}}|{fallback}>"


def headline(view: RequestView) -> str:
    if view.pending:
        return f"Approval needed: {view.tool}"
    words = {
        "approved": "Approved",
        "rejected": "Rejected",
        "expired": "Expired without a decision",
        "withdrawn": "Withdrawn",
        "superseded": "Replaced by an edited copy",
        "revoked": "Approved, then revoked",
    }
    return f"{words.get(view.status, view.status.capitalize())}: {view.tool}"


def fallback_text(view: RequestView) -> str:
    """The notification's text (what Slack shows where blocks are not shown), escaped:
    Slack reads it as mrkdwn."""
    return escape(f"{headline(view)}: {view.summary}")


def _approvals_line(view: RequestView) -> str:
    counted = f"{view.approvals} of {view.approvals_required}"
    if view.pending:
        more = view.still_needed
        return f"{counted}; {more} more needed" if more else counted
    return counted


def _decided_lines(view: RequestView) -> str:
    lines = []
    for decided in view.decided:
        verb = "approved" if decided.decision == "approve" else "rejected"
        comment = f": {escape(decided.comment, 300)}" if decided.comment else ""
        lines.append(f"• *{escape(decided.username, 150)}* {verb}{comment}")
    return "\n".join(lines)


def blocks(view: RequestView) -> list[dict[str, Any]]:
    """The message for ``view``: what it asks and why, and while it is pending the
    buttons (or, where the decision needs a second factor, only the console's link)."""
    fields = [
        f"*Amount*\n{escape(view.amount, FIELD_MAX)}" if view.amount else "",
        f"*For*\n{escape(view.principal, FIELD_MAX)}",
        f"*Agent's reason*\n{escape(view.runner_reason, FIELD_MAX)}" if view.runner_reason else "",
        f"*Approvals*\n{_approvals_line(view)}",
        f"*Expires*\n{_when(view)}" if view.pending else "",
        f"*Escalated to*\n{escape(view.escalated_to, FIELD_MAX)}" if view.escalated_to else "",
    ]
    out: list[dict[str, Any]] = [
        {"type": "header", "text": _plain(headline(view), HEADER_MAX)},
        {"type": "section", "text": _mrkdwn(escape(view.summary))},
        {"type": "section", "fields": [_mrkdwn(text) for text in fields if text][:10]},
    ]
    if view.reasons:
        why = "\n".join(f"• {escape(reason, 500)}" for reason in view.reasons[:8])
        out.append(
            {
                "type": "section",
                "text": _mrkdwn(f"*Why you are asked*\n{why}"[:TEXT_MAX]),
            }
        )
    if view.decided:
        out.append(
            {
                "type": "section",
                "text": _mrkdwn(f"*Decided*\n{_decided_lines(view)}"[:TEXT_MAX]),
            }
        )
    out.append(
        {
            "type": "context",
            "elements": [
                _mrkdwn(escape(f"{view.tool} · {view.effect_class} · {view.operation_id}", 300))
            ],
        }
    )
    console = {
        "type": "button",
        "action_id": OPEN,
        "text": _plain("Open in the console", 75),
        "url": view.link,
    }
    if view.pending and view.needs_second_factor:
        out.append(
            {
                "type": "context",
                "elements": [
                    {
                        "type": "mrkdwn",
                        "text": "This decision needs a second factor: decide in the console.",
                    }
                ],
            }
        )
        out.append({"type": "actions", "block_id": "decide", "elements": [console]})
    elif view.pending:
        value = button_value(view)
        out.append(
            {
                "type": "actions",
                "block_id": "decide",
                "elements": [
                    {
                        "type": "button",
                        "action_id": APPROVE,
                        "style": "primary",
                        "text": _plain("Approve", 75),
                        "value": value,
                    },
                    {
                        "type": "button",
                        "action_id": REJECT,
                        "style": "danger",
                        "text": _plain("Reject…", 75),
                        "value": value,
                    },
                    console,
                ],
            }
        )
    else:
        out.append({"type": "actions", "block_id": "decided", "elements": [console]})
    return out


def reject_modal(view: RequestView) -> dict[str, Any]:
    """The modal a Reject button opens: the reason, which the runner receives."""
    return {
        "type": "modal",
        "callback_id": REJECT_CALLBACK,
        "private_metadata": button_value(view),
        "title": _plain("Reject", 24),
        "submit": _plain("Reject", 24),
        "close": _plain("Cancel", 24),
        "blocks": [
            {"type": "section", "text": _mrkdwn(escape(view.summary))},
            {
                "type": "input",
                "block_id": REASON_BLOCK,
                "label": _plain("Why? The agent's runner receives this reason.", 150),
                "element": {
                    "type": "plain_text_input",
                    "action_id": REASON_ACTION,
                    "multiline": True,
                    "max_length": 2000,
                },
            },
        ],
    }


def post(channel: str, view: RequestView) -> tuple[str, str]:
    """Post the request's message; answers the channel's id and the message's ``ts``."""
    answer = client().chat_postMessage(
        channel=channel, text=fallback_text(view), blocks=blocks(view), unfurl_links=False
    )
    return str(answer["channel"]), str(answer["ts"])


def update(channel: str, ts: str, view: RequestView) -> None:
    client().chat_update(channel=channel, ts=ts, text=fallback_text(view), blocks=blocks(view))


def post_text(channel: str, text: str) -> None:
    """A plain message (a reminder, a four-eyes request) to a channel or a person."""
    client().chat_postMessage(channel=channel, text=escape(text), unfurl_links=False)


def ephemeral(*, channel: str, user: str, text: str) -> bool:
    """A private answer to one person where they pressed a button; best effort (a
    refusal is recorded whether or not they see why)."""
    try:
        client().chat_postEphemeral(channel=channel, user=user, text=escape(text))
    except (SlackApiError, OSError):
        return False
    return True


def open_modal(*, trigger_id: str, modal: dict[str, Any]) -> bool:
    try:
        client().views_open(trigger_id=trigger_id, view=modal)
    except (SlackApiError, OSError):
        return False
    return True


def profile(user: str) -> dict[str, Any] | None:
    """A Slack person's profile (``users.info``), or None when it cannot be read."""
    try:
        answer = client().users_info(user=user)
    except (SlackApiError, OSError):
        return None
    found = answer.get("user")
    return found if isinstance(found, dict) else None


def error_of(exc: SlackApiError) -> tuple[str, bool, int | None]:
    """What Slack said: the error's name, whether a retry may mend it, and how long
    Slack asked to wait (``Retry-After``, on a 429) in seconds."""
    response = exc.response
    error = str(response.get("error", "") if hasattr(response, "get") else "") or "error"
    status = getattr(response, "status_code", 0)
    retry_after = None
    if status == 429:
        headers = {str(k).lower(): v for k, v in (getattr(response, "headers", {}) or {}).items()}
        value = str(headers.get("retry-after", "")).strip()
        retry_after = int(value) if value.isascii() and value.isdigit() and len(value) < 6 else 30
    return error, error not in PERMANENT, retry_after
