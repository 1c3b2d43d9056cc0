"""People's own security events: sign-ins, sign-outs, second factors, ended sessions.

Audited like every other action, on the person's stream ``user:<pk>`` of the ledger
(``operations.services.event_append``); they change no operation, so they live on the
console's side, beside the sign-in signals (``signals.py``) and the account pages.
"""

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from approvals.people import Person
from operations.machine import EventKind
from operations.models import Event
from operations.services import Actor, event_append

SESSION_EVENT_KINDS = frozenset({EventKind.SIGNED_IN, EventKind.SIGNED_OUT})
ACCOUNT_EVENT_KINDS = frozenset(
    {
        EventKind.SECOND_FACTOR_ADDED,
        EventKind.SECOND_FACTOR_VERIFIED,
        EventKind.SECOND_FACTOR_FAILED,
        EventKind.SESSIONS_ENDED,
        EventKind.IDENTITY_LINKED,
        EventKind.GROUPS_SYNCED,
        EventKind.SIGN_IN_REFUSED,
    }
)


def _append(*, user: Person, kind: str, actor: Actor, data: dict[str, Any]) -> Event:
    with transaction.atomic():
        # The person's row is the stream's lock: two sign-ins at once append in turn.
        get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
        return event_append(stream=f"user:{user.pk}", kind=EventKind(kind), actor=actor, data=data)


def user_session_record(*, user: Person, kind: str, ip: str = "", via: str = "") -> Event:
    """Append ``signed_in`` or ``signed_out`` to the person's stream; ``via`` names a
    sign-in that was not by password (``"sso"``)."""
    if kind not in SESSION_EVENT_KINDS:
        raise ValueError(f"Not a session event: {kind!r}.")
    data: dict[str, Any] = {"ip": ip or None}
    if via:
        data["via"] = via
    return _append(user=user, kind=kind, actor=Actor.of_user(user), data=data)


def user_account_record(
    *, user: Person, kind: str, actor: Actor | None = None, data: dict[str, Any] | None = None
) -> Event:
    """Append an account security event (second factor, sessions ended) to the person's
    stream; ``actor`` is the person unless someone else acted."""
    if kind not in ACCOUNT_EVENT_KINDS:
        raise ValueError(f"Not an account event: {kind!r}.")
    return _append(user=user, kind=kind, actor=actor or Actor.of_user(user), data=data or {})
