"""Short names for SQL statements, to compare what two paths send to PostgreSQL.

A statement's name is its verb and tables: ``SELECT operations_run FOR UPDATE``,
``SELECT operations_operation + operations_run, operations_toolversion``, ``UPDATE
operations_operation (32 columns)``. Savepoint names and parameters are dropped, so
that the same statement from two requests has the same name.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

_TABLE = r'"?([A-Za-z_][A-Za-z0-9_]*)"?'
_FROM = re.compile(rf"\bFROM\s+{_TABLE}", re.IGNORECASE)
_JOIN = re.compile(rf"\bJOIN\s+{_TABLE}", re.IGNORECASE)
_INSERT = re.compile(rf"^\s*INSERT\s+INTO\s+{_TABLE}", re.IGNORECASE)
_UPDATE = re.compile(rf"^\s*UPDATE\s+{_TABLE}\s+SET\s+(.*?)\s+WHERE\b", re.IGNORECASE | re.DOTALL)
_DELETE = re.compile(rf"^\s*DELETE\s+FROM\s+{_TABLE}", re.IGNORECASE)
_ASSIGNMENT = re.compile(r'(?:^|,)\s*"?[A-Za-z_][A-Za-z0-9_]*"?\s*=')
_FOR_UPDATE = re.compile(r"\bFOR\s+(?:NO\s+KEY\s+)?UPDATE\b", re.IGNORECASE)


def _assignments(clause: str) -> int:
    """The columns an UPDATE's SET clause assigns (not counting ``=`` inside values)."""
    depth = 0
    top = []
    for char in clause:
        depth += char == "("
        depth -= char == ")"
        top.append(char if depth == 0 else " ")
    return len(_ASSIGNMENT.findall("".join(top)))


def statement_label(sql: str) -> str:
    """The short name of one statement (see the module docstring)."""
    text = sql.strip()
    upper = text.upper()
    for keyword in ("RELEASE SAVEPOINT", "ROLLBACK TO SAVEPOINT", "SAVEPOINT"):
        if upper.startswith(keyword):
            return keyword
    if upper in {"BEGIN", "COMMIT", "ROLLBACK"}:
        return upper
    if upper == "SELECT 1":
        # Sent bare only by Django's connection health check (CONN_HEALTH_CHECKS), and
        # by the replica in its place.
        return "SELECT 1 (connection health check)"
    if match := _INSERT.match(text):
        returning = " RETURNING" if re.search(r"\bRETURNING\b", upper) else ""
        return f"INSERT {match.group(1)}{returning}"
    if match := _UPDATE.match(text):
        returning = " RETURNING" if re.search(r"\bRETURNING\b", upper) else ""
        return f"UPDATE {match.group(1)} ({_assignments(match.group(2))} columns){returning}"
    if match := _DELETE.match(text):
        return f"DELETE {match.group(1)}"
    if upper.startswith("SELECT"):
        main = _FROM.search(text)
        if main is None:
            return text
        joined = _JOIN.findall(text)
        label = f"SELECT {main.group(1)}"
        if joined:
            # A table joined twice (under an alias) is named once, with its count.
            counts = Counter(joined)
            label += " + " + ", ".join(
                name if n == 1 else f"{name} x{n}" for name, n in counts.items()
            )
        if _FOR_UPDATE.search(text):
            label += " FOR UPDATE"
        return label
    return text.split()[0].upper()


def labels(statements: Iterable[str]) -> list[str]:
    return [statement_label(sql) for sql in statements]


def beyond(path: Iterable[str], anchor: Iterable[str]) -> list[str]:
    """The names ``path`` sends that ``anchor`` does not, counting repeats: a path that
    inserts two events where the anchor inserts one has one event insert beyond it.
    UPDATEs are compared by verb and table, whatever columns they set."""

    def key(label: str) -> str:
        return re.sub(r" \(\d+ columns\)", "", label).removesuffix(" RETURNING")

    left = Counter(anchor_key for anchor_key in map(key, anchor))
    extra = []
    for label in path:
        if left[key(label)] > 0:
            left[key(label)] -= 1
        else:
            extra.append(label)
    return extra
