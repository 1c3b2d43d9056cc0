"""The sealer: appends committed events to the transparency log, then signs a checkpoint.

1. One sealer at a time. On PostgreSQL a transaction-level advisory lock: a second
   sealer is turned away at once and does nothing (the beat already runs one at a
   time; ``audit seal`` by hand may meet it). On SQLite every transaction takes the
   database's write lock at BEGIN (IMMEDIATE), which serializes sealers as it does
   every writer.
2. Which events, in which order, so that an event committed late by a slow transaction
   is neither skipped nor sealed twice. Ids come from a sequence when a row is inserted,
   not when it commits: a transaction that inserted event 7 may still be open after
   event 8's committed, so "every id after the last sealed one" would skip 7 for good.
   On PostgreSQL every event carries the id of the transaction that inserted it
   (``txid``, the database's default, migration 0019), and ``h``, the horizon, is the
   oldest transaction the sealer's snapshot sees as not ended, its own aside: every
   other transaction below ``h`` has ended, so the events with ``txid < h`` are a set
   that can never grow, and what of it committed is visible from then on (the sealer's
   own rows, if it wrote any, are visible to it and commit or vanish with its leaves).
   The sealer takes them in ``(txid, id)`` order after the last leaf's ``(txid,
   event)``. An event of a transaction at or above ``h``, committed or still open, is
   left for a later pass, where it comes after that cursor: taken once, never skipped.
   A transaction left open anywhere on the server holds the sealing of younger events
   back until it ends; the ledger itself does not wait. Events from
   before the log existed (``txid`` NULL; their transactions ended before the migration
   took the table's lock) come first, in id order. On SQLite writers hold the lock
   from BEGIN to COMMIT, so ids are committed in order: the ids after the last leaf's.
3. Each event becomes a leaf (``tlog.leaves``); the leaves and the subtree hashes they
   complete are inserted (``tlog.merkle.TreeBuilder``, resumed from the stored right
   edge), at most ``limit`` events a pass (``SEAL_BATCH``).
4. When the tree is larger than the latest checkpoint and a signing key is configured,
   a checkpoint of the new size is signed (C2SP signed note, ``tlog.notes``), stored and
   announced with the ``audit.checkpoint`` webhook to every runner endpoint subscribed,
   in the same transaction. Without a key the leaves are appended and no checkpoint is
   written; the report says so.
"""

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.db import connection, transaction
from django.utils import timezone

from .. import payloads, selectors
from ..models import Checkpoint, Event, LogLeaf, LogNode, Runner
from ..tlog import keys, leaves, merkle, notes
from .core import outbox_enqueue_to

SEAL_BATCH = 10_000
CHECKPOINT_EVENT = "audit.checkpoint"
# pg_try_advisory_xact_lock keys are bigints; this one is "egsealer" in ASCII.
LOCK_KEY = int.from_bytes(b"egsealer", "big") & 0x7FFF_FFFF_FFFF_FFFF

# The events before the log (their txid NULL), in id order.
_BEFORE_LOG = """
SELECT id, stream, seq, hash, txid FROM operations_event
WHERE txid IS NULL AND id > %s ORDER BY id LIMIT %s
"""
# The horizon: the oldest transaction that has not ended, this one aside (the snapshot's
# in-progress list, or else its xmax, the first transaction it treats as not ended; this
# one's own id may be that xmax).
_HORIZON = """
SELECT COALESCE(
    (SELECT min(x::text::bigint) FROM pg_snapshot_xip(s) AS x),
    pg_snapshot_xmax(s)::text::bigint
        + CASE WHEN pg_snapshot_xmax(s) = pg_current_xact_id_if_assigned() THEN 1 ELSE 0 END
) FROM pg_current_snapshot() AS s
"""
# The events of transactions below the horizon, after the cursor, in (txid, id) order.
_ENDED = """
SELECT id, stream, seq, hash, txid FROM operations_event
WHERE (txid, id) > (%s, %s) AND txid < %s
ORDER BY txid, id LIMIT %s
"""


@dataclass(frozen=True)
class SealReport:
    """What one pass did: events appended, the log's size after it, the checkpoint it
    signed (or why none), and whether another sealer held the lock."""

    appended: int
    size: int
    checkpoint: Checkpoint | None = None
    unsigned: str = ""
    busy: bool = False

    def describe(self) -> str:
        if self.busy:
            return "Another sealer is running; nothing was done."
        said = f"Appended {self.appended} events; the log holds {self.size}."
        if self.checkpoint is not None:
            return f"{said} Signed checkpoint {self.checkpoint.size}."
        return f"{said} {self.unsigned}".rstrip()


def log_seal(*, limit: int = SEAL_BATCH, now: datetime | None = None) -> SealReport:
    """One pass of the sealer (see the module's steps); safe to run at any time, on any
    number of workers at once."""
    key = keys.signing_key()
    origin = keys.log_origin()
    with transaction.atomic():
        if not _lock():
            return SealReport(appended=0, size=0, busy=True)
        last = selectors.log_last_leaf()
        size = 0 if last is None else last.index + 1
        rows = _due(last, limit)
        builder = merkle.TreeBuilder(size, selectors.log_node_hashes(merkle.root_nodes(size)))
        new_leaves: list[tuple[int, int, bytes, int | None]] = []
        new_nodes: list[tuple[int, int, bytes]] = []
        for event_id, stream, seq, event_hash, txid in rows:
            leaf = leaves.event_leaf(event=event_id, hash=event_hash, seq=seq, stream=stream)
            index = builder.size
            for (level, position), value in builder.append(leaf)[1:]:
                new_nodes.append((level, position, value))
            new_leaves.append((index, event_id, leaf, txid))
        _insert(new_leaves, new_nodes)
        size = builder.size
        latest = selectors.checkpoint_latest()
        if size == 0 or (latest is not None and latest.size >= size):
            return SealReport(appended=len(new_leaves), size=size)
        if key is None:
            return SealReport(
                appended=len(new_leaves),
                size=size,
                unsigned="No checkpoint: no signing key (AUDIT_SIGNING_KEY_FILE).",
            )
        checkpoint = _checkpoint_sign(
            size=size, root=builder.root(), origin=origin, key=key, now=now or timezone.now()
        )
    return SealReport(appended=len(new_leaves), size=size, checkpoint=checkpoint)


def log_seal_due(*, budget_s: float, limit: int = SEAL_BATCH) -> int:
    """Passes of ``log_seal`` until one finds fewer than ``limit`` events (caught up),
    another sealer holds the lock, or ``budget_s`` has passed; how many events were
    appended. What the beat runs: one pass alone would seal at most ``limit`` events per
    beat interval, however many the ledger writes."""
    deadline = time.monotonic() + budget_s
    appended = 0
    while True:
        report = log_seal(limit=limit)
        appended += report.appended
        if report.busy or report.appended < limit or time.monotonic() >= deadline:
            return appended


def _lock() -> bool:
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [LOCK_KEY])
        row = cursor.fetchone()
    return bool(row and row[0])


def _due(last: LogLeaf | None, limit: int) -> list[tuple[Any, ...]]:
    """Step 2: the events to append after ``last``, in the log's order."""
    if connection.vendor != "postgresql":
        after = last.event_id if last is not None else 0
        found = Event.objects.filter(pk__gt=after).order_by("pk")
        return [(*row, None) for row in found.values_list("pk", "stream", "seq", "hash")[:limit]]
    rows: list[tuple[Any, ...]] = []
    with connection.cursor() as cursor:
        if last is None or last.txid is None:
            cursor.execute(_BEFORE_LOG, [last.event_id if last is not None else 0, limit])
            rows = list(cursor.fetchall())
        if len(rows) < limit:
            cursor.execute(_HORIZON)
            horizon = cursor.fetchone()[0]
            txid, event_id = (last.txid, last.event_id) if last and last.txid else (0, 0)
            cursor.execute(_ENDED, [txid, event_id, horizon, limit - len(rows)])
            rows += cursor.fetchall()
    return rows


_COPY_LEAVES = 'COPY operations_logleaf ("index", event_id, hash, txid) FROM STDIN (FORMAT BINARY)'
_COPY_NODES = 'COPY operations_lognode (level, "index", hash) FROM STDIN (FORMAT BINARY)'


def _insert(
    new_leaves: list[tuple[int, int, bytes, int | None]], new_nodes: list[tuple[int, int, bytes]]
) -> None:
    """Step 3's rows: on PostgreSQL with COPY, in binary (the ORM's bulk insert spent
    most of a pass building its statement, arrays in text most of the rest)."""
    if connection.vendor != "postgresql":
        LogLeaf.objects.bulk_create(
            LogLeaf(index=index, event_id=event_id, hash=leaf, txid=txid)
            for index, event_id, leaf, txid in new_leaves
        )
        LogNode.objects.bulk_create(
            LogNode(level=level, index=index, hash=value) for level, index, value in new_nodes
        )
        return
    with connection.cursor() as cursor:
        raw = cursor.cursor  # psycopg's own, for COPY
        for sql, types, rows in (
            (_COPY_LEAVES, ["int8", "int8", "bytea", "int8"], new_leaves),
            (_COPY_NODES, ["int2", "int8", "bytea"], new_nodes),
        ):
            if not rows:
                continue
            with raw.copy(sql) as copy:
                copy.set_types(types)
                for row in rows:
                    copy.write_row(row)


def _checkpoint_sign(
    *, size: int, root: bytes, origin: str, key: Ed25519PrivateKey, now: datetime
) -> Checkpoint:
    """Step 4: sign, store and announce the checkpoint of ``size`` leaves."""
    at = now.replace(microsecond=0)
    body = notes.CheckpointBody(origin=origin, size=size, root=root, time=at)
    note = notes.sign(body.text(), name=origin, key=key)
    checkpoint = Checkpoint.objects.create(size=size, root=root, time=at, origin=origin, note=note)
    outbox_enqueue_to(
        runners=Runner.objects.filter(is_active=True).order_by("pk"),
        event_type=CHECKPOINT_EVENT,
        now=now,
        data={"checkpoint": payloads.checkpoint(checkpoint)},
    )
    return checkpoint
