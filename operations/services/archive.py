"""Bounded history: terminal operations older than a date leave the live ledger for an
archive file, verified before anything is removed, and an anchor event records it.

The file is JSON Lines: a header, then one line per operation with every row that
belongs to it (attempts, its event stream, approval requests with their decisions and
grants, resolutions with their reviews, webhook messages with their delivery attempts,
inbound provider events), then a trailer with the chain head of every archived stream
and their digest. ``archive_verify_file`` recomputes each stream's hash chain from the
file. The ``archived`` event (stream ``archive``) records the file's SHA-256 and the
heads digest, so ``audit verify --archive FILE`` proves a kept file is the one removed.

An operation stays live while anything live still points at it: a successor or retry
(``previous``) that is not archived with it, or an event of another stream that names it.

Archiving never loses the only copy: one run at a time, the file is complete, on disk
and verified before it takes its name (which it never takes from an existing file),
and a run removes a file only when it made it and its own transaction rolled back
(``archive_operations``).
"""

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

from django.core import serializers
from django.db import DatabaseError, connection, transaction
from django.db.models import Model
from django.utils import timezone

from approvals.models import ApprovalRequest, Decision, Grant

from ..canonical import sha256_hex
from ..machine import TERMINAL, EventKind
from ..models import (
    Attempt,
    DeliveryAttempt,
    Event,
    InboundEvent,
    Operation,
    OutboxMessage,
    Resolution,
    ResolutionReview,
)
from ..triggers import ignored, trigger_uris
from .core import GENESIS_HASH, Actor, event_append, event_hash

FORMAT = "effectgate-archive/1"
ARCHIVE_STREAM = "archive"


class ArchiveError(Exception):
    """The archive cannot be written or does not verify; nothing was removed."""


@dataclass(frozen=True)
class ArchiveSummary:
    operations: int
    events: int
    heads: dict[str, list[Any]]
    heads_digest: str
    file_sha256: str


def _encode(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()  # full precision: event hashes cover the timestamps
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _rows(queryset: Iterable[Model]) -> list[dict[str, Any]]:
    return serializers.serialize("python", queryset)


def archive_candidates(*, before: datetime, limit: int = 10_000) -> list[str]:
    """Terminal operations whose last change is older than ``before`` and that nothing
    live points at."""
    chosen = set(
        Operation.objects.filter(
            status__in=[s.value for s in TERMINAL], status_changed_at__lt=before
        ).values_list("pk", flat=True)[:limit]
    )
    while True:
        # A live successor or retry keeps its predecessor (its audit names it).
        kept = set(
            Operation.objects.filter(previous_id__in=chosen)
            .exclude(pk__in=chosen)
            .values_list("previous_id", flat=True)
        )
        kept |= set(
            Event.objects.filter(operation_id__in=chosen)
            .exclude(stream__in=chosen)
            .values_list("operation_id", flat=True)
        )
        if not kept & chosen:
            return sorted(chosen)
        chosen -= kept


def _bundle(op: Operation) -> dict[str, Any]:
    requests = ApprovalRequest.objects.filter(operation=op).order_by("pk")
    resolutions = Resolution.objects.filter(operation=op).order_by("pk")
    messages = OutboxMessage.objects.filter(operation=op).order_by("pk")
    return {
        "operation": _rows([op])[0],
        "attempts": _rows(Attempt.objects.filter(operation=op).order_by("number")),
        "events": _rows(Event.objects.filter(stream=op.pk).order_by("seq")),
        "approval_requests": _rows(requests),
        "decisions": _rows(Decision.objects.filter(request__in=requests).order_by("pk")),
        "grants": _rows(Grant.objects.filter(request__in=requests).order_by("pk")),
        "resolutions": _rows(resolutions),
        "reviews": _rows(ResolutionReview.objects.filter(resolution__in=resolutions)),
        "outbox_messages": _rows(messages),
        "delivery_attempts": _rows(DeliveryAttempt.objects.filter(message__in=messages)),
        "inbound_events": _rows(InboundEvent.objects.filter(operation=op).order_by("pk")),
    }


def archive_write(*, op_ids: list[str], before: datetime, out: TextIO) -> None:
    """Write the archive of ``op_ids`` to ``out``."""
    heads: dict[str, list[Any]] = {}
    header = {"format": FORMAT, "before": before.isoformat(), "operations": len(op_ids)}
    out.write(json.dumps({"archive": header}) + "\n")
    for op in Operation.objects.filter(pk__in=op_ids).order_by("pk").iterator(500):
        bundle = _bundle(op)
        if bundle["events"]:
            last = bundle["events"][-1]["fields"]
            heads[op.pk] = [last["seq"], last["hash"]]
        out.write(json.dumps(bundle, default=_encode, sort_keys=True) + "\n")
    out.write(json.dumps({"heads": heads, "heads_digest": sha256_hex(heads)}) + "\n")


def archive_verify_file(path: Path) -> ArchiveSummary:
    """Recompute every archived stream's hash chain from the file and its heads digest."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    lines = path.read_text(encoding="utf-8").splitlines()
    if len(lines) < 2 or "archive" not in json.loads(lines[0]):
        raise ArchiveError(f"{path} is not an Effectgate archive.")
    header = json.loads(lines[0])["archive"]
    if header.get("format") != FORMAT:
        raise ArchiveError(f"{path}: unknown format {header.get('format')!r}.")
    trailer = json.loads(lines[-1])
    heads: dict[str, list[Any]] = {}
    events = 0
    for number, line in enumerate(lines[1:-1], start=2):
        bundle = json.loads(line)
        stream = bundle["operation"]["pk"]
        previous, seq = GENESIS_HASH, 0
        for item in serializers.deserialize("python", bundle["events"]):
            event: Event = item.object  # type: ignore[assignment]
            seq += 1
            if event.stream != stream or event.seq != seq or event.prev_hash != previous:
                raise ArchiveError(f"{path} line {number}: {stream} breaks at seq {seq}.")
            if event_hash(event) != event.hash:
                raise ArchiveError(f"{path} line {number}: {stream} seq {seq} was altered.")
            previous = event.hash
            events += 1
        if seq:
            heads[stream] = [seq, previous]
    if heads != trailer.get("heads") or sha256_hex(heads) != trailer.get("heads_digest"):
        raise ArchiveError(f"{path}: the chain heads differ from the trailer's.")
    if len(heads) != header["operations"] or len(lines) - 2 != header["operations"]:
        raise ArchiveError(f"{path}: it holds another number of operations than it says.")
    return ArchiveSummary(
        operations=header["operations"],
        events=events,
        heads=heads,
        heads_digest=trailer["heads_digest"],
        file_sha256=digest,
    )


def archive_operations(*, before: datetime, path: Path, actor: Actor) -> ArchiveSummary:
    """Archive terminal operations older than ``before`` into ``path``, verify the
    file, then remove them and record the ``archived`` anchor event, in one transaction.

    1. Take the archive lock, so that one run at a time chooses, writes and removes
       (``_archive_lock``); lock the candidates and choose them again under the lock.
    2. Write the file under a temporary name in the target's folder (created
       exclusively, readable by its owner only), fsync it and verify it.
    3. Give it its name with a hard link, which never replaces a name that exists: of
       two runs on one target at most one can claim it, and a file already there is
       refused. Drop the temporary name and fsync the folder, so that the file is on
       disk before any row goes.
    4. Remove the rows, append the ``archived`` event and commit.

    A failure before the commit rolls the transaction back, and the run removes the
    files it made, only those: the target only while it is still the file this run
    linked, never a file another run or writer put there. Once the commit was asked
    for, the file is kept whatever follows: if the commit's answer is lost, the ledger
    may already hold the removal.
    """
    if os.path.lexists(path):
        # Only spares the work of a run that cannot succeed; the link in step 3 is what
        # refuses a file that exists by the time this run names its own.
        raise ArchiveError(f"{path} exists: choose a new file.")
    made = _Made()
    committing = False
    try:
        with transaction.atomic(durable=True):
            _archive_lock()
            op_ids = archive_candidates(before=before)
            list(Operation.objects.select_for_update().filter(pk__in=op_ids).values_list("pk"))
            op_ids = archive_candidates(before=before)
            if not op_ids:
                raise ArchiveError("No terminal operation older than that date can be archived.")
            summary = _place(op_ids=op_ids, before=before, path=path, made=made)
            _remove(op_ids)
            event_append(
                stream=ARCHIVE_STREAM,
                kind=EventKind.ARCHIVED,
                actor=actor,
                data={
                    "before": before.isoformat(),
                    "file": path.name,
                    "file_sha256": summary.file_sha256,
                    "operations": summary.operations,
                    "events": summary.events,
                    "heads_digest": summary.heads_digest,
                },
                now=timezone.now(),
            )
            committing = True
    except DatabaseError as exc:
        if not committing:
            made.remove()
            raise
        raise ArchiveError(
            f"The commit's outcome is unknown ({exc}); {path} is kept. "
            f"'audit verify --archive {path}' says whether the ledger recorded it: if it "
            "does not, the operations are still live and the file can be deleted."
        ) from exc
    except BaseException:
        if not committing:
            made.remove()
        raise
    return summary


# pg_try_advisory_xact_lock keys are bigints; this one is "egarchiv" in ASCII.
LOCK_KEY = int.from_bytes(b"egarchiv", "big") & 0x7FFF_FFFF_FFFF_FFFF


def _archive_lock() -> None:
    """One archive run at a time, from the choice of candidates to the commit.

    On PostgreSQL a transaction-level advisory lock: released by the commit or the
    rollback, also when the process dies with its connection; a second run is refused
    at once rather than left waiting behind a long one. On SQLite (the local mode)
    every transaction begins IMMEDIATE (``console/settings.py``): this one took the
    database's write lock when it began, so a second run waits for the first to end
    (the busy timeout) and then chooses among what is left.
    """
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [LOCK_KEY])
        row = cursor.fetchone()
    if not (row and row[0]):
        raise ArchiveError("Another archive run is under way; nothing was done. Try again later.")


@dataclass
class _Made:
    """The names this run created, and the file (device, inode) they name."""

    temporary: Path | None = None
    target: Path | None = None
    identity: tuple[int, int] | None = None

    def remove(self) -> None:
        for name in (self.target, self.temporary):
            if name is not None and _identity(name) == self.identity:
                name.unlink()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        found = path.lstat()
    except FileNotFoundError:
        return None
    return (found.st_dev, found.st_ino)


def _place(*, op_ids: list[str], before: datetime, path: Path, made: _Made) -> ArchiveSummary:
    """Steps 2 and 3 of ``archive_operations``: the verified file, under its name."""
    folder = path.parent
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise ArchiveError(f"Cannot create a file in {folder}: {exc}") from exc
    found = os.fstat(fd)
    made.temporary, made.identity = Path(temporary), (found.st_dev, found.st_ino)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        archive_write(op_ids=op_ids, before=before, out=out)
        out.flush()
        os.fsync(out.fileno())
    summary = archive_verify_file(made.temporary)
    try:
        os.link(made.temporary, path)
    except FileExistsError as exc:
        raise ArchiveError(f"{path} exists: choose a new file.") from exc
    except OSError as exc:
        raise ArchiveError(f"Cannot name the archive {path}: {exc}") from exc
    made.target = path
    made.temporary.unlink()
    made.temporary = None
    directory = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return summary


def _remove(op_ids: list[str]) -> None:
    """Delete every row that belongs to ``op_ids`` (they are in the verified file)."""
    requests = ApprovalRequest.objects.filter(operation_id__in=op_ids)
    resolutions = Resolution.objects.filter(operation_id__in=op_ids)
    messages = OutboxMessage.objects.filter(operation_id__in=op_ids)
    with ignored(*trigger_uris()):
        DeliveryAttempt.objects.filter(message__in=messages).delete()
        messages.delete()
        Grant.objects.filter(request__in=requests).delete()
        Decision.objects.filter(request__in=requests).delete()
        requests.delete()
        ResolutionReview.objects.filter(resolution__in=resolutions).delete()
        resolutions.delete()
        InboundEvent.objects.filter(operation_id__in=op_ids).delete()
        Event.objects.filter(stream__in=op_ids).delete()
        Attempt.objects.filter(operation_id__in=op_ids).delete()
        Operation.objects.filter(pk__in=op_ids).delete()


def archive_recorded(summary: ArchiveSummary) -> bool:
    """Whether an ``archived`` anchor event records this file and its heads."""
    return Event.objects.filter(
        stream=ARCHIVE_STREAM,
        kind=EventKind.ARCHIVED,
        data__file_sha256=summary.file_sha256,
        data__heads_digest=summary.heads_digest,
    ).exists()
