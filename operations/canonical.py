"""Canonical JSON (RFC 8785, JCS) and the intent hash.

The intent hash is the published definition runners and auditors recompute:

    sha256_hex(JCS({"tool": <name>, "arguments": <frozen arguments>, "principal": <str>}))

Pure functions: no Django import.
"""

import hashlib
import json
from typing import Any

import rfc8785

# JCS's integers: those an IEEE 754 double holds exactly (rfc8785 refuses the others).
_SAFE = 2**53 - 1
_plain_dumps = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
).encode


def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON that Python's own encoder writes exactly as RFC 8785
    does: objects with ASCII keys (so sorting by code point is sorting by UTF-16 code
    unit), ASCII strings (escaped alike: the short escapes, ``\\u00xx`` in lower case for
    the other control characters, nothing else), integers within JCS's range, booleans
    and null. No float: JCS writes numbers as ECMAScript does, Python otherwise."""
    kind = type(value)
    if kind is str or isinstance(value, str):
        return value.isascii()
    if kind is dict:
        return all(
            isinstance(key, str) and key.isascii() and _plain(item) for key, item in value.items()
        )
    if kind is list or kind is tuple:
        return all(_plain(item) for item in value)
    if kind is int:
        return -_SAFE <= value <= _SAFE
    return value is None or kind is bool


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 canonical form of ``value`` (UTF-8 bytes): Python's C encoder where
    its output is the same (``_plain``; tests/operations/test_canonical.py holds both to
    each other), the ``rfc8785`` package for the rest."""
    if _plain(value):
        return _plain_dumps(value).encode()
    return rfc8785.dumps(value)


def intent_hash(*, tool: str, arguments: Any, principal: str) -> str:
    document = {"tool": tool, "arguments": arguments, "principal": principal}
    return hashlib.sha256(canonical_json(document)).hexdigest()


def sha256_hex(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()
