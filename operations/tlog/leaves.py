"""A ledger event as a leaf of the transparency log (pure: no Django).

The leaf's entry is the RFC 8785 canonical JSON of the event's id, hash, seq and stream:
the event hash covers every field of the event and its link to the previous one
(``services.core.event_hash``), so an event rewritten after it was sealed has another
leaf, and the root of every checkpoint since no longer matches.
"""

import json

from ..canonical import canonical_json
from .merkle import leaf_hash

# Integers RFC 8785 writes as plain decimals (beyond, as an ECMAScript number would).
_SAFE = 2**53 - 1


def entry(*, event: int, hash: str, seq: int, stream: str) -> bytes:
    """The RFC 8785 canonical JSON of ``{"event", "hash", "seq", "stream"}``.

    Written directly for this one shape, the sealer's hot loop (the general encoder
    costs eighty microseconds an entry): the keys are already in RFC 8785's order,
    the integers plain decimals, and Python's JSON string escapes without
    ``ensure_ascii`` (short forms for backspace, tab, newline, form feed and carriage
    return, a lowercase six-character escape for the other control characters,
    everything else as itself) are RFC 8785's.
    tests/operations/test_tlog_merkle.py holds it equal to the general encoder.
    """
    if not (0 <= event <= _SAFE and 0 <= seq <= _SAFE):
        return canonical_json({"event": event, "hash": hash, "seq": seq, "stream": stream})
    text = (
        f'{{"event":{event},"hash":{json.dumps(hash, ensure_ascii=False)},"seq":{seq},'
        f'"stream":{json.dumps(stream, ensure_ascii=False)}}}'
    )
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate: the general encoder says what it does
        return canonical_json({"event": event, "hash": hash, "seq": seq, "stream": stream})


def event_leaf(*, event: int, hash: str, seq: int, stream: str) -> bytes:
    """The leaf hash of an event: SHA-256(0x00 || entry)."""
    return leaf_hash(entry(event=event, hash=hash, seq=seq, stream=stream))
