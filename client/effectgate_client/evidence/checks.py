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
import contextlib
from collections.abc import Sequence
from typing import Any

from . import merkle
from .checks_form import (
    CHECKPOINT,
    CONSISTENCY,
    EVENT,
    FORMAT,
    GENESIS,
    MAX_BUNDLE_BYTES,
    MAX_EVENTS,
    MAX_PROOF,
    MAX_ROWS,
    TOP,
    BundleError,
    Failure,
    Report,
    _b64,
    _Checker,
    _event_where,
    _Stop,
    entry,
    event_hash,
    intent_hash,
    load_bundle,
    same_time,
    sha256_json,
)
from .notes import Checkpoint, NoteError, open_checkpoint
from .rows import _rows

__all__ = [
    "MAX_BUNDLE_BYTES",
    "BundleError",
    "Failure",
    "Report",
    "entry",
    "event_hash",
    "intent_hash",
    "load_bundle",
    "sha256_json",
    "verify_bundle",
]


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
