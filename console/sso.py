"""Single sign-on with OpenID Connect: the authorization code flow with PKCE, state and
nonce (mozilla-django-oidc), people found by (issuer, ``sub``), groups from a claim.

The provider's endpoints come from its discovery document, read once per process from
the operator's ``OIDC_ISSUER``. A sign-in finds the person by ``ExternalIdentity``
(issuer, subject); someone unknown is created (``OIDC_CREATE_USERS``) or linked to the one
existing person with that verified email (``OIDC_LINK_BY_VERIFIED_EMAIL``), else refused.
Every link and every refusal is an event (a person's stream ``user:<pk>``, or ``sso`` when
there is no person), like the sign-ins themselves (console/signals.py). docs/deployment.md,
"Single sign-on (OpenID Connect)", tells an operator what to set.
"""

import hashlib
import json
import logging
import threading
from typing import Any
from urllib.parse import urlencode

import httpx
import jwt
import requests
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.models import Group
from django.contrib.auth.views import LoginView, LogoutView
from django.core.exceptions import (
    ImproperlyConfigured,
    PermissionDenied,
    SuspiciousOperation,
    ValidationError,
)
from django.db import IntegrityError, models, transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import resolve_url
from django.urls import reverse
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from approvals.models import ExternalIdentity
from approvals.people import Person
from operations.machine import EventKind
from operations.services import Actor, event_append

from . import accounts, security

logger = logging.getLogger("console.security")

# Bounds on what a provider's claims may bring: group values read, and their length.
MAX_GROUP_VALUES = 500
MAX_CLAIM_CHARS = 255
# The stream of refusals that have no person to belong to.
SSO_STREAM = "sso"
# Session key of the ID token, kept for RP-initiated logout's id_token_hint.
ID_TOKEN_SESSION_KEY = "oidc_id_token"  # noqa: S105 (a session key's name)


class SignInRefused(Exception):
    """A sign-in the provider vouched for that Effectgate does not accept; the message is
    shown on the sign-in page."""


def enabled() -> bool:
    return bool(settings.OIDC_ISSUER)


# --- the provider's discovery document ---------------------------------------------------

_discovered: dict[str, dict[str, Any]] = {}
_discovery_lock = threading.Lock()


# A discovery document is a few kilobytes; a provider's answer is read no further.
MAX_DISCOVERY_BYTES = 256 * 1024


def discovery() -> dict[str, Any]:
    """The issuer's OpenID configuration, fetched at first use and kept for the process.

    The document must name the configured issuer itself (OpenID Connect Discovery 4.3),
    so a document served elsewhere cannot redirect tokens to another issuer.
    """
    issuer = settings.OIDC_ISSUER
    if not issuer:
        raise ImproperlyConfigured("OIDC_ISSUER is not set.")
    with _discovery_lock:
        if issuer not in _discovered:
            url = f"{issuer.rstrip('/')}/.well-known/openid-configuration"
            body = b""
            with httpx.stream(
                "GET", url, timeout=settings.OIDC_TIMEOUT_S, follow_redirects=False
            ) as response:
                response.raise_for_status()
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_DISCOVERY_BYTES:
                        raise ImproperlyConfigured(
                            f"The discovery document at {url} is larger than "
                            f"{MAX_DISCOVERY_BYTES} bytes."
                        )
            document = json.loads(body)
            if not isinstance(document, dict) or document.get("issuer") != issuer:
                raise ImproperlyConfigured(
                    f"The discovery document at {url} does not name the issuer {issuer}."
                )
            _discovered[issuer] = document
        return _discovered[issuer]


def _endpoint(name: str) -> str:
    value = discovery().get(name)
    return value if isinstance(value, str) else ""


# mozilla-django-oidc reads its configuration by these names; here they come from our
# settings and the discovery document, read when a sign-in needs them.
_DISCOVERED_SETTINGS = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
}


def oidc_setting(attr: str, *default: Any) -> Any:
    if attr in _DISCOVERED_SETTINGS:
        return _endpoint(_DISCOVERED_SETTINGS[attr])
    fixed = {
        "OIDC_RP_CLIENT_ID": settings.OIDC_CLIENT_ID,
        "OIDC_RP_CLIENT_SECRET": settings.OIDC_CLIENT_SECRET,
        "OIDC_RP_SIGN_ALGO": settings.OIDC_SIGN_ALGO,
        "OIDC_RP_SCOPES": settings.OIDC_SCOPES,
        # The client authentication every provider must support (RFC 6749, 2.3.1).
        "OIDC_TOKEN_USE_BASIC_AUTH": True,
        "OIDC_USE_PKCE": True,
        "OIDC_PKCE_CODE_CHALLENGE_METHOD": "S256",
        "OIDC_USE_NONCE": True,
        "OIDC_TIMEOUT": settings.OIDC_TIMEOUT_S,
        "OIDC_STORE_ID_TOKEN": True,
        "OIDC_STORE_ACCESS_TOKEN": False,
        "OIDC_CREATE_USER": False,
        "OIDC_AUTHENTICATION_CALLBACK_URL": "oidc_authentication_callback",
        "LOGIN_REDIRECT_URL_FAILURE": resolve_url(settings.LOGIN_URL),
    }
    if attr in fixed:
        return fixed[attr]
    return import_from_settings(attr, *default)


# --- events ------------------------------------------------------------------------------


def _refusal_record(*, user: Person | None, reason: str, data: dict[str, Any]) -> None:
    """Record a refused sign-in: on the person's stream when there is one."""
    data = {"reason": reason, **data}
    if user is not None:
        accounts.user_account_record(
            user=user, kind=EventKind.SIGN_IN_REFUSED, actor=Actor.system("sso"), data=data
        )
        return
    # The stream has no row to lock: refusals without a person are rare, and two at the
    # same moment would meet on the stream's (stream, seq) uniqueness, never interleave.
    with transaction.atomic():
        event_append(
            stream=SSO_STREAM, kind=EventKind.SIGN_IN_REFUSED, actor=Actor.system("sso"), data=data
        )


def sign_in_refuse(*, request: HttpRequest, reason: str, message: str, **data: Any) -> None:
    """Record a refusal without a person and show ``message`` on the sign-in page."""
    _refusal_record(user=None, reason=reason, data={"ip": security.client_ip(request), **data})
    messages.error(request, message)


# --- people ------------------------------------------------------------------------------


def _text(value: Any) -> str:
    return value[:MAX_CLAIM_CHARS] if isinstance(value, str) else ""


def _group_values(claims: dict[str, Any]) -> set[str]:
    values = claims.get(settings.OIDC_GROUPS_CLAIM)
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list):
        return set()
    return {value for value in values[:MAX_GROUP_VALUES] if isinstance(value, str)}


def groups_sync(*, user: Person, claims: dict[str, Any]) -> dict[str, list[str]]:
    """Make the person's membership of the mapped groups what the provider's claim says.

    Only the groups ``OIDC_GROUP_MAP`` names are touched: one given in the console stays.
    Returns the groups added and removed (the caller records them).
    """
    mapping: dict[str, str] = settings.OIDC_GROUP_MAP
    if not mapping:
        return {"added": [], "removed": []}
    wanted = {mapping[value] for value in _group_values(claims) if value in mapping}
    managed = set(mapping.values())
    current = set(user.groups.filter(name__in=managed).values_list("name", flat=True))
    added, removed = sorted(wanted - current), sorted(current - wanted)
    for name in added:
        group, _ = Group.objects.get_or_create(name=name)
        user.groups.add(group)
    if removed:
        user.groups.remove(*Group.objects.filter(name__in=removed))
    return {"added": added, "removed": removed}


def _new_username(claims: dict[str, Any], subject: str) -> str:
    """A username for a person created at sign-in: the provider's preferred one when it is
    free and valid, else one made from the subject. It is shown, never matched."""
    model = get_user_model()
    field = model._meta.get_field(model.USERNAME_FIELD)
    assert isinstance(field, models.Field)
    preferred = _text(claims.get("preferred_username"))[:150]
    if preferred and not model.objects.filter(username__iexact=preferred).exists():
        try:
            field.run_validators(preferred)
        except ValidationError:
            pass  # A name the validators refuse: one made from the subject instead.
        else:
            return preferred

    return "sso-" + hashlib.sha256(f"{settings.OIDC_ISSUER} {subject}".encode()).hexdigest()[:16]


def _identity_new(*, issuer: str, subject: str, claims: dict[str, Any]) -> tuple[Person, str]:
    """Link an unknown (issuer, sub) to a person, by the two settings that allow it."""
    email = _text(claims.get("email"))
    model = get_user_model()
    if settings.OIDC_LINK_BY_VERIFIED_EMAIL and email and claims.get("email_verified") is True:
        people = list(model.objects.filter(email__iexact=email)[:2])
        if len(people) > 1:
            raise SignInRefused(
                "More than one person here has your email address: ask an administrator."
            )
        if people:
            person = people[0]
            if person.is_superuser or person.is_staff:
                # Whoever holds that address at the provider would become an
                # administrator here: an administrator links those people themselves.
                raise SignInRefused(
                    "An administrator's person is never linked by email: ask another "
                    "administrator to link your account."
                )
            if ExternalIdentity.objects.filter(issuer=issuer, user=person).exists():
                raise SignInRefused(
                    "Your person here is linked to another account at this provider."
                )
            return person, "verified_email"
    if settings.OIDC_CREATE_USERS:
        # An address the provider has not verified is nobody's: not stored, so that no
        # mail goes to it and no later link by email meets it.
        verified = email if claims.get("email_verified") is True else ""
        person = model(username=_new_username(claims, subject), email=verified)
        person.set_unusable_password()
        person.save()
        return person, "created"
    raise SignInRefused(
        "Your account at the identity provider is not linked to a person here: "
        "ask an administrator to add you."
    )


def identity_sign_in(*, request: HttpRequest, issuer: str, claims: dict[str, Any]) -> Person:
    """``_identity_sign_in``, once more if a first sign-in of the same (issuer, sub) in
    another request linked it first (the unique link refused this one's): the second
    attempt finds that link, and nothing of the first attempt was kept."""
    try:
        return _identity_sign_in(request=request, issuer=issuer, claims=claims)
    except IntegrityError:
        return _identity_sign_in(request=request, issuer=issuer, claims=claims)


def _identity_sign_in(*, request: HttpRequest, issuer: str, claims: dict[str, Any]) -> Person:
    """The person the provider's verified claims stand for, linked and with their mapped
    groups refreshed; raises ``SignInRefused`` (recorded) otherwise.

    1. Find the link of (issuer, sub); else make one (see ``_identity_new``).
    2. Refuse a deactivated person.
    3. Refresh the mapped groups and the link's email and time, with their events.
    """
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject or len(subject) > MAX_CLAIM_CHARS:
        raise SuspiciousOperation("The ID token has no usable sub claim.")
    ip = security.client_ip(request)
    seen = {"issuer": issuer, "subject": subject, "ip": ip}
    try:
        with transaction.atomic():
            link = (
                ExternalIdentity.objects.select_related("user")
                .filter(issuer=issuer, subject=subject)
                .first()
            )
            if link is None:
                person, via = _identity_new(issuer=issuer, subject=subject, claims=claims)
                link = ExternalIdentity.objects.create(
                    issuer=issuer, subject=subject, user=person, email=_text(claims.get("email"))
                )
                accounts.user_account_record(
                    user=person,
                    kind=EventKind.IDENTITY_LINKED,
                    actor=Actor.system("sso"),
                    data={"via": via, **seen},
                )
            person = link.user
            if not person.is_active:
                raise SignInRefused("Your person here is deactivated.")
            changed = groups_sync(user=person, claims=claims)
            if changed["added"] or changed["removed"]:
                accounts.user_account_record(
                    user=person,
                    kind=EventKind.GROUPS_SYNCED,
                    actor=Actor.system("sso"),
                    data={**changed, "issuer": issuer},
                )
            link.email = _text(claims.get("email"))
            link.last_sign_in_at = timezone.now()
            link.save(update_fields=["email", "last_sign_in_at"])
            return person
    except SignInRefused as refusal:
        known = ExternalIdentity.objects.filter(issuer=issuer, subject=subject).first()
        _refusal_record(
            user=known.user if known else None,
            reason=str(refusal),
            data={**seen, "email": _text(claims.get("email"))},
        )
        raise


def identity_link(*, user: Person, subject: str, actor: Actor) -> None:
    """An operator links ``user`` to the provider's account ``subject`` (its ``sub``): for
    a superuser or staff person, never linked by email, and for anyone whose email
    differs at the provider. ValueError when the account or the person is linked."""
    issuer = settings.OIDC_ISSUER
    if not issuer:
        raise ValueError("OIDC_ISSUER is not set.")
    if not subject or len(subject) > MAX_CLAIM_CHARS:
        raise ValueError("Give the provider's sub of the account (its subject identifier).")
    with transaction.atomic():
        if ExternalIdentity.objects.filter(issuer=issuer, subject=subject).exists():
            raise ValueError(f"The account {subject} is linked already.")
        if ExternalIdentity.objects.filter(issuer=issuer, user=user).exists():
            raise ValueError(f"{user.get_username()} is linked to another account already.")
        ExternalIdentity.objects.create(issuer=issuer, subject=subject, user=user)
        accounts.user_account_record(
            user=user,
            kind=EventKind.IDENTITY_LINKED,
            actor=actor,
            data={"via": "operator", "issuer": issuer, "subject": subject},
        )


# --- the backend and the views -----------------------------------------------------------


class OIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's code flow, configured from discovery at the first sign-in,
    that also checks the ID token's issuer, audience and expiry, and finds people by
    (issuer, sub).

    Django makes a backend for every sign-in and every request's session, so nothing is
    fetched here until a callback from the provider arrives.
    """

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.UserModel = get_user_model()

    def authenticate(self, request: Any, **kwargs: Any) -> Person | None:
        # Only the callback view passes a nonce; a password sign-in passes a username.
        if not enabled() or request is None or "nonce" not in kwargs:
            return None
        super().__init__()
        return super().authenticate(request, **kwargs)

    def get_user(self, user_id: Any) -> Person | None:
        # Django's check, which mozilla-django-oidc's lacks: a deactivated person's
        # session is nobody's.
        return ModelBackend.get_user(self, user_id)

    def verify_token(self, token: str, **kwargs: Any) -> dict[str, Any]:
        payload = super().verify_token(token, **kwargs)
        if payload.get("iss") != settings.OIDC_ISSUER:
            raise SuspiciousOperation("The ID token comes from another issuer.")
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if settings.OIDC_CLIENT_ID not in audiences:
            raise SuspiciousOperation("The ID token is for another client.")
        if len(audiences) > 1 and payload.get("azp") != settings.OIDC_CLIENT_ID:
            # OpenID Connect Core 3.1.3.7: a token for several audiences names its party.
            raise SuspiciousOperation("The ID token was issued to another party.")
        if "exp" not in payload:
            raise SuspiciousOperation("The ID token has no expiry.")
        return payload

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]):
        userinfo = self.get_userinfo(access_token, id_token, payload)
        if not isinstance(userinfo, dict) or userinfo.get("sub") != payload.get("sub"):
            raise SuspiciousOperation("The userinfo answer is about someone else.")
        # The ID token's claims (issuer, sub) win over the userinfo answer's.
        claims = {**userinfo, **payload}
        # Only the ID token's own amr / acr count (signed by the provider for this sign-in).
        self.request.sso_second_factor = second_factor_asserted(payload)
        try:
            return identity_sign_in(request=self.request, issuer=payload["iss"], claims=claims)
        except SignInRefused as refusal:
            messages.error(self.request, str(refusal))
            raise PermissionDenied(str(refusal)) from refusal


def second_factor_asserted(claims: dict[str, Any]) -> str:
    """The amr or acr value by which the ID token asserts a second factor that the
    settings accept, or "" (``OIDC_SECOND_FACTOR_AMR``, ``OIDC_SECOND_FACTOR_ACR``)."""
    methods = claims.get("amr")
    if isinstance(methods, list):
        for method in methods:
            if isinstance(method, str) and method in settings.OIDC_SECOND_FACTOR_AMR:
                return f"amr:{method}"
    context = claims.get("acr")
    if isinstance(context, str) and context in settings.OIDC_SECOND_FACTOR_ACR:
        return f"acr:{context}"
    return ""


def second_factor_record(request: HttpRequest) -> None:
    """After a sign-in whose ID token asserted a second factor: this session counts as
    verified (``security.session_verified``), with its event."""
    # Each sign-in says anew: a later one without the assertion keeps no earlier mark.
    request.session.pop(security.SSO_SECOND_FACTOR, None)
    asserted = getattr(request, "sso_second_factor", "")
    if not asserted or not request.user.is_authenticated:
        return
    request.session[security.SSO_SECOND_FACTOR] = True
    accounts.user_account_record(
        user=request.user,
        kind=EventKind.SECOND_FACTOR_VERIFIED,
        actor=Actor.system("sso"),
        data={"via": "sso", "asserted": asserted[:100]},
    )


def _require_enabled() -> None:
    if not enabled():
        raise Http404("Single sign-on is not configured.")


class SignInStart(OIDCAuthenticationRequestView):
    """Sends the browser to the provider with a fresh state, nonce and PKCE challenge."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The parent reads the endpoints here; they are read in get(), once enabled.
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        _require_enabled()
        try:
            self.OIDC_OP_AUTH_ENDPOINT = _endpoint("authorization_endpoint")
        except (httpx.HTTPError, ImproperlyConfigured, ValueError) as exc:
            logger.warning(
                "The OpenID provider's discovery document failed: %s", type(exc).__name__
            )
            messages.error(request, "The identity provider cannot be reached. Try again later.")
            return HttpResponseRedirect(reverse("login"))
        self.OIDC_RP_CLIENT_ID = settings.OIDC_CLIENT_ID
        return super().get(request)


class SignInCallback(OIDCAuthenticationCallbackView):
    """The provider's answer: a state this browser did not start, a code the provider
    refuses (a replayed one), a token that fails its checks, or a person we do not accept
    is refused on the sign-in page with a message and an event."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        _require_enabled()
        if not request.session.get("oidc_states"):
            # No sign-in was started in this browser: nothing to verify, record or end
            # (a link to this page must not sign anyone out or write the audit).
            if not request.user.is_authenticated:
                messages.error(request, "No sign-in was started here. Please sign in again.")
            return HttpResponseRedirect(reverse("login"))
        try:
            response = super().get(request)
        except SuspiciousOperation as exc:
            sign_in_refuse(
                request=request,
                reason=str(exc)[:200],
                message="That sign-in could not be verified. Please sign in again.",
            )
            return HttpResponseRedirect(reverse("login"))
        except (requests.RequestException, httpx.HTTPError, jwt.PyJWTError) as exc:
            # The error's text may hold the provider's answer: only its kind is kept.
            sign_in_refuse(
                request=request,
                reason=type(exc).__name__,
                message="The identity provider did not confirm that sign-in. Please sign in again.",
            )
            return HttpResponseRedirect(reverse("login"))
        second_factor_record(request)
        if not request.user.is_authenticated and not messages.get_messages(request):
            sign_in_refuse(
                request=request,
                reason=request.GET.get("error", "no code")[:100],
                message="The sign-in was not completed. Please sign in again.",
            )
        return response


def end_session_url(request: HttpRequest) -> str:
    """Where to send the browser after signing out: the provider's end-session endpoint
    (RP-initiated logout) when its discovery document names one and this session came
    from it; else nowhere ("")."""
    id_token = request.session.get(ID_TOKEN_SESSION_KEY)
    if not enabled() or not id_token:
        return ""
    try:
        endpoint = _endpoint("end_session_endpoint")
    except (httpx.HTTPError, ImproperlyConfigured, ValueError):
        return ""
    if not endpoint:
        return ""
    query = urlencode(
        {
            "id_token_hint": id_token,
            "client_id": settings.OIDC_CLIENT_ID,
            "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
        }
    )
    return f"{endpoint}?{query}"


class SignIn(LoginView):
    """The sign-in page: the provider's button when single sign-on is configured, and the
    password form (for superusers alone with ``PASSWORD_LOGIN=superusers``)."""

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        context["sso_enabled"] = enabled()
        context["sso_provider"] = settings.OIDC_PROVIDER_NAME
        context["password_for_superusers_only"] = settings.PASSWORD_LOGIN == "superusers"  # noqa: S105 (a mode)
        return context


class SignOut(LogoutView):
    """Ends the console session, then the provider's where it offers RP-initiated logout."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        provider_url = end_session_url(request)
        response = super().post(request, *args, **kwargs)
        return HttpResponseRedirect(provider_url) if provider_url else response
