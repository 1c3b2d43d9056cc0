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
        if settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
            self._lock_connection = _take_lock()
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        now = time.monotonic()
        if self._lock_connection is not None and now - self._checked_at >= CHECK_EVERY_S:
            self._checked_at = now
            try:
                with self._lock_connection.cursor() as cursor:
                    cursor.execute("SELECT 1")
            except Exception:
                logger.error("The beat lock's connection was lost; exiting (restart me).")
                raise SystemExit(1) from None
        return super().tick(*args, **kwargs)


def _take_lock() -> Any:
    """A connection of its own that holds the beat lock (waits for it)."""
    import psycopg

    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    params.pop("server_side_binding", None)
    connection = psycopg.connect(autocommit=True, **params)
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
