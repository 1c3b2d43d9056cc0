"""Request throttling: how many requests one runner token, or one signed-in person,
may send per period (``THROTTLE_RUNNER_RATE``, ``THROTTLE_SESSION_RATE``).

The counts live in the shared cache (``CACHES["default"]``: Redis when one is
configured, else a table in the database), so every process of a deployment counts
against the same budget.

DRF's ``SimpleRateThrottle`` keeps a list of every request's timestamp in one cache
value and rewrites it on each request: at the rates a runner legitimately reaches (tens
of thousands a minute) that is a large value read and written per request, and two
processes writing it at once lose each other's requests. The throttles here keep one
counter per identity and fixed window instead (``<scope>:<identity>:<window number>``),
incremented atomically: on Redis one ``INCRBY`` in a script (``REDIS_COUNT_LUA``), on
the database cache one ``INSERT ... ON CONFLICT DO UPDATE`` of a row in a table of
counters of its own (``DatabaseCache.window_count`` below). A fixed window admits at
most twice the rate across a window boundary; that is the price of one counter per
request.

When the cache cannot be reached the request is let through and the failure logged:
throttling protects the service from floods, and must not take the ledger down with
Redis.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
import pickle
from typing import Any

from django.conf import settings
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.db import DatabaseCache as DjangoDatabaseCache
from django.core.cache.backends.redis import RedisCache
from django.db import DatabaseError, connections, router, transaction
from django.utils.timezone import now as tz_now
from redis.exceptions import NoScriptError, RedisError
from rest_framework.throttling import SimpleRateThrottle

from ..models import RunnerToken

logger = logging.getLogger(__name__)

# The database cache's table (``CACHES`` in console/settings.py); ``migrate`` creates it
# (``cache_table_create``) whichever cache is configured, so that switching Redis off
# later needs no other step. The throttle's counters are not kept there (COUNTER_TABLE).
CACHE_TABLE = "effectgate_cache"

# The window counters on the database cache: migration 0021 creates the table (UNLOGGED
# on PostgreSQL: a crash only starts the windows' counts again). One statement per
# request, atomic under concurrency: PostgreSQL's upsert takes the row's lock and adds to
# the committed count, SQLite has one writer at a time (RETURNING needs SQLite 3.35).
COUNTER_TABLE = "operations_throttle_count"
COUNT_SQL = (
    f"INSERT INTO {COUNTER_TABLE} (key, count, expires) VALUES (%s, %s, %s) "  # noqa: S608
    f"ON CONFLICT (key) DO UPDATE SET count = {COUNTER_TABLE}.count + EXCLUDED.count "
    "RETURNING count"
)
# How often each thread's cache instance deletes the counters whose windows are over (at
# most, and only while it counts requests): see ``DatabaseCache.window_count``.
SWEEP_EVERY_S = 60


# The window's counter on Redis in one round trip: INCRBY, and on the window's first
# request (the count is then ``delta``: counts only grow) its expiry, in one script, so
# that no key is left without one. The key outlives its window (two periods), so a
# process whose clock runs a little behind still counts in it. Django's ``incr`` would be
# EXISTS and INCRBY, and SET NX on a window's first request: two or three round trips.
# The value is an integer, as Django's Redis serializer stores one: ``cache.get`` reads it.
REDIS_COUNT_LUA = """
local count = redis.call("INCRBY", KEYS[1], ARGV[1])
if count == tonumber(ARGV[1]) then
    redis.call("EXPIRE", KEYS[1], ARGV[2])
end
return count
"""


@functools.cache
def _script_sha(script: str) -> str:
    """The name Redis gives ``script`` (SHA-1 of its text, not a security use)."""
    return hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()


def redis_window_count(store: RedisCache, key: str, *, delta: int, timeout: int) -> int:
    """The counter ``key`` of ``store`` incremented by ``delta``: one ``EVALSHA``; when
    Redis does not hold the script (its first use, a restart), it is loaded and the
    count sent again."""
    full = store.make_and_validate_key(key)
    # Django's Redis client (no public accessor); tests/operations/test_throttling.py
    # counts through it against a real Redis.
    client = store._cache.get_client(full, write=True)  # type: ignore[attr-defined]
    script = REDIS_COUNT_LUA
    try:
        return int(client.evalsha(_script_sha(script), 1, full, delta, timeout))
    except NoScriptError:
        client.script_load(script)
        return int(client.evalsha(_script_sha(script), 1, full, delta, timeout))


class WindowRateThrottle(SimpleRateThrottle):
    """A ``SimpleRateThrottle`` that counts per fixed window (see the module's docstring).

    ``rate_setting`` names the Django setting that holds the rate (``"100/min"``; empty:
    no limit), read per request so that a changed setting applies at once.
    """

    rate_setting = ""
    # Requests this one counts for: a batch of N items counts N (api.md, Batches).
    cost = 1

    def get_rate(self) -> str | None:
        return getattr(settings, self.rate_setting, None) or None

    def allow_request(self, request: Any, view: Any) -> bool:
        limit, period = self.parse_rate(self.rate)
        if limit is None or period is None:
            return True
        identity = self.get_cache_key(request, view)
        if identity is None:
            return True
        self.now = self.timer()
        window = int(self.now // period)
        self.window_end = float((window + 1) * period)
        try:
            count = self._count(f"{identity}:{window}", period=period, delta=self.cost)
        except (DatabaseError, RedisError):
            logger.warning("request throttling skipped: the cache did not answer", exc_info=True)
            return True
        return count <= limit

    def _count(self, key: str, *, period: int, delta: int = 1) -> int:
        """This request's number in its window (its last, when it counts for several):
        the window's counter, incremented by ``delta``."""
        store = caches[DEFAULT_CACHE_ALIAS]  # what ``self.cache`` stands for
        if isinstance(store, DatabaseCache):
            # The row outlives its window by one period: a process whose clock runs a
            # little behind still counts in it.
            expires = int(self.window_end) + period
            return store.window_count(key, delta=delta, expires=expires, now=self.now)
        if isinstance(store, RedisCache):
            return redis_window_count(store, key, delta=delta, timeout=2 * period)
        try:
            return self.cache.incr(key, delta)
        except ValueError:
            # The window's first request. The key outlives its window so that it cannot
            # expire between EXISTS and INCR while the window still counts.
            if self.cache.add(key, delta, timeout=2 * period):
                return delta
            return self.cache.incr(key, delta)

    def wait(self) -> float:
        """Seconds until the window ends and the count starts again."""
        return max(0.0, self.window_end - self.now)


class RunnerRateThrottle(WindowRateThrottle):
    """Every API request made with one runner token, whatever the endpoint (the hot
    path's register and outcome included: both are DRF views)."""

    scope = "runner"
    rate_setting = "THROTTLE_RUNNER_RATE"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        token = getattr(request, "auth", None)
        if not isinstance(token, RunnerToken):
            return None  # no runner token: the inbound endpoint, or a refused request
        return f"throttle:runner:{token.pk}"


class PersonRateThrottle(WindowRateThrottle):
    """The console's POSTs by one signed-in person (console.middleware)."""

    scope = "session"
    rate_setting = "THROTTLE_SESSION_RATE"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        return f"throttle:person:{user.pk}"


class DatabaseCache(DjangoDatabaseCache):
    """Django's database cache with an atomic ``incr`` of two statements, and the
    throttle's window counters in a table of their own (``window_count``).

    Django's own ``incr`` is a ``get`` and a ``set``: six statements and a transaction
    (the ``set`` counts the table and reads the row again), and two processes
    incrementing at once both write the same value, so counts are lost under exactly
    the load a throttle is for. Here it is one read and one compare-and-set ``UPDATE``
    that applies only if the value is still the one read. When another process changed
    it in between, the increment is made again under the row's lock (a transaction
    with ``SELECT ... FOR UPDATE``; on SQLite every transaction holds the write lock),
    which cannot lose. (console/slack.py counts with it; the throttle has ``window_count``.)
    """

    # When this instance (one per thread: Django's ``caches``) next deletes the counters
    # whose windows are over, on the throttle's clock.
    _sweep_after = 0.0

    def window_count(self, key: str, *, delta: int, expires: int, now: float) -> int:
        """The throttle's counter ``key`` incremented by ``delta`` (created at ``delta``
        when its window has none yet): one statement, ``COUNT_SQL``.

        The key names its window, so a row past ``expires`` (Unix seconds) is only left
        over, never counted again. Each instance deletes those once every
        ``SWEEP_EVERY_S`` on its first count after that time: one ``DELETE`` (through
        the index on ``expires``) per thread and minute, rather than a statement on every
        request, or on the first request of each window of each token. It needs no
        scheduler (a deployment without Redis may run no Celery beat either): whatever
        process writes counters also removes the old ones. The next time is set before
        the ``DELETE``: one that fails (its request goes through, logged) is not tried
        again on every request, but a minute later.
        """
        alias = router.db_for_write(self.cache_model_class)
        with connections[alias].cursor() as cursor:
            cursor.execute(COUNT_SQL, [key, delta, expires])
            (count,) = cursor.fetchone()
            if now >= self._sweep_after:
                self._sweep_after = now + SWEEP_EVERY_S
                cursor.execute(
                    f"DELETE FROM {COUNTER_TABLE} WHERE expires <= %s",  # noqa: S608
                    [int(now)],
                )
        return int(count)

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        key = self.make_and_validate_key(key, version=version)
        alias = router.db_for_write(self.cache_model_class)
        connection = connections[alias]
        if (value := self._incr(connection, key, delta, lock=False)) is not None:
            return value
        with transaction.atomic(using=alias):
            value = self._incr(connection, key, delta, lock=True)
        if value is None:  # the row is locked: nothing can change it in between
            raise DatabaseError(f"The cache's {key!r} changed under its lock.")
        return value

    def _incr(self, connection: Any, key: str, delta: int, *, lock: bool) -> int | None:
        """The new value, or None when another process changed the value first."""
        quote = connection.ops.quote_name
        table = quote(self.cache_model_class._meta.db_table)
        # Expiry is compared as Django's ``has_key`` compares it.
        now = connection.ops.adapt_datetimefield_value(tz_now().replace(microsecond=0, tzinfo=None))
        for_update = " FOR UPDATE" if lock and connection.features.has_select_for_update else ""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {quote('value')} FROM {table} "  # noqa: S608 (quoted names)
                f"WHERE {quote('cache_key')} = %s AND {quote('expires')} > %s{for_update}",
                [key, now],
            )
            row = cursor.fetchone()
            if row is None:
                raise ValueError(f"Key {key!r} not found.")
            stored = connection.ops.process_clob(row[0])
            # The cache's own encoding (base64 of a pickle), as Django's get and set use.
            value = pickle.loads(base64.b64decode(stored.encode())) + delta  # noqa: S301 (our rows)
            encoded = base64.b64encode(pickle.dumps(value, self.pickle_protocol)).decode("latin1")
            cursor.execute(
                f"UPDATE {table} SET {quote('value')} = %s "  # noqa: S608 (quoted names)
                f"WHERE {quote('cache_key')} = %s AND {quote('value')} = %s",
                [encoded, key, stored],
            )
            return value if cursor.rowcount == 1 else None


def cache_table_create(*, using: str) -> None:
    """Create the database cache's table unless it exists (after every ``migrate``)."""
    from django.core.management.commands.createcachetable import Command

    command = Command()
    command.verbosity = 0
    command.create_table(using, CACHE_TABLE, dry_run=False)
