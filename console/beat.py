"""One beat at a time: ``celery -A console beat`` takes a PostgreSQL advisory lock
before it sends anything, and holds it on its own connection while it runs.

A second beat (by mistake, or a standby) waits for the lock and takes over within a
second or two of the first one dying: PostgreSQL releases a session's advisory locks
when its connection ends, also when the process is killed. The leader checks its
connection every few seconds and exits when it is lost (the lock may be another's by
then); a supervisor restarts it, and it waits its turn. Every task is idempotent
anyway (it claims its rows), so this keeps the wake-ups single, not the correctness.

On SQLite (the local mode) there is no beat process: ``manage.py runlocal`` runs the
schedule on a thread.
"""

import logging
import os
import signal
import time
from typing import Any

from celery.beat import PersistentScheduler
from django.conf import settings
from django.db import connections

logger = logging.getLogger("console.beat")

# pg_advisory_lock keys are bigints; this one is "effectgate beat" in ASCII, truncated.
LOCK_KEY = int.from_bytes(b"egbeat01", "big") & 0x7FFF_FFFF_FFFF_FFFF
CHECK_EVERY_S = 5.0


class LeaderScheduler(PersistentScheduler):
    """Celery's persistent scheduler, run only while holding the beat lock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lock_connection = None
        self._checked_at = 0.0
        # Celery builds a lazy scheduler for its start-up banner: that one never sends.
        if not kwargs.get("lazy") and settings.DATABASES["default"]["ENGINE"].endswith(
            "postgresql"
        ):
            self._lock_connection = _take_lock()
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        now = time.monotonic()
        if self._lock_connection is not None and now - self._checked_at >= CHECK_EVERY_S:
            self._checked_at = now
            if not _still_held(self._lock_connection):
                logger.error("This beat no longer holds the beat lock; exiting (restart me).")
                logging.shutdown()
                os._exit(1)  # not SystemExit: Celery would turn it into exit status 0
        return super().tick(*args, **kwargs)


def _still_held(connection: Any) -> bool:
    """The lock is this session's (asked of PostgreSQL, not assumed from a live socket)."""
    try:
        row = connection.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
            "AND pid = pg_backend_pid() AND granted"
        ).fetchone()
    except Exception:
        return False
    return bool(row and row[0])


def _connection_params() -> dict[str, Any]:
    """Django's connection parameters, or ``BEAT_DATABASE_URL``'s (a direct connection:
    a session lock cannot live behind PgBouncer in transaction mode), with keepalives
    so that a leader whose machine vanishes loses the lock within seconds, not hours."""
    direct = os.environ.get("BEAT_DATABASE_URL")
    if direct:
        params: dict[str, Any] = {"conninfo": direct}
    else:
        params = connections["default"].get_connection_params()
        for django_only in ("cursor_factory", "context"):
            params.pop(django_only, None)
    params.update(
        prepare_threshold=None,
        connect_timeout=10,
        keepalives=1,
        keepalives_idle=10,
        keepalives_interval=5,
        keepalives_count=3,
        tcp_user_timeout=15000,
    )
    # The server side too: it drops the session (and the lock) of a vanished leader.
    params["options"] = (
        params.get("options", "") + " -c tcp_keepalives_idle=10 -c tcp_keepalives_interval=5"
        " -c tcp_keepalives_count=3 -c tcp_user_timeout=15000"
    ).strip()
    return params


def _take_lock() -> Any:
    """A connection of its own that holds the beat lock (waits for it)."""
    import psycopg

    connection = psycopg.connect(autocommit=True, **_connection_params())
    # While waiting, a stop request stops it (Celery's own handler would build another
    # scheduler, which would wait for the lock inside the handler).
    previous = {sig: signal.signal(sig, _stop_waiting) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        waited = False
        while True:
            row = connection.execute("SELECT pg_try_advisory_lock(%s)", [LOCK_KEY]).fetchone()
            if row is not None and row[0]:
                logger.warning("This beat holds the beat lock: it sends the wake-ups.")
                return connection
            if not waited:
                logger.warning("Another beat holds the beat lock: waiting to take over.")
                waited = True
            time.sleep(1.0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_waiting(signum: int, frame: Any) -> None:
    logger.warning("Stopped while waiting for the beat lock.")
    logging.shutdown()
    os._exit(0)
