"""Console sign-ins and sign-outs become audit events (``user:<pk>`` streams)."""

from typing import Any

from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.dispatch import receiver

from operations import services


def _ip(request: Any) -> str:
    return (getattr(request, "META", None) or {}).get("REMOTE_ADDR", "") or ""


@receiver(user_logged_in, dispatch_uid="console.signed_in")
def _signed_in(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    services.user_session_record(user=user, kind="signed_in", ip=_ip(request))


@receiver(user_logged_out, dispatch_uid="console.signed_out")
def _signed_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    # Signing out without a session (an expired one) has nobody to record.
    if user is not None and user.is_authenticated:
        services.user_session_record(user=user, kind="signed_out", ip=_ip(request))
