"""Pure helpers that shape ledger data for the console's pages (no ORM)."""

import json
from itertools import islice
from typing import Any

from operations.contracts import display


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """JSON as ``{pointer: leaf value}``; empty containers are leaves."""
    if isinstance(value, dict) and value:
        found: dict[str, Any] = {}
        for key, child in value.items():
            found.update(flatten(child, f"{prefix}/{_escape(str(key))}"))
        return found
    if isinstance(value, list) and value:
        found = {}
        for index, child in enumerate(value):
            found.update(flatten(child, f"{prefix}/{index}"))
        return found
    return {prefix or "/": value}


_ABSENT = object()


def changes(old: Any, new: Any) -> list[dict[str, Any]]:
    """What differs between two argument documents, one row per JSON pointer."""
    before, after = flatten(old), flatten(new)
    rows = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path, _ABSENT), after.get(path, _ABSENT)
        if a is _ABSENT or b is _ABSENT or a != b or type(a) is not type(b):
            rows.append(
                {
                    "path": path,
                    "before": None if a is _ABSENT else a,
                    "after": None if b is _ABSENT else b,
                    "added": a is _ABSENT,
                    "removed": b is _ABSENT,
                }
            )
    return rows


def matched_in(op: Any, query: str) -> str:
    """Where ``query`` was found in ``op`` (the search's "Matched" column): the first
    identifier holding it, else the first argument whose value does."""
    needle = query.casefold()
    for label, value in (
        ("id", op.id),
        ("idempotency key", op.idempotency_key),
        ("operation key", op.operation_key),
        ("call id", op.call_id),
        ("downstream reference", op.downstream_id),
        ("principal", op.principal),
    ):
        if value and needle in value.casefold():
            return label
    for path, value in flatten(op.arguments).items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        if needle in text.casefold():
            return f"argument {path}"
    return "arguments"


# A page lists this many argument leaves at most; the canonical JSON holds them all.
MAX_ARGUMENT_ROWS = 500


def argument_rows(contract: dict[str, Any], arguments: Any) -> list[dict[str, Any]]:
    """The frozen arguments as a reviewer reads them: one row per leaf (the first
    ``MAX_ARGUMENT_ROWS``), its label and its value as the contract formats it, beside
    the JSON value exactly as frozen (``same`` when the two read alike, so a page need
    not repeat it)."""
    rows = []
    secrets = display.secret_paths(contract)
    for path, value in islice(flatten(arguments).items(), MAX_ARGUMENT_ROWS):
        shown = display.describe(contract, path, value, secrets=secrets)
        rows.append(
            {
                "path": path,
                "label": display.field_for(contract, path)["label"],
                "shown": shown,
                "raw": value,
                "same": _reads_as_written(shown, value),
            }
        )
    return rows


def changes_described(contract: dict[str, Any], old: Any, new: Any) -> list[dict[str, Any]]:
    """``changes`` with each argument's label and both values as the contract reads them
    (what differs from an earlier operation, on the approval page)."""
    secrets = display.secret_paths(contract)
    rows = changes(old, new)
    for row in rows:
        path = row["path"]
        row["label"] = display.field_for(contract, path)["label"]
        for side in ("before", "after"):
            shown = display.describe(contract, path, row[side], secrets=secrets)
            row[f"{side}_shown"] = shown
            row[f"{side}_same"] = _reads_as_written(shown, row[side])
    return rows


def _reads_as_written(shown: str, value: Any) -> bool:
    """Whether a value reads exactly as its JSON is written (no need to show both)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return shown == text
