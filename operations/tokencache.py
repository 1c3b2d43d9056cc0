"""Runner tokens remembered for a few seconds by each process, revoked everywhere at once.

Without this, every API request joins the token and its runner to authenticate. Here
each process remembers the rows it read, keyed by the token's SHA-256, for
``RUNNER_TOKEN_CACHE_S`` seconds (and at most ``MAX_ENTRIES`` tokens), and trusts them
only while the *token generation* is still the value it was when they were read.

The token generation is a one-row table that PostgreSQL triggers set, in the same
transaction, on every change that could make a remembered row wrong: a token revoked or
its scopes or expiry changed, a runner deactivated or otherwise changed, either deleted
(migration 0005 lists them). Each request reads the generation first.

What "at once" means: a request that starts after the revoking transaction committed
(after ``token_revoke`` returned to its caller) is refused, by every process. A request
already under way when the commit happened may still be served, as without a cache.

1. The request reads the generation in a statement that starts after the commit, on the
   primary; under READ COMMITTED that statement's snapshot includes the commit, so it
   reads the new value, in whichever process it lands.
2. An entry is used only if it was stored under exactly that value. Entries are stored
   under the generation read *before* their row was read, so a revocation committed
   between the two reads leaves the entry under an older value: it is never used.
3. Values never repeat (each is a transaction id), so an old entry cannot match again.

Why not LISTEN/NOTIFY: a notification reaches the other processes some time after the
commit, and nothing makes a request in another process wait for it; that process would
serve the revoked token from its cache in the meantime. Closing that window needs either
the revoker to wait for every process (which may be stuck or gone) or each request to ask
the database something; the generation read is the cheapest such question.

Why it is still cheaper than the lookup: the read is a fixed statement sent without the
ORM (no query compilation, no model rows built), on a one-row table. And it takes the
place of a statement every request pays anyway: Django checks a reused connection with
``SELECT 1`` before the request's first query (``CONN_HEALTH_CHECKS``); the generation
read is as good a check, so when that check is due it runs instead of it. A remembered
token then costs no round trip to the database beyond what the request already paid.
"""

import copy
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model

from .models import Runner, RunnerToken

MAX_ENTRIES = 4096
# The same row holds the policy generation (migration 0014): read with the token
# generation, so the policies in force cost a registration no statement of their own.
GENERATION_SQL = "SELECT value, policies FROM operations_token_generation WHERE id = 1"
POLICY_GENERATION_SQL = "SELECT policies FROM operations_token_generation WHERE id = 1"
_seen = threading.local()


def enabled() -> bool:
    """On PostgreSQL with a positive ``RUNNER_TOKEN_CACHE_S``; the triggers exist only there."""
    return (
        settings.RUNNER_TOKEN_CACHE_S > 0 and connections[DEFAULT_DB_ALIAS].vendor == "postgresql"
    )


def generation_read() -> int | None:
    """The current token generation, read now; None if its row is missing (someone
    deleted it), and then nothing remembered may be trusted."""
    connection = connections[DEFAULT_DB_ALIAS]
    row = _read_as_health_check(connection)
    if row is None:
        with connection.cursor() as cursor:
            cursor.execute(GENERATION_SQL)
            row = cursor.fetchone() or (None, None)
    _seen.policies = row[1]
    return row[0]


def seen_forget() -> None:
    """Forget the policy generation an earlier request's read brought (a request that
    reads no token generation must not use another request's)."""
    _seen.policies = None


def policy_generation() -> int | None:
    """The policy generation: the value this request's token generation read brought
    (taken once, or kept while ``policy_generation_held``), else read now. None on
    SQLite, where the table does not exist."""
    held = getattr(_seen, "held", False)
    seen = getattr(_seen, "policies", None)
    if not held:
        _seen.policies = None
    if seen is not None:
        return int(seen)
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(POLICY_GENERATION_SQL)
        row = cursor.fetchone()
    generation = None if row is None else int(row[0])
    if held:
        _seen.policies = generation
    return generation


@contextmanager
def policy_generation_held() -> Iterator[None]:
    """Within: one policy generation serves every registration (a batch's items, one
    request: a change committed before the request began is seen by all of them)."""
    _seen.held = True
    try:
        yield
    finally:
        _seen.held = False
        _seen.policies = None


def _read_as_health_check(connection: Any) -> tuple[Any, ...] | None:
    """The generation, read as the connection's health check when one is due, else None.

    This is what Django's ``close_if_health_check_failed`` does with ``SELECT 1``, with
    our statement: on a database error the connection is closed (the caller's query then
    opens a new one, as after a failed check); on success the check counts as done.
    """
    if (
        connection.vendor != "postgresql"
        or connection.connection is None
        or not getattr(connection, "health_check_enabled", False)
        or getattr(connection, "health_check_done", True)
    ):
        return None
    try:
        with connection.connection.cursor() as cursor:
            cursor.execute(GENERATION_SQL)
            row = cursor.fetchone() or (None, None)
    except psycopg.Error:
        connection.close()
        return None
    connection.health_check_done = True
    return row


@dataclass(frozen=True)
class _Entry:
    generation: int
    stored_at: float
    token: tuple[Any, ...]
    runner: tuple[Any, ...]


def _copied(values: Any) -> tuple[Any, ...]:
    # Scopes are a list: neither a request nor the cache may change the other's.
    return tuple(copy.deepcopy(v) if isinstance(v, list | dict) else v for v in values)


def _values(instance: Model) -> tuple[Any, ...]:
    return _copied(getattr(instance, field.attname) for field in instance._meta.concrete_fields)


def _build(model: type[Model], values: tuple[Any, ...]) -> Any:
    # Fresh instances for each request: a view may cache things on them (a related
    # object, a permission cache) that must not outlive the request.
    names = [field.attname for field in model._meta.concrete_fields]
    return model.from_db(DEFAULT_DB_ALIAS, names, _copied(values))


class TokenCache:
    """Token rows by token hash, valid under one generation; least recently used first out.

    Thread-safe: gunicorn's threaded workers share one per process.
    """

    def __init__(
        self, max_entries: int = MAX_ENTRIES, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_entries = max_entries
        # Monotonic: an entry's age does not jump when the wall clock is set.
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._generation: int | None = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, *, generation: int, ttl: float) -> RunnerToken | None:
        """The remembered token (its runner loaded), if stored under ``generation`` less
        than ``ttl`` seconds ago."""
        with self._lock:
            if generation != self._generation:
                # Something changed: nothing stored before is trusted again.
                self._entries.clear()
                self._generation = generation
                return None
            entry = self._entries.get(key)
            if entry is None:
                return None
            if self.clock() - entry.stored_at >= ttl:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
        token = _build(RunnerToken, entry.token)
        token.runner = _build(Runner, entry.runner)
        return token

    def put(self, key: str, token: RunnerToken, *, generation: int) -> None:
        """Remember a token row (and its runner's) read after ``generation`` was."""
        entry = _Entry(generation, self.clock(), _values(token), _values(token.runner))
        with self._lock:
            if self._generation is None:
                self._generation = generation
            if generation != self._generation:
                return
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def note_use(self, key: str, last_used_at: datetime, *, generation: int) -> None:
        """Remember a new ``last_used_at``, keeping the entry's age."""
        field = RunnerToken._meta.get_field("last_used_at")
        index = RunnerToken._meta.concrete_fields.index(field)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.generation != generation:
                return
            token = (*entry.token[:index], last_used_at, *entry.token[index + 1 :])
            self._entries[key] = replace(entry, token=token)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._generation = None


tokens = TokenCache()
