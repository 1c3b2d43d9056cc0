"""What the runner sends Effectgate of what happened in this process, made fit to
travel and to be stored: the detail told about a tool's exception (no URL credentials
or query strings), whether a result passes Effectgate's strict JSON, and a person's
edits applied to the runner's own arguments. Pure functions, no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

# How much of a tool's exception is posted (and logged): its class and a message with
# URL credentials and query strings cut out, since an SDK's error may quote a key.
EXCEPTION_DETAIL_CHARS = 200
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@?#]*@")
_URL_QUERY = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s?#]*)[?#][^\s]*")


def exception_detail(exc: BaseException) -> str:
    """What is told about a tool's (or undo's) exception: ``Class: message`` with the
    userinfo and the query string of every URL in it removed, capped at 200 chars."""
    message = _URL_QUERY.sub(r"\1", _URL_USERINFO.sub(r"\1", str(exc)))
    return f"{type(exc).__name__}: {message}"[:EXCEPTION_DETAIL_CHARS]


SAFE_INTEGER = 2**53 - 1
MAX_DEPTH = 64


def _travels(value: Any, depth: int = 0) -> bool:
    """Whether Effectgate's strict JSON accepts ``value``: no NaN or infinity, numbers
    within 2**53 (a float beyond is an integer beyond, 1e300 included), no U+0000 or
    lone surrogate, nesting under 64 levels."""
    if depth > MAX_DEPTH:
        return False
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -SAFE_INTEGER <= value <= SAFE_INTEGER
    if isinstance(value, float):
        return math.isfinite(value) and abs(value) <= SAFE_INTEGER
    if isinstance(value, str):
        if "\x00" in value:
            return False
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, list | tuple):
        return all(_travels(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(
            isinstance(key, str) and _travels(key, depth) and _travels(item, depth + 1)
            for key, item in value.items()
        )
    return False


def apply_edits(arguments: dict[str, Any], edits: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The runner's own arguments with an approver's edits applied (each edit's ``path``
    is a JSON pointer, ``to`` the new value). Applied to the runner's copy, not to the
    stored arguments, because sensitive values are stored as digests; an approver
    cannot edit a sensitive field."""
    edited = json.loads(json.dumps(arguments))
    for edit in edits:
        tokens = [
            token.replace("~1", "/").replace("~0", "~") for token in edit["path"].split("/")[1:]
        ]
        parent: Any = edited
        for token in tokens[:-1]:
            parent = (
                parent[int(token)] if isinstance(parent, list) else parent.setdefault(token, {})
            )
        if isinstance(parent, list):
            parent[int(tokens[-1])] = edit["to"]
        else:
            parent[tokens[-1]] = edit["to"]
    return edited
