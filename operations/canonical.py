"""Canonical JSON (RFC 8785, JCS) and the intent hash.

The intent hash is the published definition runners and auditors recompute:

    sha256_hex(JCS({"tool": <name>, "arguments": <frozen arguments>, "principal": <str>}))

Pure functions: no Django import.
"""

import hashlib
from typing import Any

import rfc8785


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 canonical form of ``value`` (UTF-8 bytes)."""
    return rfc8785.dumps(value)


def intent_hash(*, tool: str, arguments: Any, principal: str) -> str:
    document = {"tool": tool, "arguments": arguments, "principal": principal}
    return hashlib.sha256(canonical_json(document)).hexdigest()


def sha256_hex(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()
