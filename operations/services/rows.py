"""Rows written and read without the ORM's query building: the hot path's primitives.

The ORM compiles every query it sends, which was most of a lifecycle's CPU
(docs/benchmarks.md §3). These build each statement's text once per model (and column
set, and row count) and send only parameters after that, so PostgreSQL can prepare it:

- ``insert_unless_conflict``: one row, ``ON CONFLICT DO NOTHING``, says whether it was
  written (what a savepoint around a failing ``save`` said);
- ``insert_each_unless_conflict``: several rows of one model, each unless it conflicts;
- ``insert_all``: rows of one or more tables in one statement on PostgreSQL;
- ``save_fields``: ``save(update_fields=...)`` without building the query;
- ``deferred``: within it, ``insert_unless_conflict``, ``insert_all`` and
  ``save_fields`` gather their rows and write them at ``Deferred.flush``, each table's
  inserts in one statement and each set of updated columns in one ``UPDATE ... FROM
  (VALUES ...)`` (a batch of outcomes: three statements for all its items);
- ``Columns``: a hand-written SELECT's columns and the instances built from them as
  the ORM builds them.

Nothing here opens a transaction: callers (the services) own theirs.
"""

import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, cast

from django.db import connection
from django.db.models import Field, Model

from ..models import Operation

_INSERT_ROWS: dict[tuple[str, type[Model], bool, int], tuple[str, list[Any]]] = {}


def _insert_parts(instances: list[Model]) -> tuple[str, list[Any]]:
    """``INSERT INTO t (...) VALUES (...), (...)`` for rows of one model (the text built
    once per model and row count); an automatic primary key is left to the database."""
    model = type(instances[0])
    auto_key = getattr(instances[0], model._meta.pk.attname) is None
    key = (connection.vendor, model, auto_key, len(instances))
    built = _INSERT_ROWS.get(key)
    if built is None:
        fields = [
            field for field in model._meta.concrete_fields if not (field.primary_key and auto_key)
        ]
        quote = connection.ops.quote_name
        columns = ", ".join(quote(field.column) for field in fields)
        row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        table = quote(model._meta.db_table)
        values = ", ".join([row] * len(instances))
        # Names from the models' own metadata, values as parameters.
        sql = f"INSERT INTO {table} ({columns}) VALUES {values}"  # noqa: S608
        built = _INSERT_ROWS[key] = (sql, fields)
    sql, fields = built
    params = [
        field.get_db_prep_save(field.pre_save(instance, True), connection)
        for instance in instances
        for field in fields
    ]
    return sql, params


def _written(instances: Iterable[Model]) -> None:
    for instance in instances:
        instance._state.adding = False
        instance._state.db = connection.alias


def insert_unless_conflict(instance: Model) -> bool:
    """INSERT one row, or nothing when a unique constraint already holds its values.

    ``ON CONFLICT DO NOTHING`` says what a savepoint around a failing ``save`` said,
    in one statement and without aborting the transaction; the caller reads what the
    conflict was only when there was one.
    """
    pending = _pending()
    if pending is not None:
        # Assumed written; a conflict at the flush raises ``DeferredConflict``.
        pending.insert(instance, unless_conflict=True)
        return True
    sql, params = _insert_parts([instance])
    with connection.cursor() as cursor:
        cursor.execute(sql + " ON CONFLICT DO NOTHING", params)
        inserted = cursor.rowcount == 1
    if inserted:
        _written([instance])
    return inserted


def insert_each_unless_conflict(instances: Sequence[Model]) -> set[Any]:
    """INSERT rows of one model in one statement, each unless a unique constraint
    already holds its values (``ON CONFLICT DO NOTHING``); the primary keys of those
    written (the caller made them). PostgreSQL only (``RETURNING``)."""
    model = type(instances[0])
    pk = cast(Field, model._meta.pk)
    sql, params = _insert_parts(list(instances))
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} ON CONFLICT DO NOTHING RETURNING {quote(pk.column)}", params)
        written = {row[0] for row in cursor.fetchall()}
    _written(instance for instance in instances if instance.pk in written)
    return written


def insert_all(*instances: Model) -> None:
    """INSERT new rows of one or more tables, in the order given by table.

    One statement on PostgreSQL (each table's rows a data-modifying CTE of the last
    table's INSERT), one per table elsewhere. No row is read back: the caller made the
    rows, keys included (an automatic key stays unset on the instance).
    """
    pending = _pending()
    if pending is not None:
        for instance in instances:
            pending.insert(instance, unless_conflict=False)
        return
    groups: dict[type[Model], list[Model]] = {}
    for instance in instances:
        groups.setdefault(type(instance), []).append(instance)
    parts = [_insert_parts(rows) for rows in groups.values()]
    statements = (
        [
            (
                "WITH "
                + ", ".join(f"w{n} AS ({sql})" for n, (sql, _) in enumerate(parts[:-1]))
                + " "
                + parts[-1][0],
                [param for _, params in parts for param in params],
            )
        ]
        if connection.vendor == "postgresql" and len(parts) > 1
        else parts
    )
    with connection.cursor() as cursor:
        for sql, params in statements:
            cursor.execute(sql, params)
    _written(instances)


_UPDATES: dict[tuple[str, type[Model], tuple[str, ...]], tuple[str, list[Any]]] = {}


def save_fields(instance: Model, names: Iterable[str]) -> None:
    """UPDATE the columns ``names`` of ``instance``'s row, as ``save(update_fields=...)``
    does (``auto_now`` fields among them stamped now), with the statement built once
    per model and set of columns instead of for every save."""
    model = type(instance)
    key = (connection.vendor, model, tuple(dict.fromkeys(names)))
    built = _UPDATES.get(key)
    if built is None:
        fields = [cast(Field, model._meta.get_field(name)) for name in key[2]]
        quote = connection.ops.quote_name
        assignments = ", ".join(f"{quote(cast(str, field.column))} = %s" for field in fields)
        table = quote(model._meta.db_table)
        pk = quote(cast(Field, model._meta.pk).column)
        sql = f"UPDATE {table} SET {assignments} WHERE {pk} = %s"  # noqa: S608
        built = _UPDATES[key] = (sql, fields)
    sql, fields = built
    params = [
        field.get_db_prep_save(field.pre_save(instance, False), connection) for field in fields
    ]
    pending = _pending()
    if pending is not None:
        pending.update(model, key[2], fields, instance.pk, params)
        return
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, instance.pk])


class DeferredConflict(Exception):
    """A deferred ``insert_unless_conflict`` met its conflict at the flush: the caller's
    transaction must be rolled back (what was assumed written was not)."""


_state = threading.local()


def _pending() -> "Deferred | None":
    return getattr(_state, "deferred", None)


class Deferred:
    """The rows gathered within ``deferred``, written by ``flush``: first each table's
    inserts (one statement per table), then each set of updated columns (one statement
    per model and columns). A row updated twice is written in order: the first update
    flushes what was gathered before the second is gathered."""

    def __init__(self) -> None:
        self._inserts: dict[type[Model], list[Model]] = {}
        self._checked: set[type[Model]] = set()
        self._updates: dict[tuple[type[Model], tuple[str, ...]], list[Any]] = {}
        self._fields: dict[tuple[type[Model], tuple[str, ...]], list[Field]] = {}
        self._updated: set[tuple[type[Model], Any]] = set()

    def insert(self, instance: Model, *, unless_conflict: bool) -> None:
        self._inserts.setdefault(type(instance), []).append(instance)
        if unless_conflict:
            self._checked.add(type(instance))

    def update(
        self,
        model: type[Model],
        names: tuple[str, ...],
        fields: list[Field],
        pk: Any,
        params: list[Any],
    ) -> None:
        if (model, pk) in self._updated:
            self.flush()
        self._updated.add((model, pk))
        self._fields[(model, names)] = fields
        self._updates.setdefault((model, names), []).append((pk, params))

    def flush(self) -> None:
        inserts, checked, updates = self._inserts, self._checked, self._updates
        self._inserts, self._checked, self._updates, self._updated = {}, set(), {}, set()
        quote = connection.ops.quote_name
        with connection.cursor() as cursor:
            for model, instances in inserts.items():
                sql, params = _insert_parts(instances)
                if model in checked:
                    cursor.execute(sql + " ON CONFLICT DO NOTHING", params)
                    if cursor.rowcount != len(instances):
                        raise DeferredConflict(model._meta.db_table)
                else:
                    cursor.execute(sql, params)
                _written(instances)
            for (model, names), rows in updates.items():
                fields = self._fields[(model, names)]
                pk = cast(Field, model._meta.pk)
                columns = [cast(str, field.column) for field in fields]
                types = [pk.db_type(connection), *(field.db_type(connection) for field in fields)]
                row = "(" + ", ".join(f"CAST(%s AS {kind})" for kind in types) + ")"
                names_sql = ", ".join(quote(name) for name in ["_pk", *columns])
                assignments = ", ".join(f"{quote(c)} = v.{quote(c)}" for c in columns)
                table = quote(model._meta.db_table)
                # Names and types from the models' own metadata, values as parameters.
                sql = (
                    f"UPDATE {table} SET {assignments} FROM (VALUES "  # noqa: S608
                    + ", ".join([row] * len(rows))
                    + f") AS v ({names_sql}) WHERE {table}.{quote(cast(str, pk.column))} = v._pk"
                )
                cursor.execute(sql, [value for key, params in rows for value in (key, *params)])


@contextmanager
def deferred() -> Iterator[Deferred]:
    """Gather this thread's row writes until ``Deferred.flush`` (PostgreSQL: the
    statements use ``RETURNING`` and ``UPDATE ... FROM``). The caller flushes before its
    transaction ends; what is not flushed is not written."""
    if _pending() is not None:
        raise RuntimeError("Writes are already deferred.")
    pending = _state.deferred = Deferred()
    try:
        yield pending
    finally:
        _state.deferred = None


class Columns:
    """Every column of ``model`` under a table alias, for a hand-written SELECT, and the
    instance built from them as the ORM builds it (the database's and the fields'
    converters applied: timestamps, JSON, booleans)."""

    def __init__(self, model: type[Model], alias: str) -> None:
        self.model = model
        self.alias = alias
        self.fields = list(model._meta.concrete_fields)
        self._names = [field.attname for field in self.fields]
        self._sql: dict[str, str] = {}
        self._converters: dict[str, list[tuple[Any, list[Any]]]] = {}

    def sql(self) -> str:
        text = self._sql.get(connection.vendor)
        if text is None:
            quote = connection.ops.quote_name
            text = self._sql[connection.vendor] = ", ".join(
                f"{self.alias}.{quote(field.column)}" for field in self.fields
            )
        return text

    def __len__(self) -> int:
        return len(self.fields)

    def _converters_here(self) -> list[tuple[Any, list[Any]]]:
        converters = self._converters.get(connection.vendor)
        if converters is None:
            converters = []
            for field in self.fields:
                expression = field.get_col(self.alias)
                functions = [
                    *connection.ops.get_db_converters(expression),
                    # Field.get_db_converters exists (Django's compiler calls it); the
                    # stubs do not declare it.
                    *field.get_db_converters(connection),  # type: ignore[attr-defined]
                ]
                converters.append((expression, functions))
            self._converters[connection.vendor] = converters
        return converters

    def build(self, values: Sequence[Any]) -> Any:
        converted = list(values)
        for index, (expression, functions) in enumerate(self._converters_here()):
            for function in functions:
                converted[index] = function(converted[index], expression, connection)
        return self.model.from_db(connection.alias, self._names, converted)


def approvals_known_none(op: Operation) -> None:
    """``op`` is known to have no approval request (the hot path wrote or read as much):
    its representation needs no read of them (``approvals.selectors.request_latest``)."""
    op._prefetched_objects_cache = {"approval_requests": []}  # type: ignore[attr-defined]


def db_datetime(value: datetime | None) -> Any:
    """A timestamp as a raw statement's parameter on this database."""
    return connection.ops.adapt_datetimefield_value(value)
