"""Console session security: client addresses, session clocks, ending a person's sessions.

``console.middleware`` enforces the idle and absolute timeouts with the clocks kept here;
``console.signals`` starts them at sign-in and ends every session of a person who is
deactivated. docs/security.md describes what each protection covers.
"""

import time
from typing import Any

from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, get_user_model
from django.contrib.sessions.models import Session
from django.utils import timezone

from approvals.people import Person
from operations.machine import EventKind

# Session keys: when the person signed in, and when they last did something.
SIGNED_IN_AT = "_eg_signed_in_at"
SEEN_AT = "_eg_seen_at"
# Activity is written to the session at most this often, so that a busy console does
# not write its session row on every request; idle timeouts are exact to this much.
SEEN_RESOLUTION_S = 60


def client_ip(request: Any) -> str:
    """The client's address: REMOTE_ADDR, or the one the outermost trusted proxy saw.

    With ``TRUSTED_PROXY_COUNT`` = n proxies in front, each appends the address it saw
    to X-Forwarded-For, so the n-th entry from the right is the one a client cannot
    forge. Used by sign-in throttling (django-axes) and the sign-in audit events.
    """
    meta = getattr(request, "META", None) or {}
    count = settings.TRUSTED_PROXY_COUNT
    if count > 0:
        forwarded = [part.strip() for part in meta.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        forwarded = [part for part in forwarded if part]
        if len(forwarded) >= count:
            return forwarded[-count]
    return meta.get("REMOTE_ADDR", "") or ""


# Set on a session whose single sign-on asserted a second factor (console/sso.py).
SSO_SECOND_FACTOR = "sso_second_factor"


def session_verified(request: Any) -> bool:
    """Whether this session was verified with a second factor: a one-time password here
    (django-otp's middleware gives ``request.user`` an ``is_verified`` method), or the
    identity provider's assertion at sign-in (``OIDC_SECOND_FACTOR_AMR`` / ``_ACR``)."""
    if request.user.is_verified():
        return True
    session = getattr(request, "session", None)
    return bool(session is not None and session.get(SSO_SECOND_FACTOR) is True)


def session_start(session: Any, *, now: float | None = None) -> None:
    """Start both clocks of a freshly signed-in session."""
    now = time.time() if now is None else now
    session[SIGNED_IN_AT] = int(now)
    session[SEEN_AT] = int(now)


def session_expiry(session: Any, *, now: float | None = None) -> str | None:
    """Why an authenticated session has ended (``"idle"`` or ``"absolute"``), or None.

    A session signed in before these clocks existed starts them now.
    """
    now = time.time() if now is None else now
    if SIGNED_IN_AT not in session:
        session_start(session, now=now)
        return None
    if now - session[SIGNED_IN_AT] >= settings.SESSION_ABSOLUTE_TIMEOUT_S:
        return "absolute"
    if now - session.get(SEEN_AT, session[SIGNED_IN_AT]) >= settings.SESSION_IDLE_TIMEOUT_S:
        return "idle"
    return None


SSO_BACKEND = "console.sso.OIDCBackend"


def session_password_refused(session: Any, user: Person) -> bool:
    """Whether a session signed in with a password that ``PASSWORD_LOGIN=superusers`` no
    longer allows: a non-superuser's from before the setting changed ends at its next
    request, not at its timeout."""
    if settings.PASSWORD_LOGIN != "superusers" or user.is_superuser:  # noqa: S105 (a mode)
        return False
    return session.get(BACKEND_SESSION_KEY) != SSO_BACKEND


def session_touch(session: Any, *, now: float | None = None) -> None:
    """Record activity, at most once per ``SEEN_RESOLUTION_S``."""
    now = time.time() if now is None else now
    if now - session.get(SEEN_AT, 0) >= SEEN_RESOLUTION_S:
        session[SEEN_AT] = int(now)


def sessions_end_for_user(user: Person) -> int:
    """Delete every stored session signed in as ``user``; returns how many.

    Sessions are keyed by a random id, not by person, so this reads the unexpired ones;
    a console has few. With a non-database session engine nothing is stored here and the
    authentication middleware's own check (inactive users are anonymous) still applies.
    """
    user_key = str(user.pk)
    doomed = []
    for session in Session.objects.filter(expire_date__gt=timezone.now()).iterator():
        data = session.get_decoded()
        if str(data.get("_auth_user_id", "")) == user_key:
            doomed.append(session.session_key)
    if doomed:
        Session.objects.filter(session_key__in=doomed).delete()
    return len(doomed)


def is_active_changed_to_false(user: Person) -> bool:
    """True when ``user`` (about to be saved) is being deactivated."""
    if user.pk is None or user.is_active:
        return False
    model = get_user_model()
    return model.objects.filter(pk=user.pk, is_active=True).exists()


# --- the second factor (django-otp, TOTP) -----------------------------------------------
# The devices are django-otp's rows, written only here; each change is an account event
# in the person's audit stream.


def second_factor_devices(user: Person) -> list[Any]:
    from django_otp.plugins.otp_totp.models import TOTPDevice

    return list(TOTPDevice.objects.filter(user=user, confirmed=True).order_by("id"))


def second_factor_start(*, user: Person, verified: bool) -> Any:
    """A new, unconfirmed authenticator for ``user`` (replacing an unfinished one).

    Someone who already has an authenticator must verify this session with it first:
    a stolen password and session alone cannot add the thief's device.
    """
    from django.db import transaction
    from django_otp.plugins.otp_totp.models import TOTPDevice

    from approvals.errors import PermissionRefused

    if second_factor_devices(user) and not verified:
        raise PermissionRefused(
            "Verify this session with your current authenticator before adding another."
        )
    with transaction.atomic():
        TOTPDevice.objects.filter(user=user, confirmed=False).delete()
        return TOTPDevice.objects.create(user=user, name="Authenticator app", confirmed=False)


def second_factor_pending(user: Person) -> Any:
    from django_otp.plugins.otp_totp.models import TOTPDevice

    return TOTPDevice.objects.filter(user=user, confirmed=False).order_by("-id").first()


def second_factor_secret(device: Any) -> str:
    """The device's secret in base32, in groups of four, for typing into an app."""
    from base64 import b32encode

    text = b32encode(device.bin_key).decode()
    return " ".join(text[i : i + 4] for i in range(0, len(text), 4))


def _token(raw: str) -> str:
    return "".join(raw.split())[:12]


def second_factor_confirm(*, request: Any, device: Any, token: str) -> bool:
    """Confirm a new authenticator with a code from it; the session becomes verified."""
    from django_otp import login as otp_login

    from . import accounts

    if not device.verify_token(_token(token)):
        accounts.user_account_record(
            user=request.user, kind=EventKind.SECOND_FACTOR_FAILED, data={"during": "setup"}
        )
        return False
    device.confirmed = True
    device.save(update_fields=["confirmed"])
    otp_login(request, device)
    accounts.user_account_record(
        user=request.user, kind=EventKind.SECOND_FACTOR_ADDED, data={"device": device.persistent_id}
    )
    return True


def second_factor_verify(*, request: Any, token: str) -> bool:
    """Verify this session with a code from one of the person's authenticators.

    django-otp throttles each device after failures (growing delays) and refuses a code
    already used, so a code seen over a shoulder cannot be replayed.
    """
    from django_otp import login as otp_login

    from . import accounts

    for device in second_factor_devices(request.user):
        if device.verify_token(_token(token)):
            otp_login(request, device)
            accounts.user_account_record(
                user=request.user,
                kind=EventKind.SECOND_FACTOR_VERIFIED,
                data={"device": device.persistent_id},
            )
            return True
    accounts.user_account_record(
        user=request.user, kind=EventKind.SECOND_FACTOR_FAILED, data={"during": "verify"}
    )
    return False
