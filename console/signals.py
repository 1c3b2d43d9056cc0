"""Console sign-ins and sign-outs become audit events (``user:<pk>`` streams); sign-in
starts the session clocks; deactivating a person ends their sessions."""

import logging
from typing import Any

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import post_save, pre_save
from django.dispatch import receiver

from approvals.people import Person
from operations.machine import EventKind
from operations.services import Actor

from . import accounts, security

logger = logging.getLogger("console.security")


def _ip(request: Any) -> str:
    return security.client_ip(request) if request is not None else ""


@receiver(user_logged_in, dispatch_uid="console.signed_in")
def _signed_in(sender: Any, request: Any, user: Person, **kwargs: Any) -> None:
    if request is not None and hasattr(request, "session"):
        security.session_start(request.session)
    via = "sso" if getattr(user, "backend", "") == "console.sso.OIDCBackend" else ""
    accounts.user_session_record(user=user, kind=EventKind.SIGNED_IN, ip=_ip(request), via=via)


@receiver(user_logged_out, dispatch_uid="console.signed_out")
def _signed_out(sender: Any, request: Any, user: Person | None, **kwargs: Any) -> None:
    # Signing out without a session (an expired one) has nobody to record.
    if user is not None and user.is_authenticated:
        accounts.user_session_record(user=user, kind=EventKind.SIGNED_OUT, ip=_ip(request))


@receiver(user_login_failed, dispatch_uid="console.sign_in_failed")
def _sign_in_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any):
    # Django hands over the credentials with the password already masked; only the
    # username and the address are logged, never what was typed as a password.
    logger.warning(
        "Sign-in failed for username %r from %s",
        str(credentials.get("username", ""))[:150],
        _ip(request) or "an unknown address",
    )


@receiver(pre_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="console.deactivating")
def _note_deactivation(sender: Any, instance: Any, **kwargs: Any) -> None:
    instance._eg_deactivated = security.is_active_changed_to_false(instance)


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="console.deactivated")
def _end_sessions_of_deactivated(sender: Any, instance: Any, **kwargs: Any) -> None:
    # A deactivated person is signed out everywhere at once, not at their next request.
    if getattr(instance, "_eg_deactivated", False):
        instance._eg_deactivated = False
        ended = security.sessions_end_for_user(instance)
        accounts.user_account_record(
            user=instance,
            kind=EventKind.SESSIONS_ENDED,
            actor=Actor.system("deactivation"),
            data={"sessions": ended},
        )
