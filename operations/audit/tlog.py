"""The transparency log, verified (``audit verify``): every stored checkpoint's
signature, its root recomputed from the events as they are now, and the consistency of
each checkpoint with the one before.

1. The leaves are read in index order, a chunk at a time, with their events. Each
   event's hash is recomputed from its fields (``services.event_hash``) and its leaf
   from that hash (``tlog.leaves``): an event rewritten after it was sealed, its stored
   hash rewritten with it or not, has another leaf now. A leaf whose event is gone
   (deleted, or archived: ``--archive`` gives the archived events back) keeps its
   stored hash so that the rest can still be checked, and is a fault.
2. The tree is grown from those leaves (``tlog.merkle.TreeBuilder``, bounded memory);
   at each checkpoint's size its root is compared with the checkpoint's.
   Every stored subtree hash, of which the proofs are made, must be the one the
   leaves give.
3. Each checkpoint's note must verify with one of the public keys and say what its row
   says, and the consistency proof from the previous checkpoint (served as the API
   serves it) must verify between the two signed roots.
4. An event the log is past but never sealed (its place in the log's order before the
   last leaf's) was written around the sealer: a fault too.
5. Checkpoints a witness kept (``--checkpoint``, the notes the ``audit.checkpoint``
   webhook delivered): each must verify, and the tree as the events are now must have
   its root at its size. This is what catches a rewrite of the log itself: someone with
   the database alone who rewrote events, leaves, subtree hashes and stored checkpoints
   alike cannot sign, but an application that seals the rewritten history again signs
   new checkpoints over it; only a root kept outside the database then differs.

A rewrite that keeps every chain intact (the whole chain rewritten, or an event added
with a correct hash) still changes a signed root, or leaves an event out of the log:
the checkpoints are what a witness keeps outside the database.
"""

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.core import serializers
from django.db import connection

from .. import selectors
from ..models import Checkpoint, Event, LogLeaf
from ..services.core import event_hash
from ..tlog import leaves, merkle, notes
from .chains import CHUNK

# What an event's hash covers, and the hash.
_FIELDS = (
    *("id", "stream", "seq", "kind", "from_status", "to_status"),
    *("actor", "at", "data", "prev_hash", "hash"),
)
# At most this many faults are listed with --all; the first is always there.
MAX_FAULTS = 1000
# Records a fault: where, and what is wrong there.
Fault = Callable[[str, str], None]


@dataclass(frozen=True)
class LogFault:
    """Where the log stops holding, and how."""

    where: str
    problem: str

    def describe(self) -> str:
        return f"{self.where}: {self.problem}"


@dataclass
class LogReport:
    leaves: int = 0
    checkpoints: int = 0
    faults: list[LogFault] = field(default_factory=list)

    @property
    def first_fault(self) -> LogFault | None:
        return self.faults[0] if self.faults else None


class _Stop(Exception):
    pass


def archived_leaves(path: Path) -> dict[int, bytes]:
    """The leaf of every event in an archive file (``archive``), by event id, each from
    the event's fields as archived."""
    found: dict[int, bytes] = {}
    lines = path.read_text(encoding="utf-8").splitlines()
    for line in lines[1:-1]:
        for item in serializers.deserialize("python", json.loads(line)["events"]):
            event: Event = item.object  # type: ignore[assignment]
            found[event.pk] = _leaf(event)
    return found


def _leaf(event: Event) -> bytes:
    return leaves.event_leaf(
        event=event.pk, hash=event_hash(event), seq=event.seq, stream=event.stream
    )


def witnessed_checkpoint(
    note: str, *, origin: str, keys: list[Ed25519PublicKey]
) -> notes.CheckpointBody:
    """A checkpoint a witness kept, verified: signed by one of ``keys`` for this log."""
    text, _ = notes.split(note)
    body = notes.CheckpointBody.parse(text)
    if body.origin != origin:
        raise notes.NoteError(f"it is a checkpoint of {body.origin!r}, not of this log ({origin})")
    notes.open_note(note, name=origin, keys=keys)
    return body


def log_verify(
    *,
    keys: list[Ed25519PublicKey],
    archived: dict[int, bytes] | None = None,
    witnessed: list[notes.CheckpointBody] | None = None,
    stop_at_first: bool = True,
) -> LogReport:
    """Steps 1 to 5 of the module's docstring; faults in the order found."""
    report = LogReport()
    archived = archived or {}
    kept: dict[int, list[notes.CheckpointBody]] = {}
    for body in witnessed or []:
        kept.setdefault(body.size, []).append(body)

    def fault(where: str, problem: str) -> None:
        if len(report.faults) < MAX_FAULTS:
            report.faults.append(LogFault(where, problem))
        if stop_at_first:
            raise _Stop

    with contextlib.suppress(_Stop):
        _verify(report, keys=keys, archived=archived, kept=kept, fault=fault)
    return report


def _verify(
    report: LogReport,
    *,
    keys: list[Ed25519PublicKey],
    archived: dict[int, bytes],
    kept: dict[int, list[notes.CheckpointBody]],
    fault: Fault,
) -> None:
    ordered = iter(selectors.checkpoints_in_order())
    pending = next(ordered, None)
    previous: Checkpoint | None = None
    builder = merkle.TreeBuilder()
    completed: dict[merkle.Node, bytes] = {}
    for index, leaf in _leaves(fault=fault, archived=archived):
        completed.update(builder.append(leaf)[1:])
        report.leaves = index + 1
        if len(completed) >= CHUNK:
            _nodes(completed, fault=fault)
        while pending is not None and pending.size == builder.size:
            _nodes(completed, fault=fault)
            _checkpoint(pending, previous, root=builder.root(), keys=keys, fault=fault)
            report.checkpoints += 1
            previous, pending = pending, next(ordered, None)
        for body in kept.pop(builder.size, []):
            if body.root != builder.root():
                fault(
                    f"kept checkpoint {body.size} (signed {notes.format_time(body.time)})",
                    "the log's root at its size, from the events as they are now, is not the "
                    "one it signed: the history it covers was rewritten",
                )
    _nodes(completed, fault=fault)
    for size in sorted(kept):
        fault(
            f"kept checkpoint {size}",
            f"the log holds only {builder.size} leaves: leaves it covered were removed",
        )
    while pending is not None:
        fault(
            f"checkpoint {pending.size}",
            f"it is larger than the log, which holds {builder.size} leaves: leaves were "
            "deleted after it was signed",
        )
        report.checkpoints += 1
        pending = next(ordered, None)
    _unsealed(fault=fault)


def _leaves(*, fault: Fault, archived: dict[int, bytes]) -> Iterator[tuple[int, bytes]]:
    """Step 1: each leaf in index order, as the events say now."""
    expected, last = 0, -1
    while True:
        rows = list(
            LogLeaf.objects.filter(index__gt=last)
            .order_by("index")
            .values_list("index", "event_id", "hash")[:CHUNK]
        )
        if not rows:
            return
        events = Event.objects.only(*_FIELDS).in_bulk([event_id for _, event_id, _ in rows])
        for index, event_id, stored in rows:
            if index != expected:
                fault(f"leaf {expected}", f"it is missing: the next leaf stored is {index}")
                expected = index
            stored = bytes(stored)
            event = events.get(event_id)
            if event is None:
                now = archived.get(event_id)
                if now is None:
                    fault(
                        f"leaf {index}",
                        f"event {event_id} is not in the ledger: deleted, or archived (give "
                        "its archive file with --archive)",
                    )
                    now = stored
            else:
                if event_hash(event) != event.hash:
                    fault(
                        f"leaf {index}",
                        f"event {event_id} ({event.stream} seq {event.seq}) no longer matches "
                        "its hash: it was rewritten after it was sealed",
                    )
                now = _leaf(event)
            if now != stored:
                fault(
                    f"leaf {index}",
                    f"event {event_id} is not what was sealed: its leaf is "
                    f"{now.hex()[:16]}..., the log holds {stored.hex()[:16]}...",
                )
            yield index, now
            expected, last = index + 1, index


def _nodes(completed: dict[merkle.Node, bytes], *, fault: Fault) -> None:
    """The stored subtree hashes, which the proofs are made of, against those the leaves
    give; ``completed`` is emptied."""
    stored = selectors.log_node_hashes(completed)
    for (level, index), value in sorted(completed.items()):
        found = stored.get((level, index))
        if found != value:
            what = "missing" if found is None else "not the one the leaves under it give"
            fault(
                f"subtree {level}/{index} (leaves {index << level} to "
                f"{((index + 1) << level) - 1})",
                f"its stored hash is {what}: proofs through it do not verify",
            )
    completed.clear()


def _checkpoint(
    checkpoint: Checkpoint,
    previous: Checkpoint | None,
    *,
    root: bytes,
    keys: list[Ed25519PublicKey],
    fault: Fault,
) -> None:
    """Step 3 for one checkpoint; ``root`` is the tree's at its size, from the events."""
    where = f"checkpoint {checkpoint.size}"
    try:
        text = notes.open_note(checkpoint.note, name=checkpoint.origin, keys=keys)
        body = notes.CheckpointBody.parse(text)
    except notes.NoteError as exc:
        fault(where, f"its signed note does not verify: {exc}")
        return
    said = (body.origin, body.size, body.root, body.time)
    stored = (checkpoint.origin, checkpoint.size, bytes(checkpoint.root), checkpoint.time)
    if said != stored:
        fault(where, "its row says otherwise than its signed note")
    if body.root != root:
        fault(
            where,
            "its signed root is not the root of the events as they are now: an event sealed "
            "before it was rewritten, removed or reordered",
        )
    if previous is None:
        return
    try:
        proof = selectors.consistency_proof(first=previous.size, second=body.size)
    except KeyError:
        proof = []
    if not merkle.verify_consistency(
        first=previous.size,
        second=body.size,
        first_root=bytes(previous.root),
        second_root=body.root,
        proof=proof,
    ):
        fault(where, f"it is not consistent with checkpoint {previous.size}")


_UNSEALED_PG = """
SELECT e.id, e.stream, e.seq FROM operations_event e
WHERE NOT EXISTS (SELECT 1 FROM operations_logleaf l WHERE l.event_id = e.id)
  AND (e.txid IS NULL OR (e.txid, e.id) < (%s, %s))
ORDER BY e.id LIMIT 10
"""
_UNSEALED_BEFORE_LOG = """
SELECT e.id, e.stream, e.seq FROM operations_event e
WHERE NOT EXISTS (SELECT 1 FROM operations_logleaf l WHERE l.event_id = e.id)
  AND e.txid IS NULL AND e.id < %s
ORDER BY e.id LIMIT 10
"""


def _unsealed(*, fault: Fault) -> None:
    """Step 4: events the sealer is past that have no leaf."""
    last = selectors.log_last_leaf()
    if last is None:
        return
    if connection.vendor == "postgresql":
        sql, values = (
            (_UNSEALED_PG, [last.txid, last.event_id])
            if last.txid is not None
            else (_UNSEALED_BEFORE_LOG, [last.event_id])
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, values)
            rows = cursor.fetchall()
    else:
        sealed = LogLeaf.objects.values("event_id")
        rows = list(
            Event.objects.filter(pk__lt=last.event_id)
            .exclude(pk__in=sealed)
            .order_by("pk")
            .values_list("pk", "stream", "seq")[:10]
        )
    for event_id, stream, seq in rows:
        fault(
            f"event {event_id}",
            f"{stream} seq {seq} is not in the log though the sealer is past it: it was "
            "written around the sealer",
        )
