"""A ledger event as a leaf of the transparency log (pure: no Django).

The leaf's entry is the RFC 8785 canonical JSON of the event's id, hash, seq and stream:
the event hash covers every field of the event and its link to the previous one
(``services.core.event_hash``), so an event rewritten after it was sealed has another
leaf, and the root of every checkpoint since no longer matches.
"""

from ..canonical import canonical_json
from .merkle import leaf_hash


def entry(*, event: int, hash: str, seq: int, stream: str) -> bytes:
    return canonical_json({"event": event, "hash": hash, "seq": seq, "stream": stream})


def event_leaf(*, event: int, hash: str, seq: int, stream: str) -> bytes:
    """The leaf hash of an event: SHA-256(0x00 || entry)."""
    return leaf_hash(entry(event=event, hash=hash, seq=seq, stream=stream))
