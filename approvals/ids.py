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


def new_id(prefix: str) -> str:
    value = (time.time_ns() // 1_000_000) << 80 | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"
