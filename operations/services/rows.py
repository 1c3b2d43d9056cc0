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

import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, cast

from django.db import connection, models
from django.db.models import F, Field, Model

from ..models import Operation

# Rows from which an INSERT sends one array per column: below, a VALUES list costs
# psycopg less (measured: 26 against 80 us of CPU for 2 rows of an event, 107 against
# 87 for 4, 530 against 217 for 20).
COLUMNAR_FROM = 4
_INSERT_ROWS: dict[tuple[str, type[Model], bool, int], tuple[str, list[Any]]] = {}
# (Each statement's text with the preparers of its columns, ``_values``.)


# Values a field of these classes sends as they are: ``get_db_prep_save`` returns them
# unchanged (the class's ``to_python`` keeps them; PostgreSQL's and SQLite's adapters
# take them). Anything else (``auto_now``, JSON, decimals, a naive or other value) goes
# through the field.
_AS_IS: dict[type[Field], tuple[type, ...]] = {
    models.CharField: (str, type(None)),
    models.TextField: (str, type(None)),
    models.IntegerField: (int, type(None)),
    models.PositiveIntegerField: (int, type(None)),
    models.PositiveSmallIntegerField: (int, type(None)),
    models.SmallIntegerField: (int, type(None)),
    models.BigIntegerField: (int, type(None)),
    models.BooleanField: (bool, type(None)),
}
_UNSET = object()
_PREPARERS: dict[tuple[str, type[Model], tuple[str, ...], bool], list[Any]] = {}


def _preparer(field: Field, add: bool) -> Any:
    """What sends ``field``'s value of an instance, as ``get_db_prep_save(pre_save())``."""

    def prepared(instance: Model) -> Any:
        return field.get_db_prep_save(field.pre_save(instance, add), connection)

    target = field.target_field if isinstance(field, models.ForeignKey) else field
    kinds = _AS_IS.get(type(target))
    # PostgreSQL takes an aware datetime as it is; SQLite's adapter would write its
    # offset, where Django writes naive UTC.
    aware = (
        connection.vendor == "postgresql"
        and type(field) is models.DateTimeField
        and not (cast(Any, field).auto_now or cast(Any, field).auto_now_add)
    )
    attname = cast(str, field.attname)
    if kinds is not None:

        def as_is(instance: Model) -> Any:
            value = instance.__dict__.get(attname, _UNSET)
            return value if type(value) in kinds else prepared(instance)

        return as_is
    if aware:

        def moment(instance: Model) -> Any:
            value = instance.__dict__.get(attname, _UNSET)
            if value is None or (type(value) is datetime and value.tzinfo is not None):
                return value
            return prepared(instance)

        return moment
    return prepared


def _values(fields: list[Field], add: bool) -> list[Any]:
    """The preparers of ``fields`` (built once per model and columns)."""
    model = cast(type[Model], fields[0].model)
    key = (connection.vendor, model, tuple(cast(str, f.attname) for f in fields), add)
    preparers = _PREPARERS.get(key)
    if preparers is None:
        preparers = _PREPARERS[key] = [_preparer(field, add) for field in fields]
    return preparers


def _base_type(field: Field) -> str:
    """The column's type without its modifier (``varchar``, not ``varchar(64)``): an
    explicit cast to ``varchar(n)`` cuts a longer value without a word, where the
    column's own assignment refuses it, as a single row's INSERT does."""
    return re.sub(r"\(.*\)", "", cast(str, field.db_type(connection))).strip()


def _insert_fields(model: type[Model], auto_key: bool) -> list[Field]:
    return [field for field in model._meta.concrete_fields if not (field.primary_key and auto_key)]


def _insert_parts(instances: list[Model]) -> tuple[str, list[Any]]:
    """``INSERT INTO t (...) VALUES (...)`` for a few rows, or for ``COLUMNAR_FROM`` and
    more on PostgreSQL ``INSERT INTO t (...) SELECT * FROM unnest(%b::type[], ...)``,
    one array parameter per column (the text built once per model, whatever the rows:
    psycopg parses and PostgreSQL prepares it once; a ``VALUES`` list of 20 rows is 700
    placeholders that psycopg would parse on every call). An automatic primary key is left to the
    database."""
    model = type(instances[0])
    auto_key = getattr(instances[0], model._meta.pk.attname) is None
    columnar = len(instances) >= COLUMNAR_FROM and connection.vendor == "postgresql"
    key = (connection.vendor, model, auto_key, 0 if columnar else len(instances))
    built = _INSERT_ROWS.get(key)
    if built is None:
        fields = _insert_fields(model, auto_key)
        quote = connection.ops.quote_name
        columns = ", ".join(quote(field.column) for field in fields)
        table = quote(model._meta.db_table)
        if columnar:
            # Binary arrays (``%b``): psycopg's text format escapes every element.
            arrays = ", ".join(f"%b::{_base_type(field)}[]" for field in fields)
            rows = f"SELECT * FROM unnest({arrays})"  # noqa: S608
        else:
            row = "(" + ", ".join(["%s"] * len(fields)) + ")"
            rows = "VALUES " + ", ".join([row] * len(instances))
        # Names and types from the models' own metadata, values as parameters.
        sql = f"INSERT INTO {table} ({columns}) {rows}"
        built = _INSERT_ROWS[key] = (sql, _values(fields, True))
    sql, preparers = built
    if columnar:
        return sql, [[value(instance) for instance in instances] for value in preparers]
    return sql, [value(instance) for instance in instances for value in preparers]


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
    gathering = pending()
    if gathering is not None:
        # Assumed written; a conflict at the flush raises ``DeferredConflict``.
        gathering.insert(instance, unless_conflict=True)
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
    gathering = pending()
    if gathering is not None:
        for instance in instances:
            gathering.insert(instance, unless_conflict=False)
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


_UPDATES: dict[tuple[str, type[Model], tuple[str, ...]], tuple[str, list[Any], list[Any]]] = {}


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
        built = _UPDATES[key] = (sql, fields, _values(fields, False))
    sql, fields, preparers = built
    params = [value(instance) for value in preparers]
    gathering = pending()
    if gathering is not None:
        gathering.update(model, key[2], fields, instance.pk, params)
        return
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, instance.pk])


class DeferredConflict(Exception):
    """A deferred ``insert_unless_conflict`` met its conflict at the flush: the caller's
    transaction must be rolled back (what was assumed written was not)."""


_state = threading.local()


def pending() -> "Deferred | None":
    """The writes this thread defers now (``deferred``), if it does."""
    return getattr(_state, "deferred", None)


class Deferred:
    """The rows gathered within ``deferred``, written by ``flush``: first each table's
    inserts (one statement per table), then each set of updated columns (one statement
    per model and columns); ``finish`` flushes and adds the increments last. A row
    updated twice is written in order: the first update flushes what was gathered
    before the second is gathered."""

    def __init__(self) -> None:
        self._inserts: dict[type[Model], list[Model]] = {}
        self._checked: set[type[Model]] = set()
        self._updates: dict[tuple[type[Model], tuple[str, ...]], list[Any]] = {}
        self._fields: dict[tuple[type[Model], tuple[str, ...]], list[Field]] = {}
        self._updated: set[tuple[type[Model], Any]] = set()
        self._increments: dict[tuple[str, Any], tuple[type[Model], str, Any]] = {}

    def increment(self, model: type[Model], pk: Any, name: str, amount: Any) -> None:
        """Add ``amount`` to the column ``name`` of a row, at ``finish``: after every
        other write and lock of the transaction, rows in key order."""
        key = (model._meta.db_table, pk)
        _, _, before = self._increments.get(key, (model, name, 0))
        self._increments[key] = (model, name, before + amount)

    def finish(self) -> None:
        """``flush``, then the increments (``increment``)."""
        self.flush()
        increments, self._increments = self._increments, {}
        for (_, pk), (model, name, amount) in sorted(increments.items(), key=lambda i: i[0]):
            model._default_manager.filter(pk=pk).update(**{name: F(name) + amount})

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
                types = [_base_type(pk), *(_base_type(field) for field in fields)]
                arrays = ", ".join(f"%b::{kind}[]" for kind in types)
                names_sql = ", ".join(quote(name) for name in ["_pk", *columns])
                assignments = ", ".join(f"{quote(c)} = v.{quote(c)}" for c in columns)
                table = quote(model._meta.db_table)
                # Names and types from the models' own metadata, values as parameters:
                # one array per column, binary (``%b``), the rows' values in order.
                sql = (
                    f"UPDATE {table} SET {assignments} FROM unnest({arrays}) "  # noqa: S608
                    f"AS v ({names_sql}) WHERE {table}.{quote(cast(str, pk.column))} = v._pk"
                )
                columns_values: list[list[Any]] = [[key for key, _ in rows]]
                columns_values.extend([values[n] for _, values in rows] for n in range(len(fields)))
                cursor.execute(sql, columns_values)


@contextmanager
def deferred() -> Iterator[Deferred]:
    """Gather this thread's row writes until ``Deferred.finish`` (PostgreSQL: the
    statements use ``UPDATE ... FROM unnest``). The caller finishes before its
    transaction ends; what is not written then is not written."""
    if pending() is not None:
        raise RuntimeError("Writes are already deferred.")
    gathering = _state.deferred = Deferred()
    try:
        yield gathering
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
