"""The columns a hand-written INSERT of the benchmarks does not name, from the models.

The benchmarks write rows with raw SQL (bulk seeds, the replica of the API's statements,
the essential anchor). A NOT NULL column added to a model later would make those
inserts fail (``escalate_to`` did, in ``make bench``'s seed of approval requests):
``unnamed_defaults`` gives every such column the value the model itself would write.
Requires ``django.setup()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

AUTO_FIELDS = {"AutoField", "BigAutoField", "SmallAutoField"}


def unnamed_defaults(model: Any, named: Iterable[str]) -> dict[str, Any]:
    """``{column: value}`` for every NOT NULL column of ``model`` that ``named`` leaves
    out and the database does not fill itself, each the model's default prepared for
    the database (a JSON default as psycopg's JSON adapter, ``''``, ``0``, ``false``).

    A column the model gives no default is an error that names it: no guess is better
    than a wrong one, and the seed must say what belongs there.
    """
    from django.db import connection
    from django.db.models import NOT_PROVIDED
    from django.utils import timezone

    named = set(named)
    values: dict[str, Any] = {}
    for field in model._meta.concrete_fields:
        if field.column in named or field.null or field.db_default is not NOT_PROVIDED:
            continue
        if field.primary_key and field.get_internal_type() in AUTO_FIELDS:
            continue
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            default = timezone.now()
        else:
            default = field.get_default()
        if default is None:
            raise LookupError(
                f"{model._meta.db_table}.{field.column} is NOT NULL and has no default: "
                "name it in the benchmark's INSERT"
            )
        values[field.column] = field.get_db_prep_save(default, connection)
    return values


def sql_fill(model: Any, named: Iterable[str], *, key: str) -> tuple[str, str, dict[str, Any]]:
    """The unnamed columns for an ``INSERT ... SELECT`` with named parameters:
    ``(", col, ...", ", %(key_col)s, ...", {"key_col": value, ...})``, to append to its
    column list, its select list and its parameters."""
    values = unnamed_defaults(model, named)
    names = "".join(f", {column}" for column in values)
    marks = "".join(f", %({key}_{column})s" for column in values)
    return names, marks, {f"{key}_{column}": value for column, value in values.items()}
