"""Limits over time (docs/policies.md, Limits over time): the window's figures read under
a lock in the registration's transaction, its entries written there, and old entries
deleted by the sweep.

Exact under concurrency: on PostgreSQL each (policy, key) is a transaction-level
advisory lock taken before the window is read, so two registrations of one group read
and count one after the other, and the lock is released by their commit, after the
entry is written. On SQLite every write transaction begins ``IMMEDIATE``
(console/settings.py): registrations are serialized already.
"""

from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import connection

from ..models import Operation, PolicyWindowEntry
from ..policies import cedar
from ..policies.windows import Counted, passed
from .rows import db_datetime, insert_all

_TABLE = PolicyWindowEntry._meta.db_table
_READ = (
    # The table's name comes from the model, never from a request.
    f"SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM {_TABLE} "  # noqa: S608
    "WHERE policy_id = %s AND key = %s AND at > %s"
)


def windows_judge_locked(entries: Sequence[Counted], *, now: datetime) -> list[tuple[Counted, str]]:
    """The windows this registration passes, each with its figure in words.

    1. Lock every (policy, key) it counts in, in one order (two registrations counting
       in the same two windows cannot wait for each other).
    2. Read each window's count and sum with one indexed query, in a statement after
       the lock: under READ COMMITTED each statement sees what was committed when it
       began, so a read in the lock's own statement could miss the entry of the
       registration it waited for.
    3. Add this registration and compare with the bounds.

    Runs inside the registration's transaction, before anything of it is written; the
    entries are written by ``window_entries_insert`` in the same transaction.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for lock_key in sorted({entry.lock_key for entry in entries}):
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [lock_key])
    passes = []
    with connection.cursor() as cursor:
        for entry in entries:
            since = db_datetime(now - timedelta(seconds=entry.window.seconds))
            cursor.execute(_READ, [entry.policy.policy_id, entry.key, since])
            count, total = cursor.fetchone()
            figure = passed(entry, count=int(count) + 1, total=Decimal(str(total)) + entry.amount)
            if figure is not None:
                passes.append((entry, figure))
    return passes


def window_entries_insert(op: Operation, entries: Sequence[Counted], *, now: datetime) -> None:
    """Count a registration, once it is written, in every window it was judged in."""
    insert_all(
        *(
            PolicyWindowEntry(
                policy_id=entry.policy.policy_id,
                key=entry.key,
                at=now,
                amount=entry.amount,
                operation=op,
            )
            for entry in entries
        )
    )


def window_entries_delete_expired(
    policies: Sequence[cedar.Policy], *, now: datetime, limit: int = 5000
) -> int:
    """Delete up to ``limit`` entries older than the longest window of ``policies``
    (the policies in force and in shadow), or than the longest window any policy may
    have when none has one: no window they could count in still holds them."""
    windows = [p.window.seconds for p in policies if p.window is not None]
    longest = max(windows, default=cedar.MAX_WINDOW_S)
    before = now - timedelta(seconds=longest)
    old = PolicyWindowEntry.objects.filter(at__lte=before).order_by("at")
    ids = list(old.values_list("pk", flat=True)[:limit])
    if not ids:
        return 0
    deleted, _ = PolicyWindowEntry.objects.filter(pk__in=ids).delete()
    return deleted
