"""The hash chains of the event streams, recomputed, and anchors of their heads
(see the package's docstring)."""

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import QuerySet

from ..eventmac import mac_problem
from ..models import Event
from ..services.core import GENESIS_HASH, event_hash

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
    "mac",
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


@dataclass(frozen=True)
class MacFault:
    """An event whose MAC is missing or wrong under the keys given. The MAC it should
    have is never shown: whoever reads the report would have it to write."""

    stream: str
    seq: int
    event_id: int | None
    problem: str

    def describe(self) -> str:
        return f"stream {self.stream} seq {self.seq} (event id {self.event_id}): {self.problem}"


ANCHOR_PREFIX = "eg-anchor-v1"


@dataclass(frozen=True)
class Anchor:
    """The chain heads as of ``at``: for every stream with an event at or before ``at``,
    the last such event's (stream, seq, hash).

    ``digest`` is SHA-256 over one ``stream<TAB>seq<TAB>hash<LF>`` line per stream, in
    stream order; ``events`` and ``streams`` count what it covers. Because each hash
    covers its stream's whole past, an unchanged digest means every event recorded by
    ``at`` is still there, unchanged, and nothing was added dated by ``at``.
    """

    at: datetime
    events: int
    streams: int
    digest: str

    def __str__(self) -> str:
        at = self.at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return (
            f"{ANCHOR_PREFIX},at={at},events={self.events},streams={self.streams},"
            f"sha256={self.digest}"
        )

    @classmethod
    def parse(cls, text: str) -> "Anchor":
        """The anchor ``str(anchor)`` printed; ValueError if ``text`` is not one."""
        prefix, _, rest = text.strip().partition(",")
        fields = dict(part.partition("=")[::2] for part in rest.split(","))
        if prefix != ANCHOR_PREFIX or set(fields) != {"at", "events", "streams", "sha256"}:
            raise ValueError(f"not an anchor ({ANCHOR_PREFIX},at=...,events=...,...)")
        at = datetime.fromisoformat(fields["at"])
        digest = fields["sha256"].lower()
        if at.tzinfo is None or len(digest) != 64 or set(digest) - set("0123456789abcdef"):
            raise ValueError("an anchor's time must be UTC and its sha256 64 hex digits")
        return cls(
            at=at, events=int(fields["events"]), streams=int(fields["streams"]), digest=digest
        )

    def compare(self, current: "Anchor") -> str | None:
        """Why ``current`` (the heads recomputed as of ``self.at``) differs, or None."""
        if current == self:
            return None
        if current.events < self.events or current.streams < self.streams:
            return (
                f"{self.events - current.events} of the {self.events} events recorded by "
                f"then are missing ({current.streams} of {self.streams} streams remain): "
                "deleted or truncated"
            )
        if current.events > self.events or current.streams > self.streams:
            return (
                f"{current.events - self.events} events dated by then were added after "
                "the anchor was taken: inserted with a past time, or written by a "
                "transaction that committed later than the anchor's lag allowed for"
            )
        return (
            "the same number of events and streams, but at least one chain's head has "
            "another hash: a chain was rewritten"
        )


@dataclass
class ChainReport:
    events: int = 0
    streams: int = 0
    breaks: list[ChainBreak] = field(default_factory=list)
    # sha256 over every stream's (name, last seq, last hash), in stream order. It
    # changes with every appended event; ``anchor`` is the form that can be kept.
    heads_digest: str = ""
    # The heads as of the time asked for (``anchor_at``), if one was.
    anchor: Anchor | None = None
    # With keys given: the first event of each stream without a valid MAC (in stream
    # order), and how many events of the unbroken chains have none.
    macs_checked: bool = False
    mac_faults: list[MacFault] = field(default_factory=list)
    events_without_mac: int = 0

    @property
    def ok(self) -> bool:
        return not self.breaks and not self.mac_faults

    @property
    def first_break(self) -> ChainBreak | None:
        return self.breaks[0] if self.breaks else None

    @property
    def first_mac_fault(self) -> MacFault | None:
        return self.mac_faults[0] if self.mac_faults else None


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


def chains_verify(
    queryset: QuerySet | None = None,
    *,
    stop_at_first: bool = False,
    anchor_at: datetime | None = None,
    keys: dict[str, bytes] | None = None,
) -> ChainReport:
    """Recompute every chain in ``queryset`` (default: all events).

    Records the first break of each stream (after a break, the rest of that stream
    cannot be trusted, so it is skipped); with ``stop_at_first`` stops at the first.
    With ``anchor_at``, also computes the heads as of that time (``report.anchor``).
    With ``keys`` (the event keys by id, ``eventmac.keyring()``), also checks every
    event's MAC where its chain holds, and records the first fault of each stream
    (``stop_at_first`` stops there too).
    """
    return chains_verify_rows(
        _rows(queryset), stop_at_first=stop_at_first, anchor_at=anchor_at, keys=keys
    )


def chains_verify_rows(
    rows: Iterable[dict[str, Any]],
    *,
    stop_at_first: bool = False,
    anchor_at: datetime | None = None,
    keys: dict[str, bytes] | None = None,
) -> ChainReport:
    report = ChainReport(macs_checked=keys is not None)
    mac_faulty = False
    heads = hashlib.sha256()
    anchored = hashlib.sha256()
    anchored_events = anchored_streams = 0
    stream: str | None = None
    expected_seq, expected_prev, broken = 1, GENESIS_HASH, False
    # The current stream's last event dated at or before anchor_at: (seq, hash).
    anchor_head: tuple[int, str] | None = None

    def close(name: str | None) -> None:
        nonlocal anchored_streams
        if name is None:
            return
        heads.update(f"{name}\t{expected_seq - 1}\t{expected_prev}\n".encode())
        if anchor_head is not None:
            anchored.update(f"{name}\t{anchor_head[0]}\t{anchor_head[1]}\n".encode())
            anchored_streams += 1

    for row in rows:
        if row["stream"] != stream:
            close(stream)
            stream = row["stream"]
            report.streams += 1
            expected_seq, expected_prev, broken = 1, GENESIS_HASH, False
            anchor_head = None
            mac_faulty = False
        report.events += 1
        # The anchor is over the events as stored, broken chain or not: the two checks
        # answer different questions and are reported separately.
        if anchor_at is not None and row["at"] <= anchor_at:
            anchor_head = (row["seq"], row["hash"])
            anchored_events += 1
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
        if keys is not None:
            problem = mac_problem(row.get("mac", ""), row["hash"], keys)
            if problem is not None:
                report.events_without_mac += 1
                if not mac_faulty:
                    mac_faulty = True
                    report.mac_faults.append(
                        MacFault(
                            stream=row["stream"],
                            seq=row["seq"],
                            event_id=row["id"],
                            problem=problem,
                        )
                    )
                    if stop_at_first:
                        break
    close(stream)
    report.heads_digest = heads.hexdigest()
    if anchor_at is not None:
        report.anchor = Anchor(
            at=anchor_at,
            events=anchored_events,
            streams=anchored_streams,
            digest=anchored.hexdigest(),
        )
    return report
