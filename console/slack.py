"""Slack's interactivity URL, ``POST /integrations/slack/interactions``, and the page where
a person links their Slack account (docs/notifications.md, Slack).

Every request is read as hostile until it proves itself:

1. at most ``MAX_BODY`` bytes; its ``X-Slack-Request-Timestamp`` within five minutes of
   now and its ``X-Slack-Signature`` Slack's HMAC of it under ``SLACK_SIGNING_SECRET``
   (``slack_sdk``'s verifier); from ``SLACK_TEAM_ID``'s workspace when one is set. One
   that fails is answered 401 and recorded on the ``slack`` stream (at most
   ``REFUSALS_RECORDED_PER_MINUTE`` a minute: nobody without the secret fills the ledger);
2. once: Slack sends an interaction again when it thinks it went unanswered, and the
   second is recognised (``services.slack_interaction_first``) and does nothing;
3. from a Slack person linked to a person here (by that person on their console page, by
   an operator with ``effectgate slack link``, or by a confirmed email where
   ``SLACK_LINK_BY_VERIFIED_EMAIL`` allows it), never guessed from a name;
4. decided by ``services.approval_decide``, the console's own decision, with the
   button's intent hash checked under the request's lock: quorum, separation of duties,
   permissions, the second factor and expiry apply unchanged. A refusal writes its
   event on the request's operation and nothing else, and the person is told why in a
   message only they see.

Slack wants an answer within three seconds: a decision is one transaction; the message's
update goes out from the notices after commit.
"""

import logging
import re
import secrets
import time
from typing import Any
from urllib.parse import parse_qs

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core import signing
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from slack_sdk.signature import SignatureVerifier

from approvals.errors import Refusal
from approvals.models import ApprovalRequest
from approvals.people import Person
from operations import access, errors, services
from operations.dispatch import slack
from operations.selectors import notices as read
from operations.services import Actor
from operations.services.decisions import STALE_INTENT
from operations.strictjson import loads_strict

from .middleware import AuthenticatedHttpRequest

logger = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
WINDOW_S = 300
REFUSALS_RECORDED_PER_MINUTE = 60
LINK_SALT = "effectgate.slack-link"
LINK_MAX_AGE_S = 600
SLACK_ID = re.compile(r"[A-Z0-9]{2,32}")
BUTTON_VALUE = re.compile(r"(apr_[0-9a-z]{1,40}):([0-9a-f]{64})")


class Untrusted(Exception):
    def __init__(self, refusal: str, detail: str) -> None:
        self.refusal, self.detail = refusal, detail
        super().__init__(detail)


def _untrusted_record(request: HttpRequest, refusal: str) -> None:
    """Record a request that failed its checks, within a per-minute allowance."""
    bucket = f"effectgate:slack-refused:{int(time.time() // 60)}"
    cache.add(bucket, 0, timeout=120)
    try:
        count = cache.incr(bucket)
    except ValueError:  # the bucket is gone (culled): count it as over, never as free
        return
    if count > REFUSALS_RECORDED_PER_MINUTE:
        return
    services.slack_request_refused(
        refusal=refusal, data={"ip": request.META.get("REMOTE_ADDR") or None}
    )


def _verified_payload(request: HttpRequest) -> dict[str, Any]:
    length = request.META.get("CONTENT_LENGTH") or "0"
    if not length.isdigit() or int(length) > MAX_BODY:
        raise Untrusted("too_large", "The body is larger than an interaction.")
    body = request.body
    stamp = request.headers.get("X-Slack-Request-Timestamp", "")
    signature = request.headers.get("X-Slack-Signature", "")
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
        raise Untrusted("bad_timestamp", "No request timestamp.")
    if abs(time.time() - int(stamp)) > WINDOW_S:
        raise Untrusted("old_timestamp", "The request timestamp is not within five minutes.")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Untrusted("malformed", "The body is not UTF-8.") from exc
    verifier = SignatureVerifier(settings.SLACK_SIGNING_SECRET)
    if not signature.isascii() or not verifier.is_valid(text, stamp, signature):
        raise Untrusted("bad_signature", "The signature is not Slack's.")
    try:
        form = parse_qs(text, max_num_fields=4, strict_parsing=False)
        payload = loads_strict(form["payload"][0])
    except (KeyError, ValueError, IndexError, errors.DomainError) as exc:
        raise Untrusted("malformed", "The body is not an interaction payload.") from exc
    if not isinstance(payload, dict):
        raise Untrusted("malformed", "The body is not an interaction payload.")
    # Both the workspace the click came from and the person's own: in a channel shared
    # with another organisation (Slack Connect) the first is ours, the second theirs.
    teams = {
        _text(_dict(payload.get("team")).get("id")),
        _text(_dict(payload.get("user")).get("team_id")),
    } - {""}
    if teams != {settings.SLACK_TEAM_ID}:
        raise Untrusted("other_workspace", "The interaction is from another workspace.")
    return payload


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: Any, limit: int = 200) -> str:
    return value[:limit] if isinstance(value, str) else ""


@csrf_exempt
@require_POST
def interactions(request: HttpRequest) -> HttpResponse:
    if not (settings.SLACK_SIGNING_SECRET and settings.SLACK_BOT_TOKEN):
        return HttpResponse(status=404)
    try:
        payload = _verified_payload(request)
    except Untrusted as refusal:
        _untrusted_record(request, refusal.refusal)
        return HttpResponse(refusal.detail, status=401, content_type="text/plain")
    kind = payload.get("type")
    if kind == "block_actions":
        return _button(payload)
    if kind == "view_submission":
        return _reject_submitted(payload)
    return HttpResponse(status=200)  # a view closed, a shortcut: nothing to do


def _slack_user(payload: dict[str, Any]) -> str:
    user = _text(_dict(payload.get("user")).get("id"), 40)
    return user if SLACK_ID.fullmatch(user) else ""


def _person(slack_user: str) -> Person | None:
    person = read.slack_person(slack_user)
    if person is None and settings.SLACK_LINK_BY_VERIFIED_EMAIL:
        person = _link_by_email(slack_user)
    return person


def confirmed_email(profile: dict[str, Any] | None) -> str:
    """The email of a Slack profile when Slack says it is confirmed and the account is a
    full member of this workspace (no guest, no stranger from a shared channel, no bot,
    not deactivated): lower-cased ASCII, else ""."""
    if not profile or profile.get("team_id") != settings.SLACK_TEAM_ID:
        return ""
    if any(
        profile.get(flag)
        for flag in ("deleted", "is_bot", "is_stranger", "is_restricted", "is_ultra_restricted")
    ):
        return ""
    if profile.get("is_email_confirmed") is not True:
        return ""
    email = _text(_dict(profile.get("profile")).get("email"), 254).strip()
    if not email.isascii() or email.count("@") != 1:
        return ""
    return email.lower()


def same_email(person: Person, email: str) -> bool:
    """Exactly the same address, compared as lower-cased ASCII (no database collation
    folds a dotless i (U+0131) into an i here)."""
    mine = (person.email or "").strip()
    return bool(email) and mine.isascii() and mine.lower() == email


def _link_by_email(slack_user: str) -> Person | None:
    """Link by the email Slack says is confirmed, to the one active person (neither a
    superuser nor staff) who has it and no other Slack account."""
    email = confirmed_email(slack.profile(slack_user))
    if not email:
        return None
    people = [
        person
        for person in get_user_model().objects.filter(
            email__iexact=email, is_active=True, is_superuser=False, is_staff=False
        )[:3]
        if same_email(person, email)
    ]
    if len(people) != 1 or read.slack_accounts([people[0].pk]):
        return None
    try:
        services.slack_link(
            user=people[0],
            slack_user_id=slack_user,
            actor=Actor.system("slack"),
            via="email",
            email=email,
        )
    except ValueError:
        return None
    return people[0]


def _refuse(
    *,
    payload: dict[str, Any],
    request_id: str,
    slack_user: str,
    user: Person | None,
    refusal: str,
    detail: str,
    tell: bool | str = True,
) -> None:
    """Record the refusal (its only write; once a minute per Slack person and request, so
    pressing a button again and again does not fill the operation's history) and tell
    the person why, privately. ``detail`` goes into the ledger: never a credential."""
    if cache.add(f"effectgate:slack-refusal:{slack_user}:{request_id}", 1, timeout=60):
        recorded = services.slack_decision_refused(
            request_id=request_id,
            slack_user_id=slack_user,
            user=user,
            refusal=refusal,
            detail=detail,
        )
        if not recorded:
            services.slack_request_refused(
                refusal=refusal, data={"approval": request_id[:60], "slack_user": slack_user}
            )
    channel = _text(_dict(payload.get("channel")).get("id"), 40) or _text(
        _dict(payload.get("container")).get("channel_id"), 40
    )
    if tell and channel and slack_user:
        text = tell if isinstance(tell, str) else detail
        slack.ephemeral(channel=channel, user=slack_user, text=f"Nothing was decided. {text}")


UNLINKED = "Your Slack account is not linked to a person in Effectgate."


def _link_offer(slack_user: str) -> str:
    """What an unlinked person is told, privately: a link to their console page that
    links this Slack account, once, within ten minutes. Never recorded anywhere."""
    token = signing.dumps(
        {"slack_user": slack_user, "nonce": secrets.token_urlsafe(12)}, salt=LINK_SALT
    )
    link = read.console_link(reverse("console:slack-link") + f"?token={token}")
    return f"{UNLINKED} Open this link, signed in as yourself, to link it: {link}"


def _button(payload: dict[str, Any]) -> HttpResponse:
    actions = payload.get("actions")
    action = _dict(actions[0]) if isinstance(actions, list) and actions else {}
    action_id = action.get("action_id")
    if action_id not in (slack.APPROVE, slack.REJECT):
        return HttpResponse(status=200)  # the console link: Slack opens it
    slack_user = _slack_user(payload)
    matched = BUTTON_VALUE.fullmatch(_text(action.get("value"), 120))
    if not slack_user or matched is None:
        return HttpResponse(status=200)
    request_id, shown = matched.groups()
    key = services.slack_interaction_key(
        "block_actions",
        slack_user,
        _text(action.get("action_ts"), 40),
        _text(action.get("action_id"), 40),
        request_id,
        shown,
    )
    if not services.slack_interaction_first(key=key, now=_now()):
        return HttpResponse(status=200)  # Slack's retry of one already answered
    person = _person(slack_user)
    if person is None:
        _refuse_unlinked(payload, request_id=request_id, slack_user=slack_user)
        return HttpResponse(status=200)
    if action_id == slack.APPROVE:
        _decide(
            payload,
            person=person,
            slack_user=slack_user,
            request_id=request_id,
            shown=shown,
            reason="",
        )
        return HttpResponse(status=200)
    # Reject: ask for the reason in a modal, unless the decision would be refused anyway.
    detail = _reject_refusal(person, request_id, shown)
    if detail is not None:
        _refuse(
            payload=payload,
            request_id=request_id,
            slack_user=slack_user,
            user=person,
            refusal="decision_refused",
            detail=detail,
        )
        return HttpResponse(status=200)
    view = read.request_view(request_id)
    trigger = _text(payload.get("trigger_id"), 200)
    if (
        view is None
        or not trigger
        or not slack.open_modal(trigger_id=trigger, modal=slack.reject_modal(view))
    ):
        channel = _text(_dict(payload.get("channel")).get("id"), 40)
        if channel and view is not None:
            slack.ephemeral(
                channel=channel,
                user=slack_user,
                text=f"The rejection form did not open; reject it in the console: {view.link}",
            )
    return HttpResponse(status=200)


def _reject_refusal(person: Person, request_id: str, shown: str) -> str | None:
    """Why ``person`` could not reject the request now (asked before the modal opens,
    and asked again, under the lock, when it is submitted)."""
    request = (
        ApprovalRequest.objects.select_related("operation__tool").filter(pk=request_id).first()
    )
    if request is None:
        return "There is no such request."
    if request.status != ApprovalRequest.RequestStatus.PENDING:
        return f"The request is {request.status}."
    if request.intent_hash != shown:
        return STALE_INTENT
    return access.decide_refusal(
        user=person, request=request, op=request.operation, otp_verified=False
    )


def _reject_submitted(payload: dict[str, Any]) -> HttpResponse:
    view = _dict(payload.get("view"))
    if view.get("callback_id") != slack.REJECT_CALLBACK:
        return HttpResponse(status=200)
    slack_user = _slack_user(payload)
    matched = BUTTON_VALUE.fullmatch(_text(view.get("private_metadata"), 120))
    if not slack_user or matched is None:
        return HttpResponse(status=200)
    request_id, shown = matched.groups()
    values = _dict(_dict(view.get("state")).get("values"))
    reason = _text(
        _dict(_dict(values.get(slack.REASON_BLOCK)).get(slack.REASON_ACTION)).get("value"), 2000
    ).strip()
    if not reason:
        return _modal_error(None, "Write why: the agent's runner receives the reason.")
    key = services.slack_interaction_key(
        "view_submission",
        slack_user,
        _text(view.get("id"), 40),
        _text(view.get("hash"), 80),
        reason,
    )
    if not services.slack_interaction_first(key=key, now=_now()):
        # Slack's retry, or the same reason submitted again: the same answer as before.
        answer = read.slack_interaction_answer(key)
        return JsonResponse(answer) if answer else HttpResponse(status=200)
    person = _person(slack_user)
    if person is None:
        _refuse_unlinked(payload, request_id=request_id, slack_user=slack_user)
        return _modal_error(key, f"{UNLINKED} Effectgate sent you a link to link it.")
    detail = _decide(
        payload,
        person=person,
        slack_user=slack_user,
        request_id=request_id,
        shown=shown,
        reason=reason,
    )
    if detail is not None:
        return _modal_error(key, f"Nothing was decided. {detail}")
    return HttpResponse(status=200)


def _refuse_unlinked(payload: dict[str, Any], *, request_id: str, slack_user: str) -> None:
    _refuse(
        payload=payload,
        request_id=request_id,
        slack_user=slack_user,
        user=None,
        refusal="unlinked",
        detail=UNLINKED,
        tell=_link_offer(slack_user),
    )


def _decide(
    payload: dict[str, Any],
    *,
    person: Person,
    slack_user: str,
    request_id: str,
    shown: str,
    reason: str,
) -> str | None:
    """Approve (no ``reason``) or reject through the console's decision service; a
    refusal is recorded and answered with why (privately for a button, in the modal for a
    rejection's form). Answers why it was refused, or None."""
    try:
        services.approval_decide(
            request_id=request_id,
            user=person,
            approve=not reason,
            comment=reason,
            otp_verified=False,
            shown_intent_hash=shown,
            via="slack",
        )
    except (Refusal, errors.DomainError) as refusal:
        detail = str(getattr(refusal, "detail", refusal))
        _refuse(
            payload=payload,
            request_id=request_id,
            slack_user=slack_user,
            user=person,
            refusal=getattr(refusal, "code", "refused"),
            detail=detail,
            tell=not reason,
        )
        return detail
    return None


def _modal_error(key: str | None, text: str) -> JsonResponse:
    """The modal's answer that shows ``text`` under the reason (and keeps it open);
    remembered under ``key`` so a retry gets it too."""
    answer = {"response_action": "errors", "errors": {slack.REASON_BLOCK: text[:300]}}
    if key is not None:
        services.slack_interaction_answered(key=key, answer=answer)
    return JsonResponse(answer)


def _now() -> Any:
    return timezone.now()


# --- linking, from the person's own page ---------------------------------------------------


def _link_token(token: str) -> tuple[str, str] | None:
    """The Slack account and the one-use nonce a link token carries, when it is ours and
    at most ``LINK_MAX_AGE_S`` old."""
    try:
        data = signing.loads(token, salt=LINK_SALT, max_age=LINK_MAX_AGE_S)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict):
        return None
    slack_user, nonce = data.get("slack_user"), data.get("nonce")
    if not (isinstance(slack_user, str) and SLACK_ID.fullmatch(slack_user)):
        return None
    if not (isinstance(nonce, str) and 8 <= len(nonce) <= 40):
        return None
    return slack_user, nonce


def _link_refusal(user: Person, email: str) -> str | None:
    """Why the signed-in person may not link the Slack account whose confirmed email is
    ``email`` from their page (an operator still may, with ``effectgate slack link``)."""
    if not email:
        return (
            "Slack does not say this account's email is confirmed, or the account is a "
            "guest or from another workspace: ask an operator to link it."
        )
    if not same_email(user, email):
        return (
            "This Slack account's email is not yours here: it is not your account. Open "
            "the link Slack showed you, signed in as yourself, or ask an operator."
        )
    if read.slack_accounts([user.pk]):
        return "Another Slack account is linked to you: unlink it first."
    return None


@login_required
def link(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The link Slack gave an unlinked person: GET shows whom it links, POST links it.

    Only the person whose email Slack confirms for that account links it here, once:
    a link passed on to someone else (to make their decisions come from the sender's
    Slack) links nothing, and nor does a link used before."""
    token = (request.POST.get("token") or request.GET.get("token") or "")[:500]
    found = _link_token(token)
    if found is None:
        messages.error(
            request,
            "This Slack link is not valid or is older than ten minutes: press the button in "
            "Slack again for a new one.",
        )
        return redirect("console:account")
    slack_user, nonce = found
    profile = slack.profile(slack_user)
    email = confirmed_email(profile)
    refusal = _link_refusal(request.user, email)
    if request.method == "POST":
        if refusal is None and not cache.add(
            f"effectgate:slack-link-used:{nonce}", 1, timeout=LINK_MAX_AGE_S + 60
        ):
            refusal = "This Slack link was used already: press the button in Slack again."
        if refusal is not None:
            messages.error(request, f"Not linked. {refusal}")
            return redirect("console:account")
        try:
            services.slack_link(
                user=request.user,
                slack_user_id=slack_user,
                actor=Actor.of_user(request.user),
                via="console",
                email=email,
                replace=False,
            )
        except ValueError as exc:
            messages.error(request, f"Not linked. {exc}")
        else:
            messages.success(
                request, f"Your Slack account {slack_user} is linked: its buttons decide as you."
            )
        return redirect("console:account")
    names = _dict((profile or {}).get("profile"))
    return render(
        request,
        "console/slack_link.html",
        {
            "slack_user": slack_user,
            "slack_name": _text(names.get("real_name") or (profile or {}).get("real_name"), 120),
            "slack_email": email,
            "refusal": refusal,
            "token": token,
        },
    )


@require_POST
@login_required
def unlink(request: AuthenticatedHttpRequest) -> HttpResponse:
    if services.slack_unlink(user=request.user, actor=Actor.of_user(request.user)):
        messages.success(request, "Your Slack account is unlinked.")
    return redirect("console:account")
