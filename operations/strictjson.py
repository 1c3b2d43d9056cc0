"""Strict JSON: one meaning for every document (pure; no HTTP layer).

Runners' bodies become frozen arguments and intent hashes, so every JSON value must
have exactly one meaning: duplicate object keys, NaN and Infinity are refused (400
``malformed_json``), and numbers beyond ±(2^53-1) are refused (422
``number_out_of_range``) because many JSON implementations would silently round them.

That bound holds however a number is written. ``1e300`` is an integer too, and
PostgreSQL's jsonb keeps it as one: it reads back as a 301-digit integer that RFC 8785
refuses to write, so an intent hash or an event hash could no longer be computed from
the stored row. Every double beyond 2^53-1 is such an integer, and every one is
refused. ``-0.0`` is read as ``0.0``: RFC 8785 writes both as ``0``, so the stored value
is the one the hash covers, on every database.
"""

import json
import math
from typing import Any

from .errors import MalformedJSON, NumberOutOfRange

MAX_SAFE_INTEGER = 2**53 - 1
MAX_DEPTH = 64


class _DuplicateKey(ValueError):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


# No integer within ±(2^53-1) has more digits than this; counting them first keeps
# int() from reading thousands of digits (past 4300 it raises).
_MAX_DIGITS = len(str(MAX_SAFE_INTEGER))


def _parse_int(text: str) -> int:
    if len(text.removeprefix("-")) > _MAX_DIGITS or abs(int(text)) > MAX_SAFE_INTEGER:
        raise NumberOutOfRange(f"The integer {text[:40]} is outside ±(2^53-1).")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NumberOutOfRange(f"The number {text[:40]} does not fit in a double.")
    if abs(value) > MAX_SAFE_INTEGER:
        raise NumberOutOfRange(
            f"The number {text[:40]} is an integer outside ±(2^53-1); "
            "send integers within that range."
        )
    return value if value != 0 else 0.0


def _refuse_constant(name: str) -> Any:
    raise MalformedJSON(f"{name} is not JSON.")


def _check_text(text: str) -> None:
    # A lone surrogate cannot be encoded as UTF-8 and PostgreSQL's jsonb cannot hold
    # U+0000, so either would fail (or be altered) after validation; refuse them here.
    if "\x00" in text:
        raise MalformedJSON("Strings containing U+0000 are refused.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MalformedJSON("Strings containing unpaired surrogates are refused.") from exc


def _check_tree(value: Any, limit: int) -> None:
    """Walk the parsed document without recursion: depth limit and string checks."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise MalformedJSON(f"JSON nested deeper than {limit} levels is refused.")
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key)
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


def loads_strict(data: bytes | str) -> Any:
    """Parse one JSON document under the rules above, raising a DomainError."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedJSON("The body is not valid UTF-8.") from exc
    try:
        value = json.loads(
            data,
            object_pairs_hook=_pairs,
            parse_int=_parse_int,
            parse_float=_parse_float,
            parse_constant=_refuse_constant,
        )
    except _DuplicateKey as exc:
        raise MalformedJSON(f"The object key {str(exc)[:60]!r} appears twice.") from exc
    except RecursionError as exc:
        raise MalformedJSON(f"JSON nested deeper than {MAX_DEPTH} levels is refused.") from exc
    except json.JSONDecodeError as exc:
        raise MalformedJSON(
            f"Not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}."
        ) from exc
    _check_tree(value, MAX_DEPTH)
    return value
