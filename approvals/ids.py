"""Opaque, prefixed, time-ordered identifiers (``op_...``, ``run_...``).

They live in ``approvals``, the lowest layer, because both apps mint them and
dependencies point one way (console -> operations -> approvals).

The 128-bit body is a 48-bit millisecond timestamp followed by 80 random bits, written
in Crockford's base32 so that identifiers sort in creation order. Keyset pagination
relies on that order; nothing relies on the timestamp being exact.
"""

import secrets
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def _encode(prefix: str, value: int) -> str:
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


def new_id(prefix: str) -> str:
    return _encode(prefix, (time.time_ns() // 1_000_000) << 80 | secrets.randbits(80))


def id_floor(prefix: str, at_ms: int) -> str:
    """The smallest identifier ``new_id(prefix)`` can mint at millisecond ``at_ms``
    and after: ``id >= id_floor(...)`` reads a time window through the primary key."""
    return _encode(prefix, at_ms << 80)
