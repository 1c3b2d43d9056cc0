"""What ``effectgate-verify`` checks in an evidence bundle (format
``effectgate-evidence/1``, docs/security.md, Evidence bundles), with nothing but the
bundle, the log's public key and, optionally, checkpoints a witness kept.

1. The form: every object has exactly the fields of its kind, of their types (a field
   added, removed or retyped is a failure), JSON without duplicate keys or NaN.
2. The checkpoint: its signed note verifies with the key under the log's origin, and
   says what the bundle's copy of its fields says.
3. Every event: its hash is recomputed from its fields (SHA-256 of the RFC 8785
   canonical JSON of stream, seq, kind, from, to, actor, at, data, prev), its leaf
   (RFC 9162, of the entry {event, hash, seq, stream}) is included in the checkpoint's
   tree by its proof; the operation's events are its whole chain from seq 1 (the
   genesis ``prev`` is 64 zeros), each linked to the one before and starting from the
   status the one before left.
4. The other events (the contract version's, a standing grant's): hash and inclusion,
   of the streams and kinds the rows rest on.
5. Witnesses: a checkpoint a witness kept (``--checkpoint``) verifies with the key, and
   the bundle's checkpoint extends it: the same root at the same size, or a consistency
   proof (RFC 9162 §2.1.4) from its size in the bundle. Every consistency proof the
   bundle carries must be checked against a signed root, or it is a failure.
6. The rows: every field is held to the events (the operation's intent hash recomputed
   from its arguments, its status from the last event, each attempt from its claim and
   outcome, each request from the event that opened it and the one that settled it,
   each decision from its event, each grant from its ``granted`` event...), and every
   event that implies a row has one. ``unrecorded`` may only hold what no event records.

Each failure names where (the event by stream, seq and id; the row by id and field; the
proof by its sizes) and what is wrong there. Pure: no network, no clock.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import rfc8785

from . import merkle
from .notes import Checkpoint, NoteError, open_checkpoint

FORMAT = "effectgate-evidence/1"
GENESIS = "0" * 64
HASHED = ("stream", "seq", "kind", "from", "to", "actor", "at", "data", "prev")
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
MAX_EVENTS = 100_000
# Rows of all kinds: each rests on at least one event.
MAX_ROWS = 20_000
MAX_PROOF = 64
MAX_FAILURES = 200
_HEX64 = re.compile(r"[0-9a-f]{64}")
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})")

# The settling events of an approval request and the status each leaves it in; without
# one a request is pending, or expired or withdrawn (which no event of their own writes).
REQUEST_STATUS_AFTER = {
    "granted": "approved",
    "rejected": "rejected",
    "grant_revoked": "revoked",
    "approval_expired": "expired",
    "superseded": "superseded",
}
REQUEST_STATUSES_WITHOUT_EVENT = {"pending", "expired", "withdrawn"}
REQUEST_OPENED_BY = ("approval_requested", "grant_invalid", "reconciled")
ATTEMPT_STATUS_AFTER = {"succeeded": "succeeded", "failed": "failed", "unknown": "unknown"}
STANDING_KINDS = {
    "standing_grant_issued",
    "standing_grant_signed",
    "standing_grant_activated",
    "standing_grant_used",
}


class BundleError(ValueError):
    """A file that is no evidence bundle at all: not JSON, too large, another format."""


@dataclass(frozen=True)
class Failure:
    where: str
    problem: str

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}"


@dataclass
class Report:
    """What the verification found: the failures (none when the bundle holds), the
    checkpoint it verified, the witnesses' checkpoints that held, and the bundle."""

    bundle: dict[str, Any]
    failures: list[Failure] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    witnessed: list[Checkpoint] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class _Stop(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise BundleError(f"the key {key[:60]!r} appears twice in one object")
        found[key] = value
    return found


def _no_constant(name: str) -> Any:
    raise BundleError(f"{name} is not a JSON number")


def load_bundle(data: bytes) -> dict[str, Any]:
    """The bundle in ``data``, strictly: UTF-8 JSON, no duplicate key, no NaN."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(f"the file is larger than {MAX_BUNDLE_BYTES} bytes")
    try:
        bundle = json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
        )
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, long integers
        raise BundleError(f"the file is not JSON ({exc})") from None
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise BundleError(f"the file is not an evidence bundle (format {FORMAT})")
    return bundle


def event_hash(event: dict[str, Any]) -> str:
    """The event hash: SHA-256 hex of the RFC 8785 canonical JSON of its hashed fields."""
    return hashlib.sha256(rfc8785.dumps({name: event[name] for name in HASHED})).hexdigest()


def intent_hash(*, tool: str, arguments: Any, principal: str) -> str:
    document = {"tool": tool, "arguments": arguments, "principal": principal}
    return hashlib.sha256(rfc8785.dumps(document)).hexdigest()


def sha256_json(value: Any) -> str:
    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def entry(*, event: int, hash: str, seq: int, stream: str) -> bytes:
    """A leaf's entry: the canonical JSON of the event's id, hash, seq and stream."""
    return rfc8785.dumps({"event": event, "hash": hash, "seq": seq, "stream": stream})


# --- Form -------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _opt_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _list(value: Any) -> bool:
    return isinstance(value, list)


def _dict(value: Any) -> bool:
    return isinstance(value, dict)


def _any(value: Any) -> bool:
    return True


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


Spec = dict[str, Callable[[Any], bool]]

TOP: Spec = {
    "format": _str,
    "origin": _str,
    "operation": _dict,
    "contract": lambda v: v is None or isinstance(v, dict),
    "attempts": _list,
    "approvals": _list,
    "grants": _list,
    "standing_grants": _list,
    "resolutions": _list,
    "events": _list,
    "related_events": _list,
    "checkpoint": _dict,
    "consistency": _list,
    "unrecorded": _dict,
}
CHECKPOINT: Spec = {"size": _is_int, "root": _str, "time": _str, "origin": _str, "note": _str}
EVENT: Spec = {
    "id": _is_int,
    "stream": _str,
    "seq": _is_int,
    "kind": _str,
    "from": _str,
    "to": _str,
    "actor": _str,
    "at": _str,
    "data": _dict,
    "prev": _str,
    "hash": _str,
    "leaf_index": _is_int,
    "inclusion": _list,
}
OPERATION: Spec = {
    "id": _str,
    "tool": _str,
    "tool_version": _is_int,
    "effect_class": _str,
    "operation_key": _str,
    "call_id": _str,
    "principal": _str,
    "arguments": _any,
    "intent_hash": _hex64,
    "idempotency_key": _str,
    "status": _str,
    "attempts": _is_int,
}
CONTRACT: Spec = {"tool": _str, "version": _is_int, "contract_hash": _hex64, "contract": _dict}
ATTEMPT: Spec = {
    "number": _is_int,
    "status": _str,
    "claimed_at": _str,
    "closed_at": _opt_str,
    "outcome": lambda v: v is None or isinstance(v, dict),
}
APPROVAL: Spec = {
    "id": _str,
    "status": _str,
    "terms": _dict,
    "reason": _str,
    "decisions": _list,
}
DECISION: Spec = {"user": _str, "decision": _str, "comment": _str, "at": _str}
GRANT: Spec = {
    "id": _str,
    "approval": _str,
    "intent_hash": _hex64,
    "expires_at": _str,
    "standing_grant": _opt_str,
    "revoked_at": _opt_str,
}
STANDING: Spec = {"id": _str, "terms": _dict, "issued_by": _str, "signed_by": _list}
RESOLUTION: Spec = {
    "id": _str,
    "declared_by": _str,
    "note": _str,
    "created_at": _str,
    "review": lambda v: v is None or isinstance(v, dict),
}
REVIEW: Spec = {"decision": _str, "user": _opt_str, "note": _str, "at": _str}
CONSISTENCY: Spec = {
    "first": _is_int,
    "second": _is_int,
    "hashes": _list,
    "first_checkpoint": lambda v: v is None or isinstance(v, dict),
}


class _Checker:
    def __init__(self, report: Report) -> None:
        self.report = report

    def fail(self, where: str, problem: str) -> None:
        if len(self.report.failures) < MAX_FAILURES:
            self.report.failures.append(Failure(where, problem))
        else:
            raise _Stop

    def shape(self, value: Any, spec: Spec, where: str, *, optional: tuple[str, ...] = ()) -> bool:
        """Whether ``value`` is an object with exactly the fields of ``spec`` (those in
        ``optional`` may be absent), each of its type; each difference is a failure."""
        if not isinstance(value, dict):
            self.fail(where, "is not a JSON object")
            return False
        good = True
        for name in sorted(set(value) - set(spec)):
            self.fail(where, f"has a field {name[:60]!r} that no bundle has")
            good = False
        for name, valid in spec.items():
            if name not in value:
                if name not in optional:
                    self.fail(where, f"lacks its field {name!r}")
                    good = False
            elif not valid(value[name]):
                self.fail(where, f"its field {name!r} is not of its type")
                good = False
        return good


def _b64(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        digest = base64.b64decode(value, validate=True)
    except binascii.Error:
        return None
    # Canonical only: base64 leaves the last character's low bits free, and a hash
    # written two ways would be a byte changed that changes nothing.
    if len(digest) != merkle.HASH_SIZE or base64.b64encode(digest).decode() != value:
        return None
    return digest


def _time(value: Any) -> datetime | None:
    """An RFC 3339 time with its offset, read strictly (``datetime.fromisoformat`` alone
    takes any character between the date and the time)."""
    if not isinstance(value, str) or _RFC3339.fullmatch(value) is None:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


def same_time(a: Any, b: Any) -> bool:
    """Whether two RFC 3339 times (or two nulls) name the same instant."""
    if a is None or b is None:
        return a is None and b is None
    first, second = _time(a), _time(b)
    return first is not None and first == second


def _event_where(event: dict[str, Any]) -> str:
    return (
        f"event {event.get('stream')!s:.60} seq {event.get('seq')} (id {event.get('id')}, "
        f"leaf {event.get('leaf_index')})"
    )


# --- The verification ------------------------------------------------------------------


def verify_bundle(
    bundle: dict[str, Any],
    *,
    key: Any,
    origin: str | None = None,
    witnesses: Sequence[str] = (),
) -> Report:
    """Every check of the module's docstring; the failures in the order found."""
    report = Report(bundle=bundle)
    check = _Checker(report)
    try:
        with contextlib.suppress(_Stop):
            _verify(check, bundle, key=key, origin=origin, witnesses=list(witnesses))
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:
        # A bundle shaped otherwise than any the checks read (each of its objects was
        # held to its form, but not every value inside an event's data): a failure,
        # never a verified bundle or a crash.
        report.failures.append(
            Failure("the bundle", f"it cannot be read as a bundle ({exc!r:.200})")
        )
    return report


def _verify(
    check: _Checker, bundle: dict[str, Any], *, key: Any, origin: str | None, witnesses: list[str]
) -> None:
    if not check.shape(bundle, TOP, "the bundle"):
        return
    if bundle["format"] != FORMAT:
        check.fail("the bundle", f"its format is not {FORMAT}")
    checkpoint = _checkpoint(check, bundle, key=key, origin=origin)
    events = bundle["events"]
    related = bundle["related_events"]
    if len(events) + len(related) > MAX_EVENTS:
        check.fail("the bundle", f"it holds more than {MAX_EVENTS} events")
        return
    rows = sum(len(bundle[name]) for name in ("attempts", "approvals", "grants", "resolutions"))
    if rows + len(bundle["standing_grants"]) > MAX_ROWS:
        check.fail("the bundle", f"it holds more than {MAX_ROWS} rows")
        return
    good = [e for e in events if check.shape(e, EVENT, _event_where_safe(e))]
    good_related = [e for e in related if check.shape(e, EVENT, _event_where_safe(e))]
    if len(good) != len(events) or len(good_related) != len(related):
        return
    _events(check, [*events, *related], checkpoint)
    _chain(check, bundle)
    _witnesses(check, bundle, checkpoint, key=key, witnesses=witnesses)
    _rows(check, bundle)


def _event_where_safe(event: Any) -> str:
    return _event_where(event) if isinstance(event, dict) else "an event"


def _checkpoint(
    check: _Checker, bundle: dict[str, Any], *, key: Any, origin: str | None
) -> Checkpoint | None:
    body = bundle["checkpoint"]
    if not check.shape(body, CHECKPOINT, "the checkpoint"):
        return None
    expected = origin if origin is not None else bundle["origin"]
    if origin is not None and bundle["origin"] != origin:
        check.fail(
            "the bundle",
            f"its origin is {bundle['origin']!r:.80}, not the log's origin {origin!r}",
        )
    try:
        signed = open_checkpoint(body["note"], key=key, origin=expected)
    except NoteError as exc:
        check.fail("the checkpoint's signed note", str(exc))
        return None
    if signed.origin != expected:
        check.fail("the checkpoint's signed note", f"it is a checkpoint of {signed.origin!r:.80}")
    said = {
        "size": signed.size,
        "root": base64.b64encode(signed.root).decode(),
        "origin": signed.origin,
    }
    for name, value in said.items():
        if body[name] != value:
            check.fail(
                f"the checkpoint's field {name!r}",
                f"it says {body[name]!r:.80}, but its signed note says {value!r:.80}",
            )
    if signed.time is None or not same_time(body["time"], signed.time.isoformat()):
        check.fail("the checkpoint's field 'time'", "it is not the time its signed note says")
    report_checkpoint = signed
    check.report.checkpoint = report_checkpoint
    return signed


def _events(check: _Checker, events: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
    """Step 3 (and 4's hashes and proofs): each event's hash and inclusion."""
    ids: set[int] = set()
    leaves: set[int] = set()
    for event in events:
        where = _event_where(event)
        if event["id"] in ids:
            check.fail(where, "another event of the bundle has its id")
        if event["leaf_index"] in leaves:
            check.fail(where, "another event of the bundle is at its leaf index")
        ids.add(event["id"])
        leaves.add(event["leaf_index"])
        try:
            recomputed = event_hash(event)
        except (ValueError, TypeError, OverflowError, RecursionError) as exc:
            check.fail(where, f"its fields cannot be put in RFC 8785 canonical form ({exc})")
            continue
        if recomputed != event["hash"]:
            check.fail(
                where,
                f"its fields (stream, seq, kind, from, to, actor, at, data, prev) hash to "
                f"{recomputed[:16]}..., not to its hash {str(event['hash'])[:16]}...: "
                "the event was changed",
            )
        proof = [_b64(value) for value in event["inclusion"]]
        if len(proof) > MAX_PROOF or any(value is None for value in proof):
            check.fail(where, "its inclusion proof is not a list of base64 SHA-256 hashes")
            continue
        if checkpoint is None:
            continue
        leaf = merkle.leaf_hash(
            entry(event=event["id"], hash=recomputed, seq=event["seq"], stream=event["stream"])
        )
        if not merkle.verify_inclusion(
            index=event["leaf_index"],
            size=checkpoint.size,
            leaf=leaf,
            proof=[value for value in proof if value is not None],
            root=checkpoint.root,
        ):
            check.fail(
                where,
                f"its inclusion proof does not lead from its leaf (its id, hash, seq and "
                f"stream) at index {event['leaf_index']} to the root of the checkpoint of "
                f"size {checkpoint.size}: it is not the event the log holds there",
            )


def _chain(check: _Checker, bundle: dict[str, Any]) -> None:
    """Step 3's chain: the operation's events, seq 1 to the last, linked and
    continuous; and step 4's links between the other events where seqs are adjacent."""
    events = bundle["events"]
    op_id = bundle["operation"].get("id") if isinstance(bundle["operation"], dict) else None
    if not events:
        check.fail("the operation's events", "there are none")
        return
    previous: dict[str, Any] | None = None
    for position, event in enumerate(events, start=1):
        where = _event_where(event)
        if event["stream"] != op_id:
            check.fail(where, f"it is not of the operation's stream ({op_id!s:.60})")
        if event["seq"] != position:
            check.fail(
                where, f"it is event {position} of the stream, but its seq says {event['seq']}"
            )
        expected_prev = GENESIS if previous is None else previous["hash"]
        if event["prev"] != expected_prev:
            what = "64 zeros (the genesis)" if previous is None else "the hash of the event before"
            check.fail(where, f"its prev is not {what}: the chain is broken here")
        if previous is not None and event["from"] != previous["to"]:
            check.fail(
                where,
                f"it starts from {event['from']!r:.40}, but the event before left "
                f"{previous['to']!r:.40}",
            )
        previous = event
    by_seq = {(e["stream"], e["seq"]): e for e in bundle["related_events"]}
    for (stream, seq), event in by_seq.items():
        before = GENESIS if seq == 1 else by_seq.get((stream, seq - 1), {}).get("hash")
        if before is not None and event["prev"] != before:
            check.fail(_event_where(event), "its prev is not the hash of its stream's event before")


def _witnesses(
    check: _Checker,
    bundle: dict[str, Any],
    checkpoint: Checkpoint | None,
    *,
    key: Any,
    witnesses: list[str],
) -> None:
    """Step 5: each witness's checkpoint extended by the bundle's; each consistency
    proof of the bundle checked against a signed root."""
    if checkpoint is None:
        return
    origin = checkpoint.origin
    kept: dict[int, Checkpoint] = {}
    for number, note in enumerate(witnesses, start=1):
        try:
            witnessed = open_checkpoint(note, key=key, origin=origin)
        except NoteError as exc:
            check.fail(f"the witness's checkpoint {number}", str(exc))
            continue
        kept[witnessed.size] = witnessed
    # The witness sizes whose proof holds, and those that have a proof at all.
    held: set[int] = set()
    proved: set[int] = set()
    for number, proof in enumerate(bundle["consistency"], start=1):
        if not check.shape(proof, CONSISTENCY, f"consistency proof {number}"):
            continue
        where = f"the consistency proof from size {proof['first']} to {proof['second']}"
        if proof["second"] != checkpoint.size or not 0 < proof["first"] <= checkpoint.size:
            check.fail(where, f"it does not lead to the checkpoint's size, {checkpoint.size}")
            continue
        proved.add(proof["first"])
        hashes = [_b64(value) for value in proof["hashes"]]
        if len(hashes) > MAX_PROOF or any(value is None for value in hashes):
            check.fail(where, "its hashes are not a list of base64 SHA-256 hashes")
            continue
        roots: list[tuple[str, bytes]] = []
        if proof["first_checkpoint"] is not None:
            first = _first_checkpoint(check, proof, key=key, origin=origin, where=where)
            if first is not None:
                roots.append(("the log's own checkpoint of that size", first.root))
        if proof["first"] in kept:
            roots.append(("the witness's checkpoint", kept[proof["first"]].root))
        if not roots:
            check.fail(
                where,
                "nothing here signs its first root: give the witness's checkpoint of size "
                f"{proof['first']} with --checkpoint",
            )
        holds = bool(roots)
        for whose, root in roots:
            if not merkle.verify_consistency(
                first=proof["first"],
                second=proof["second"],
                first_root=root,
                second_root=checkpoint.root,
                proof=[value for value in hashes if value is not None],
            ):
                holds = False
                check.fail(
                    where,
                    f"it does not prove that the bundle's checkpoint extends {whose}: the "
                    "log's history up to that size was rewritten, or the proof was changed",
                )
        if holds:
            held.add(proof["first"])
    for size, witnessed in sorted(kept.items()):
        where = f"the witness's checkpoint of size {size}"
        if size > checkpoint.size:
            check.fail(
                where,
                f"it is larger than the bundle's checkpoint (size {checkpoint.size}): export "
                f"the bundle again, with --witness-size {size}",
            )
        elif size == checkpoint.size:
            if witnessed.root != checkpoint.root:
                check.fail(
                    where,
                    "the bundle's checkpoint of the same size has another root: the log's "
                    "history was rewritten after the witness kept it",
                )
            else:
                check.report.witnessed.append(witnessed)
        elif size not in proved:
            check.fail(
                where,
                "the bundle holds no consistency proof from its size: export it with "
                f"'effectgate audit export OPERATION_ID --to FILE --witness-size {size}'",
            )
        elif size in held:
            check.report.witnessed.append(witnessed)


def _first_checkpoint(
    check: _Checker, proof: dict[str, Any], *, key: Any, origin: str, where: str
) -> Checkpoint | None:
    body = proof["first_checkpoint"]
    if not check.shape(body, CHECKPOINT, f"{where}, its first checkpoint"):
        return None
    try:
        signed = open_checkpoint(body["note"], key=key, origin=origin)
    except NoteError as exc:
        check.fail(f"{where}, its first checkpoint", str(exc))
        return None
    said = {"size": signed.size, "root": base64.b64encode(signed.root).decode(), "origin": origin}
    for name, value in said.items():
        if body[name] != value:
            check.fail(
                f"{where}, its first checkpoint's field {name!r}",
                "it is not what its signed note says",
            )
    if signed.time is None or not same_time(body["time"], signed.time.isoformat()):
        check.fail(f"{where}, its first checkpoint's field 'time'", "it is not what its note says")
    if signed.size != proof["first"]:
        check.fail(where, f"its first checkpoint is of size {signed.size}, not {proof['first']}")
        return None
    return signed


# --- The rows --------------------------------------------------------------------------


def _data(event: dict[str, Any]) -> dict[str, Any]:
    return _dict_of(event.get("data"))


def _dict_of(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class _Events(list[dict[str, Any]]):
    """The operation's events in seq order, found by kind and one data field through
    indexes built once: a hostile bundle's rows cannot make the checks quadratic."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        super().__init__(events)
        self._positions = {id(event): position for position, event in enumerate(events)}
        self._by_kind: dict[str, list[int]] = {}
        for position, event in enumerate(events):
            self._by_kind.setdefault(event["kind"], []).append(position)
        self._by_field: dict[str, dict[tuple[str, str], list[int]]] = {}
        # For each position, the next one whose event leaves ``executing``, and whether
        # any later event leaves the status other than ``outcome_unknown``.
        self._next_from_executing: list[int | None] = [None] * (len(events) + 1)
        self._answered_after: list[bool] = [False] * (len(events) + 1)
        for position in range(len(events) - 1, -1, -1):
            event = events[position]
            self._next_from_executing[position] = (
                position
                if event["from"] == "executing"
                else self._next_from_executing[position + 1]
            )
            self._answered_after[position] = (
                event["to"] != "outcome_unknown" or self._answered_after[position + 1]
            )

    def _field(self, name: str) -> dict[tuple[str, str], list[int]]:
        index = self._by_field.get(name)
        if index is None:
            index = {}
            for position, event in enumerate(self):
                data = _data(event)
                if name in data:
                    key = (event["kind"], _key(data[name]))
                    index.setdefault(key, []).append(position)
            self._by_field[name] = index
        return index

    def of(self, *kinds: str, **match: Any) -> list[dict[str, Any]]:
        """The events of ``kinds`` (whose data holds ``match``, one field at most), in
        seq order."""
        if len(match) > 1:
            raise ValueError("one field at most")
        if match:
            ((name, value),) = match.items()
            index = self._field(name)
            positions = [p for kind in kinds for p in index.get((kind, _key(value)), [])]
        else:
            positions = [p for kind in kinds for p in self._by_kind.get(kind, [])]
        return [self[p] for p in sorted(positions)]

    def next_from_executing(self, after: dict[str, Any]) -> dict[str, Any] | None:
        """The first event after ``after`` that leaves ``executing``."""
        position = self._next_from_executing[self._position(after) + 1]
        return None if position is None else self[position]

    def answered_after(self, after: dict[str, Any]) -> bool:
        """Whether an event after ``after`` left the status other than outcome_unknown."""
        return self._answered_after[self._position(after) + 1]

    def _position(self, event: dict[str, Any]) -> int:
        return self._positions[id(event)]


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=True)


def _rows(check: _Checker, bundle: dict[str, Any]) -> None:
    """Step 6."""
    events = _Events(bundle["events"])
    unrecorded = bundle["unrecorded"]
    op = bundle["operation"]
    if not check.shape(
        op, OPERATION, "the operation", optional=("idempotency_key", "effect_class")
    ):
        return
    _operation(check, bundle, op, events, unrecorded)
    _contract(check, bundle, op)
    _attempts(check, bundle, op, events, unrecorded)
    _approvals(check, bundle, events)
    _grants(check, bundle, op, events)
    _standing_grants(check, bundle, op)
    _resolutions(check, bundle, events)
    for name in unrecorded:
        if not re.fullmatch(
            r"operation\.(idempotency_key|effect_class)|attempts\.[1-9][0-9]{0,5}\.outcome", name
        ):
            check.fail(f"unrecorded {name[:60]!r}", "no bundle leaves such a field unrecorded")


def _differs(check: _Checker, where: str, name: str, row: Any, recorded: Any, source: str) -> None:
    if row != recorded:
        check.fail(
            f"{where}, field {name!r}",
            f"it is {_short(row)}, but {source} records {_short(recorded)}",
        )


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=True, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _operation(
    check: _Checker,
    bundle: dict[str, Any],
    op: dict[str, Any],
    events: _Events,
    unrecorded: dict[str, Any],
) -> None:
    where = f"the operation {op['id']:.60}"
    first = events[0]
    if first["kind"] != "registered":
        check.fail(where, f"its first event is {first['kind']!r:.40}, not registered")
        return
    registered = _data(first)
    for name in ("tool", "tool_version", "operation_key", "call_id", "intent_hash"):
        _differs(check, where, name, op[name], registered.get(name), "its registered event")
    if "idempotency_key" in registered:
        if "idempotency_key" not in op:
            check.fail(
                where, "lacks its field 'idempotency_key', which its registered event records"
            )
        else:
            _differs(
                check,
                where,
                "idempotency_key",
                op["idempotency_key"],
                registered["idempotency_key"],
                "its registered event",
            )
        if "operation.idempotency_key" in unrecorded:
            check.fail("unrecorded 'operation.idempotency_key'", "its registered event records it")
    elif "idempotency_key" in op or "operation.idempotency_key" not in unrecorded:
        check.fail(
            where,
            "its idempotency key is not recorded by its registered event: it belongs in "
            "unrecorded, not in the row",
        )
    try:
        recomputed = intent_hash(
            tool=op["tool"], arguments=op["arguments"], principal=op["principal"]
        )
    except (ValueError, TypeError, OverflowError, RecursionError):
        recomputed = None
    if recomputed != op["intent_hash"]:
        check.fail(
            f"{where}, field 'arguments' or 'principal'",
            "the intent hash of its tool, arguments and principal is not its intent_hash: "
            "they are not what was registered",
        )
    _differs(check, where, "status", op["status"], events[-1]["to"], "its last event")
    claims = len(events.of("claimed"))
    _differs(check, where, "attempts", op["attempts"], claims, f"its {claims} claimed events")


def _contract(check: _Checker, bundle: dict[str, Any], op: dict[str, Any]) -> None:
    contract = bundle["contract"]
    where = "the contract version"
    registered = [e for e in bundle["related_events"] if e["kind"] == "contract_registered"]
    if contract is None:
        if registered:
            check.fail(where, "it is missing, but its contract_registered event is in the bundle")
        if "effect_class" in op or "operation.effect_class" not in bundle["unrecorded"]:
            check.fail(
                "the operation, field 'effect_class'",
                "no contract version in the bundle records it: it belongs in unrecorded",
            )
        return
    if "effect_class" not in op or "operation.effect_class" in bundle["unrecorded"]:
        check.fail("the operation", "lacks its field 'effect_class', which its contract records")
        return
    if not check.shape(contract, CONTRACT, where):
        return
    _differs(check, where, "tool", contract["tool"], op["tool"], "the operation")
    _differs(check, where, "version", contract["version"], op["tool_version"], "the operation")
    try:
        digest = sha256_json(contract["contract"])
    except (ValueError, TypeError, OverflowError, RecursionError):
        digest = None
    if digest != contract["contract_hash"]:
        check.fail(f"{where}, field 'contract'", "its SHA-256 is not its contract_hash")
    events = [
        e
        for e in registered
        if e["stream"] == f"tool:{contract['tool']}"
        and _data(e).get("version") == contract["version"]
    ]
    if len(events) != 1 or len(registered) != 1:
        check.fail(where, "the bundle does not hold exactly its one contract_registered event")
    else:
        _differs(
            check,
            where,
            "contract_hash",
            contract["contract_hash"],
            _data(events[0]).get("contract_hash"),
            "its contract_registered event",
        )
    effect_class = contract["contract"].get("effect_class")
    _differs(
        check, "the operation", "effect_class", op["effect_class"], effect_class, "its contract"
    )


def _attempts(
    check: _Checker,
    bundle: dict[str, Any],
    op: dict[str, Any],
    events: _Events,
    unrecorded: dict[str, Any],
) -> None:
    """Each attempt from its claimed event and the event that closed it: an outcome
    (its kind, time and the digest of the answer), a lease expiry, or, for an attempt
    overtaken by news of the effect, the event that did so."""
    rows = bundle["attempts"]
    claims = events.of("claimed")
    if len(rows) != len(claims):
        check.fail("the attempts", f"there are {len(rows)}, but {len(claims)} claimed events")
    for position, row in enumerate(rows, start=1):
        where = f"attempt {position}"
        if not check.shape(row, ATTEMPT, where, optional=("outcome",)):
            continue
        if row["number"] != position:
            check.fail(where, f"its number is {row['number']}, not {position}")
            continue
        claimed = events.of("claimed", attempt=position)
        if len(claimed) != 1:
            check.fail(where, "no claimed event (or more than one) records it")
            continue
        if not same_time(row["claimed_at"], claimed[0]["at"]):
            check.fail(
                f"{where}, field 'claimed_at'",
                f"it is {row['claimed_at']:.40}, but its claimed event is dated {claimed[0]['at']}",
            )
        _attempt_end(check, row, where, events, claimed[0], unrecorded)


def _attempt_end(
    check: _Checker,
    row: dict[str, Any],
    where: str,
    events: _Events,
    claimed: dict[str, Any],
    unrecorded: dict[str, Any],
) -> None:
    number = row["number"]
    outcome = events.of("outcome", attempt=number)
    expired = events.of("lease_expired", attempt=number)
    key = f"attempts.{number}.outcome"
    if outcome:
        event, data = outcome[0], _data(outcome[0])
        expected = ATTEMPT_STATUS_AFTER.get(str(data.get("kind")))
        _differs(check, where, "status", row["status"], expected, "its outcome event")
        if not same_time(row["closed_at"], event["at"]):
            check.fail(f"{where}, field 'closed_at'", "it is not the time of its outcome event")
        if "outcome_hash" in data:
            if key in unrecorded or "outcome" not in row:
                check.fail(where, "its outcome event records its answer, but the row lacks it")
            else:
                try:
                    digest = sha256_json(row["outcome"])
                except (ValueError, TypeError, OverflowError, RecursionError):
                    digest = None
                if digest != data["outcome_hash"]:
                    check.fail(
                        f"{where}, field 'outcome'",
                        "its digest is not the outcome_hash its outcome event records: it is "
                        "not the answer the runner posted",
                    )
        elif "outcome" in row or key not in unrecorded:
            check.fail(
                where,
                "its outcome event records no digest of the answer: it belongs in unrecorded",
            )
        return
    if ("outcome" in row and row["outcome"] is not None) or key in unrecorded:
        check.fail(f"{where}, field 'outcome'", "no outcome event of this attempt records one")
    if expired:
        _differs(check, where, "status", row["status"], "lease_expired", "its lease_expired event")
        if not same_time(row["closed_at"], expired[0]["at"]):
            check.fail(
                f"{where}, field 'closed_at'", "it is not the time of its lease_expired event"
            )
        return
    if row["status"] == "executing":
        if row["closed_at"] is not None:
            check.fail(f"{where}, field 'closed_at'", "an executing attempt has not closed")
        return
    # Overtaken: the effect was reported done (a late success of an earlier attempt, a
    # provider's event) while this one executed.
    later = events.next_from_executing(claimed)
    overtaken = later if later and later["kind"] in ("late_success", "inbound_evidence") else None
    if row["status"] != "superseded" or overtaken is None:
        check.fail(
            f"{where}, field 'status'",
            f"it is {row['status']!r:.40}, but no event ended this attempt so",
        )
    elif not same_time(row["closed_at"], overtaken["at"]):
        check.fail(
            f"{where}, field 'closed_at'", f"it is not the time of its {overtaken['kind']} event"
        )


def _approvals(check: _Checker, bundle: dict[str, Any], events: _Events) -> None:
    """Each request from the event that opened it (terms, reason), its settling event
    (status) and its decision events (who, verdict, comment, when); every request an
    event opened has its row."""
    rows = bundle["approvals"]
    seen: set[str] = set()
    for row in rows:
        if not check.shape(row, APPROVAL, "an approval request", optional=("terms", "reason")):
            continue
        where = f"approval request {row['id']:.60}"
        seen.add(row["id"])
        opening = events.of(*REQUEST_OPENED_BY, approval=row["id"])
        if not opening:
            check.fail(where, "no event of the operation opened it")
            continue
        data = _data(opening[0])
        for name in ("terms", "reason"):
            if name in data:
                if name not in row:
                    check.fail(where, f"lacks its field {name!r}, which its opening event records")
                else:
                    _differs(
                        check, where, name, row[name], data[name], f"its {opening[0]['kind']} event"
                    )
            elif name in row:
                check.fail(f"{where}, field {name!r}", "its opening event does not record it")
        settled = events.of(*REQUEST_STATUS_AFTER, approval=row["id"])
        if settled:
            expected = REQUEST_STATUS_AFTER[settled[-1]["kind"]]
            _differs(
                check,
                where,
                "status",
                row["status"],
                expected,
                f"its last {settled[-1]['kind']} event",
            )
        elif row["status"] not in REQUEST_STATUSES_WITHOUT_EVENT:
            check.fail(
                f"{where}, field 'status'", f"it is {row['status']!r:.40}, but no event settled it"
            )
        _decisions(check, row, where, events.of("decision", approval=row["id"]))
    for event in events.of(*REQUEST_OPENED_BY):
        approval = _data(event).get("approval")
        if isinstance(approval, str) and approval not in seen:
            check.fail(
                _event_where(event),
                f"it opened approval request {approval:.60}, which the bundle lacks",
            )


def _decisions(
    check: _Checker, row: dict[str, Any], where: str, recorded: list[dict[str, Any]]
) -> None:
    decisions = row["decisions"]
    if len(decisions) != len(recorded):
        check.fail(
            f"{where}, field 'decisions'",
            f"it lists {len(decisions)}, but {len(recorded)} decision events record them",
        )
    by_actor = {e["actor"]: e for e in recorded}
    for position, decision in enumerate(decisions, start=1):
        place = f"{where}, decision {position}"
        if not check.shape(decision, DECISION, place):
            continue
        event = by_actor.get(f"user:{decision['user']}")
        if event is None:
            check.fail(
                f"{place}, field 'user'", f"no decision event by user:{decision['user']:.60}"
            )
            continue
        data = _data(event)
        _differs(
            check,
            place,
            "decision",
            decision["decision"],
            data.get("decision"),
            "its decision event",
        )
        _differs(
            check, place, "comment", decision["comment"], data.get("comment"), "its decision event"
        )
        if not same_time(decision["at"], event["at"]):
            check.fail(f"{place}, field 'at'", "it is not the time of its decision event")


def _grants(check: _Checker, bundle: dict[str, Any], op: dict[str, Any], events: _Events) -> None:
    seen: set[str] = set()
    for row in bundle["grants"]:
        if not check.shape(row, GRANT, "a grant"):
            continue
        where = f"grant {row['id']:.60}"
        seen.add(row["id"])
        granted = events.of("granted", grant=row["id"])
        if len(granted) != 1:
            check.fail(where, "no granted event (or more than one) gave it")
            continue
        data = _data(granted[0])
        for name in ("approval", "intent_hash"):
            _differs(check, where, name, row[name], data.get(name), "its granted event")
        _differs(
            check,
            where,
            "standing_grant",
            row["standing_grant"],
            data.get("standing_grant"),
            "its granted event",
        )
        if not same_time(row["expires_at"], data.get("expires_at")):
            check.fail(
                f"{where}, field 'expires_at'", "it is not the expiry its granted event records"
            )
        revoked = events.of("grant_revoked", grant=row["id"])
        if revoked and not same_time(row["revoked_at"], revoked[0]["at"]):
            check.fail(
                f"{where}, field 'revoked_at'", "it is not the time of its grant_revoked event"
            )
        if not revoked and row["revoked_at"] is not None:
            check.fail(f"{where}, field 'revoked_at'", "no grant_revoked event revoked it")
    for event in events.of("granted"):
        grant = _data(event).get("grant")
        if isinstance(grant, str) and grant not in seen:
            check.fail(_event_where(event), f"it gave grant {grant:.60}, which the bundle lacks")


def _standing_grants(check: _Checker, bundle: dict[str, Any], op: dict[str, Any]) -> None:
    """Each standing grant that gave one of the operation's grants: its terms and issuer
    from its issued event, its signers from its activation, the use that approved this
    operation's intent; the bundle's other events are only of these streams and kinds."""
    related = bundle["related_events"]
    rows: dict[str, dict[str, Any]] = {}
    for row in bundle["standing_grants"]:
        if check.shape(row, STANDING, "a standing grant"):
            rows[row["id"]] = row
    used_by = {
        g["standing_grant"]: g
        for g in bundle["grants"]
        if isinstance(g, dict) and isinstance(g.get("standing_grant"), str)
    }
    for grant_id in used_by:
        if grant_id not in rows:
            check.fail(
                f"standing grant {grant_id:.60}",
                "a grant of the operation names it, but the bundle lacks it",
            )
    streams: dict[str, list[dict[str, Any]]] = {}
    for event in related:
        streams.setdefault(event["stream"], []).append(event)
    for event in related:
        if event["kind"] == "contract_registered" and event["stream"].startswith("tool:"):
            continue
        stream_of = event["stream"].removeprefix("sgr:")
        if (
            event["kind"] not in STANDING_KINDS
            or stream_of not in rows
            or not event["stream"].startswith("sgr:")
        ):
            check.fail(_event_where(event), "no row of the bundle rests on it")
    for grant_id, row in rows.items():
        where = f"standing grant {grant_id:.60}"
        stream = streams.get(f"sgr:{grant_id}", [])
        issued = [e for e in stream if e["kind"] == "standing_grant_issued"]
        activated = [e for e in stream if e["kind"] == "standing_grant_activated"]
        if len(issued) != 1 or len(activated) != 1:
            check.fail(where, "the bundle lacks its issued or its activated event")
            continue
        _differs(
            check, where, "terms", row["terms"], _data(issued[0]).get("terms"), "its issued event"
        )
        _differs(
            check,
            where,
            "issued_by",
            f"user:{row['issued_by']}",
            issued[0]["actor"],
            "its issued event",
        )
        _differs(
            check,
            where,
            "signed_by",
            row["signed_by"],
            _data(activated[0]).get("signed_by"),
            "its activated event",
        )
        grant = used_by.get(grant_id)
        if grant is None:
            check.fail(where, "no grant of the operation was given by it")
            continue
        used = [
            e
            for e in stream
            if e["kind"] == "standing_grant_used" and _data(e).get("grant") == grant["id"]
        ]
        if len(used) != 1:
            check.fail(where, f"the bundle lacks the use that gave grant {grant['id']:.60}")
            continue
        data = _data(used[0])
        _differs(
            check,
            f"{where}, its use",
            "operation",
            op["id"],
            data.get("operation"),
            "its standing_grant_used event",
        )
        _differs(
            check,
            f"{where}, its use",
            "intent_hash",
            op["intent_hash"],
            data.get("intent_hash"),
            "its standing_grant_used event",
        )


def _resolutions(check: _Checker, bundle: dict[str, Any], events: _Events) -> None:
    seen: set[str] = set()
    for row in bundle["resolutions"]:
        if not check.shape(row, RESOLUTION, "a resolution"):
            continue
        where = f"resolution {row['id']:.60}"
        seen.add(row["id"])
        proposed = events.of("resolution_proposed", resolution=row["id"])
        if len(proposed) != 1:
            check.fail(where, "no resolution_proposed event (or more than one) records it")
            continue
        event = proposed[0]
        _differs(
            check,
            where,
            "declared_by",
            f"user:{row['declared_by']}",
            event["actor"],
            "its resolution_proposed event",
        )
        _differs(
            check,
            where,
            "note",
            row["note"],
            _data(event).get("note"),
            "its resolution_proposed event",
        )
        if not same_time(row["created_at"], event["at"]):
            check.fail(
                f"{where}, field 'created_at'",
                "it is not the time of its resolution_proposed event",
            )
        _review(check, row, where, events, event)
    for event in events.of("resolution_proposed"):
        resolution = _data(event).get("resolution")
        if isinstance(resolution, str) and resolution not in seen:
            check.fail(
                _event_where(event),
                f"it proposed resolution {resolution:.60}, which the bundle lacks",
            )


def _review(
    check: _Checker,
    row: dict[str, Any],
    where: str,
    events: _Events,
    proposed: dict[str, Any],
) -> None:
    review = row["review"]
    confirmed = events.of("reconciled", resolution=row["id"])
    disputed = events.of("resolution_disputed", resolution=row["id"])
    if review is None:
        if confirmed or disputed:
            check.fail(
                f"{where}, field 'review'", "it is empty, but an event answered the resolution"
            )
        return
    place = f"{where}, its review"
    if review.get("decision") == "withdrawn":
        check.shape(review, {"decision": _str}, place)
        if not events.answered_after(proposed) or confirmed or disputed:
            check.fail(
                place,
                "it is withdrawn, but the events do not show the operation answered otherwise",
            )
        return
    if not check.shape(review, REVIEW, place):
        return
    answers = {"confirmed": confirmed, "disputed": disputed}.get(review["decision"])
    if answers is None or len(answers) != 1:
        check.fail(f"{place}, field 'decision'", f"no event records it {review['decision']!r:.40}")
        return
    event = answers[0]
    _differs(
        check, place, "user", f"user:{review['user']}", event["actor"], f"its {event['kind']} event"
    )
    note = (
        _dict_of(_data(event).get("evidence")).get("confirmation")
        if event["kind"] == "reconciled"
        else _data(event).get("note")
    )
    _differs(check, place, "note", review["note"], note, f"its {event['kind']} event")
    if not same_time(review["at"], event["at"]):
        check.fail(f"{place}, field 'at'", f"it is not the time of its {event['kind']} event")
