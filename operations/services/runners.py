"""Runner accounts and their API tokens (hashed at rest, shown once)."""

import hashlib
import secrets
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from approvals.people import Person

from .. import access, errors, tokencache
from ..machine import EventKind
from ..models import (
    Runner,
    RunnerToken,
)
from .core import (
    Actor,
    event_append,
)

TOKEN_PREFIX = "egr_"  # noqa: S105 (a recognisable prefix, not a secret)
LAST_USE_EVERY = timedelta(minutes=1)


def _token_hash(token: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough: nobody can guess one from
    # its hash, and lookups stay a single indexed equality.
    return hashlib.sha256(token.encode()).hexdigest()


def runner_create(*, name: str, owner: Person | None = None, actor: Actor) -> tuple[Runner, str]:
    """Create a runner account and its first token. The token is returned only here."""
    user_model = get_user_model()
    with transaction.atomic():
        service_user = user_model.objects.create(username=f"runner:{name}", is_active=True)
        service_user.set_unusable_password()
        service_user.save(update_fields=["password"])
        runner = Runner.objects.create(name=name, owner=owner, service_user=service_user)
        event_append(
            stream=f"runner:{runner.id}",
            kind=EventKind.RUNNER_CREATED,
            actor=actor,
            data={
                "runner": runner.id,
                "name": name,
                "owner": owner.get_username() if owner else None,
            },
        )
        token = _token_issue(runner=runner, scopes=RunnerToken.ALL_SCOPES, actor=actor)
    return runner, token


def _token_issue(
    *,
    runner: Runner,
    scopes: list[str],
    actor: Actor,
    label: str = "",
    expires_at: datetime | None = None,
) -> str:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = RunnerToken.objects.create(
        runner=runner,
        token_hash=_token_hash(token),
        prefix=token[:12],
        scopes=sorted(scopes),
        label=label,
        expires_at=expires_at,
    )
    event_append(
        stream=f"runner:{runner.id}",
        kind=EventKind.TOKEN_CREATED,
        actor=actor,
        data={"token": record.id, "prefix": record.prefix, "scopes": record.scopes},
    )
    return token


def token_create(
    *,
    runner: Runner,
    actor: Actor,
    scopes: list[str] | None = None,
    label: str = "",
    expires_at: datetime | None = None,
) -> str:
    with transaction.atomic():
        Runner.objects.select_for_update().get(pk=runner.pk)
        return _token_issue(
            runner=runner,
            scopes=scopes or RunnerToken.ALL_SCOPES,
            actor=actor,
            label=label,
            expires_at=expires_at,
        )


def token_revoke(*, token: RunnerToken, actor: Actor) -> RunnerToken:
    """Revoke a token. Every process refuses it from the next request on: the update
    moves the token generation (a trigger, migration 0005) in this transaction."""
    with transaction.atomic():
        Runner.objects.select_for_update().get(pk=token.runner_id)
        changed = RunnerToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if changed:
            event_append(
                stream=f"runner:{token.runner_id}",
                kind=EventKind.TOKEN_REVOKED,
                actor=actor,
                data={"token": token.pk, "prefix": token.prefix},
            )
    token.refresh_from_db()
    return token


def token_authenticate(raw: str) -> tuple[Runner, RunnerToken] | None:
    """The runner a bearer token belongs to, if the token is valid now.

    With the token cache on (``RUNNER_TOKEN_CACHE_S``, PostgreSQL), a token read in the
    last seconds costs one trivial read (the token generation) instead of the lookup;
    operations/tokencache.py says why a revoked token is still refused at once.
    """
    key = _token_hash(raw)
    tokencache.seen_forget()
    generation = tokencache.generation_read() if tokencache.enabled() else None
    token = None
    if generation is not None:
        token = tokencache.tokens.get(key, generation=generation, ttl=settings.RUNNER_TOKEN_CACHE_S)
    if token is None:
        token = RunnerToken.objects.select_related("runner").filter(token_hash=key).first()
        if token is None:
            return None
        if generation is not None:
            # Stored under the generation read before the row: if anything changed in
            # between, the entry is already stale and never used.
            tokencache.tokens.put(key, token, generation=generation)
    now = timezone.now()
    if token.revoked_at is not None or not token.runner.is_active:
        return None
    if token.expires_at is not None and token.expires_at <= now:
        return None
    # Record use at most once a minute: a write per request would cost more than it
    # tells. Each process remembers its own last write, so the condition keeps several
    # processes from writing in the same minute.
    if token.last_used_at is None or now - token.last_used_at > LAST_USE_EVERY:
        RunnerToken.objects.filter(pk=token.pk).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USE_EVERY)
        ).update(last_used_at=now)
        token.last_used_at = now
        if generation is not None:
            tokencache.tokens.note_use(key, now, generation=generation)
    return token.runner, token


def token_issue_by_user(
    *,
    runner: Runner,
    user: Person,
    scopes: list[str],
    label: str = "",
    expires_at: datetime | None = None,
) -> str:
    """A person issues a token from the console; it is returned only here."""
    access.require_manage_runners(user)
    unknown = set(scopes) - set(RunnerToken.ALL_SCOPES)
    if not scopes or unknown:
        raise errors.InvalidRequest(f"Choose scopes among {', '.join(RunnerToken.ALL_SCOPES)}.")
    if expires_at is not None and expires_at <= timezone.now():
        raise errors.InvalidRequest("The expiry must be in the future.")
    return token_create(
        runner=runner, actor=Actor.of_user(user), scopes=scopes, label=label, expires_at=expires_at
    )


def token_revoke_by_user(*, token: RunnerToken, user: Person) -> RunnerToken:
    """A person revokes a token from the console; the next request with it is 401."""
    access.require_manage_runners(user)
    return token_revoke(token=token, actor=Actor.of_user(user))


RUNNER_EDITABLE = ("owner", "restrict_tools", "is_active")


def runner_update(*, runner: Runner, user: Person, changes: dict[str, Any]) -> Runner:
    """A person changes a runner's owner, tool restriction or activity (the admin).

    Each matters to access: the owner is barred from deciding on the runner's
    operations, a restricted runner invokes only the tools granted to it, an inactive
    one is refused every request. So each change is an event on the runner's stream.
    """
    access.require_manage_runners(user)
    unknown = set(changes) - set(RUNNER_EDITABLE)
    if unknown:
        raise errors.InvalidRequest(f"Only {', '.join(RUNNER_EDITABLE)} can be changed.")

    def shown(value: Any) -> Any:
        return value.get_username() if hasattr(value, "get_username") else value

    with transaction.atomic():
        runner = Runner.objects.select_for_update().get(pk=runner.pk)
        changed = {
            field: {"from": shown(getattr(runner, field)), "to": shown(value)}
            for field, value in changes.items()
            if getattr(runner, field) != value
        }
        if not changed:
            return runner
        for field in changed:
            setattr(runner, field, changes[field])
        runner.save(update_fields=list(changed))
        event_append(
            stream=f"runner:{runner.id}",
            kind=EventKind.RUNNER_UPDATED,
            actor=Actor.of_user(user),
            data={"runner": runner.id, "changes": changed},
        )
    return runner
