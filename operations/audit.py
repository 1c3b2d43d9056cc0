"""Verifying the audit trail: every event stream's hash chain, recomputed.

Each event stores the hash of its stream's previous event (``prev_hash``) and a hash
over its own fields and that link (``services.event_hash``). Rewriting an event's
fields, deleting one, inserting one or reordering them breaks the chain at that point.

``chains_verify`` reads events in (stream, seq) order through a database cursor, one
chunk at a time, and keeps only the current stream's last hash: memory stays bounded
whatever the size of the table. It reports the first break of each stream; the
management command ``audit verify`` prints the first break overall.
"""

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db.models import QuerySet

from .models import Event
from .services.core import GENESIS_HASH, event_hash

CHUNK = 2000
_FIELDS = (
    "id",
    "stream",
    "seq",
    "kind",
    "from_status",
    "to_status",
    "actor",
    "at",
    "data",
    "prev_hash",
    "hash",
)


@dataclass(frozen=True)
class ChainBreak:
    """Where a chain stops holding, and what differs there."""

    stream: str
    seq: int
    event_id: int | None
    problem: str
    expected: str
    found: str

    def describe(self) -> str:
        return (
            f"stream {self.stream} seq {self.seq} (event id {self.event_id}): {self.problem}; "
            f"expected {self.expected}, found {self.found}"
        )


@dataclass
class ChainReport:
    events: int = 0
    streams: int = 0
    breaks: list[ChainBreak] = field(default_factory=list)
    # sha256 over every stream's (name, last seq, last hash), in stream order: a value
    # to keep outside the database, so that a later rewrite of a whole chain shows.
    heads_digest: str = ""

    @property
    def ok(self) -> bool:
        return not self.breaks

    @property
    def first_break(self) -> ChainBreak | None:
        return self.breaks[0] if self.breaks else None


def _rows(queryset: QuerySet | None) -> Iterator[dict[str, Any]]:
    queryset = Event.objects.all() if queryset is None else queryset
    return queryset.order_by("stream", "seq").values(*_FIELDS).iterator(chunk_size=CHUNK)


def _check(row: dict[str, Any], *, expected_seq: int, expected_prev: str) -> ChainBreak | None:
    where = {"stream": row["stream"], "seq": row["seq"], "event_id": row["id"]}
    if row["seq"] != expected_seq:
        problem = (
            "the stream does not start at seq 1"
            if expected_seq == 1
            else "seq is not the previous seq + 1 (an event is missing or was renumbered)"
        )
        return ChainBreak(
            **where, problem=problem, expected=str(expected_seq), found=str(row["seq"])
        )
    if row["prev_hash"] != expected_prev:
        return ChainBreak(
            **where,
            problem="prev_hash does not match the previous event's hash "
            "(the previous event was replaced or removed)",
            expected=expected_prev,
            found=row["prev_hash"],
        )
    event = Event(**{name: row[name] for name in _FIELDS if name != "id"})
    recomputed = event_hash(event)
    if recomputed != row["hash"]:
        return ChainBreak(
            **where,
            problem="hash does not match the event's fields "
            "(kind, from, to, actor, at or data was changed)",
            expected=recomputed,
            found=row["hash"],
        )
    return None


def chains_verify(queryset: QuerySet | None = None, *, stop_at_first: bool = False) -> ChainReport:
    """Recompute every chain in ``queryset`` (default: all events).

    Records the first break of each stream (after a break, the rest of that stream
    cannot be trusted, so it is skipped); with ``stop_at_first`` stops at the first.
    """
    return chains_verify_rows(_rows(queryset), stop_at_first=stop_at_first)


def chains_verify_rows(
    rows: Iterable[dict[str, Any]], *, stop_at_first: bool = False
) -> ChainReport:
    report = ChainReport()
    heads = hashlib.sha256()
    stream: str | None = None
    expected_seq, expected_prev, broken = 1, GENESIS_HASH, False

    def close(name: str | None) -> None:
        if name is not None:
            heads.update(f"{name}\t{expected_seq - 1}\t{expected_prev}\n".encode())

    for row in rows:
        if row["stream"] != stream:
            close(stream)
            stream = row["stream"]
            report.streams += 1
            expected_seq, expected_prev, broken = 1, GENESIS_HASH, False
        report.events += 1
        if broken:
            continue
        found = _check(row, expected_seq=expected_seq, expected_prev=expected_prev)
        if found is not None:
            report.breaks.append(found)
            broken = True
            if stop_at_first:
                break
            continue
        expected_seq, expected_prev = row["seq"] + 1, row["hash"]
    close(stream)
    report.heads_digest = heads.hexdigest()
    return report
