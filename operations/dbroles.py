"""Two database roles: the owner, which changes the schema and history, and the runtime
role, which runs the application and cannot rewrite what happened.

- The **owner** (``DATABASE_OWNER_URL``) owns every table, sequence and trigger
  function. Migrations, ``archive``, ``audit mac --backfill`` and ``db roles --apply``
  run as it, through ``as_owner``.
- The **runtime** role (``DATABASE_URL``'s user) owns nothing. It may read, insert,
  update and delete the ordinary tables, but only read and insert the audit tables
  (the events, the append-only records of ``triggers.APPEND_ONLY_MODELS`` and the
  transparency log's tables), and only read ``django_migrations``. Without UPDATE,
  DELETE or TRUNCATE on a table, PostgreSQL refuses those statements at the permission
  check, before any trigger runs: ``pgtrigger.ignore``, which any role may set, then
  changes nothing. Not owning the tables, it cannot alter, disable or drop their
  triggers, nor replace the trigger functions; not a superuser, it cannot set
  ``session_replication_role``, which turns triggers off.

``roles_sql`` is what ``effectgate db roles`` prints (and ``--apply`` runs as the
owner); ``roles_check`` reads back what the runtime role may do. PostgreSQL only:
SQLite has neither roles nor triggers.
"""

import contextlib
import re
from collections.abc import Iterator
from typing import Any

from django.apps import apps
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from .triggers import APPEND_ONLY_MODELS

# The transparency log's tables (checkpoints, leaves and tree nodes): insert-only too.
# Named, not imported: the ones that exist in the database are granted.
LOG_TABLES = ("operations_logleaf", "operations_lognode", "operations_checkpoint")
READ_ONLY_TABLES = ("django_migrations",)
ORDINARY = "SELECT, INSERT, UPDATE, DELETE"
INSERT_ONLY = "SELECT, INSERT"
# What the runtime role must not hold on an insert-only table, however it got it (a
# grant to PUBLIC, or to a role it is a member of).
REFUSED_ON_INSERT_ONLY = ("UPDATE", "DELETE", "TRUNCATE", "TRIGGER", "REFERENCES")
REFUSED_ANYWHERE = ("TRUNCATE", "TRIGGER")
# What identifies a login: the same user on the same server is the same login.
_LOGIN = ("USER", "HOST", "PORT")


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def insert_only_tables() -> list[str]:
    """The audit tables, by name: the runtime role reads and inserts them only."""
    tables = [apps.get_model(label)._meta.db_table for label in APPEND_ONLY_MODELS]
    return [*tables, *LOG_TABLES]


_STARTUP_ROLE = re.compile(r"(?:^|\s)-c\s*role=(\S+)")


def assumed_role(options: dict[str, Any]) -> str | None:
    """The role a connection takes after logging in: Django's ``assume_role`` (a ``SET
    ROLE`` once connected) or libpq's startup parameter (``options="-c role=..."``,
    which a connection pool's connections get too)."""
    if options.get("assume_role"):
        return str(options["assume_role"])
    found = _STARTUP_ROLE.search(str(options.get("options") or ""))
    return found.group(1) if found else None


def _same_login(one: dict[str, Any], other: dict[str, Any]) -> bool:
    return all(str(one.get(key) or "") == str(other.get(key) or "") for key in _LOGIN)


def runtime_role(using: str = DEFAULT_DB_ALIAS) -> str | None:
    """The role the application's statements run as, when it is not the owner:
    ``DATABASE_URL``'s user (or the role its connection assumes); None when no owner
    is configured or both are one."""
    owner = settings.DATABASE_OWNER
    if not owner:
        return None
    current = connections[using].settings_dict
    role = assumed_role(current["OPTIONS"]) or current["USER"]
    return role if role and role != owner["USER"] else None


@contextlib.contextmanager
def as_owner(using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """Run the block's statements on ``using`` as the owner (``DATABASE_OWNER_URL``).

    1. No owner configured: nothing changes (one login does everything, the local mode).
    2. The connection logs in as the owner and only assumes the runtime role
       (``assumed_role``; the suite's runtime-role mode, tests/support/runtime_role.py):
       the assumed role is dropped for the block and taken again after it, in the same
       session, so this works inside a transaction too. A deployment never runs this
       way: whoever holds such a login can drop the role as well.
    3. Otherwise the connection is closed and opened again with the owner's login for
       the block (the database stays the one ``using`` names), then closed; the next
       statement reconnects with the runtime role's. Not inside a transaction: its
       work would be on another connection than the transaction's.
    """
    owner = settings.DATABASE_OWNER
    if not owner:
        yield
        return
    connection = connections[using]
    current = connection.settings_dict
    assumed = assumed_role(current["OPTIONS"])
    if assumed and _same_login(current, owner):
        with connection.cursor() as cursor:
            cursor.execute("SET ROLE NONE")
        try:
            yield
        finally:
            try:
                with connection.cursor() as cursor:
                    cursor.execute(f"SET ROLE {_ident(assumed)}")
            except DatabaseError:
                # The block's transaction failed: its rollback takes the SET ROLE NONE
                # back with it. Outside one, this can only be a lost connection.
                if not connection.in_atomic_block:
                    connection.close()
                    raise
        return
    if connection.in_atomic_block:
        raise RuntimeError("as_owner() reconnects: it cannot run inside a transaction")
    connection.close()
    connection.settings_dict = {
        **current,
        **{key: owner[key] for key in ("USER", "PASSWORD", "HOST", "PORT")},
        "OPTIONS": owner["OPTIONS"],
        "CONN_MAX_AGE": 0,
    }
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict = current


def _catalog(cursor: Any, runtime: str) -> dict[str, Any]:
    cursor.execute("SELECT current_user, current_database(), current_schema()")
    owner, database, schema = cursor.fetchone()
    # With each relation, the table at the root of its partition tree (itself when it
    # is no partition): a partition of the events is as insert-only as the events, and
    # PostgreSQL checks privileges on a partition named directly by its own grants.
    cursor.execute(
        "SELECT c.relname, c.relkind, pg_get_userbyid(c.relowner), "
        "coalesce((SELECT r.relname FROM pg_class r WHERE r.oid = pg_partition_root(c.oid)), "
        "c.relname) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'S', 'v', 'm', 'f') "
        "ORDER BY c.relname",
        [schema],
    )
    relations = cursor.fetchall()
    cursor.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s AND pg_get_userbyid(p.proowner) = %s ORDER BY 1",
        [schema, runtime],
    )
    functions = [row[0] for row in cursor.fetchall()]
    return {
        "owner": owner,
        "database": database,
        "schema": schema,
        "relations": relations,
        "functions": functions,
    }


_GUARD = """DO $$
DECLARE
    runtime name := {runtime};
    owner name := current_user;
BEGIN
    IF runtime = owner THEN
        RAISE EXCEPTION 'the runtime role % is the role running this: run it as the owner',
            runtime;
    END IF;
    IF (SELECT rolsuper FROM pg_roles WHERE rolname = runtime) THEN
        RAISE EXCEPTION 'the runtime role % is a superuser: it may do anything', runtime;
    END IF;
    IF pg_has_role(runtime, owner, 'MEMBER') THEN
        RAISE EXCEPTION 'the runtime role % is a member of %: it can SET ROLE to the owner',
            runtime, owner;
    END IF;
    IF pg_has_role(runtime, (SELECT datdba FROM pg_database
                             WHERE datname = current_database()), 'MEMBER') THEN
        RAISE EXCEPTION 'the runtime role % owns the database: ALTER DATABASE ... OWNER TO %',
            runtime, owner;
    END IF;
    IF pg_has_role(runtime, (SELECT nspowner FROM pg_namespace
                             WHERE nspname = current_schema()), 'MEMBER') THEN
        RAISE EXCEPTION 'the runtime role % owns the schema % (and so may drop its tables)',
            runtime, current_schema();
    END IF;
END
$$"""

# pg_class.relkind: what ALTER ... OWNER TO calls each; ordinary and partitioned tables.
_KINDS = {"r": "TABLE", "p": "TABLE", "S": "SEQUENCE", "v": "VIEW", "m": "MATERIALIZED VIEW"}
_TABLES = frozenset(relkind for relkind, word in _KINDS.items() if word == "TABLE")


def roles_sql(*, runtime: str, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The statements that give ``runtime`` exactly its privileges on the database
    ``using`` is connected to, to run as the tables' owner (idempotent).

    1. Refuse (in the SQL itself) a runtime role that is a superuser, the owner, a
       member of the owner, or owns the database or the schema: none of these can be
       taken back by a grant, and each can rewrite history (the owner of a schema may
       drop its tables).
    2. Hand every table, sequence and function the runtime role owns to the owner.
    3. Revoke everything it holds on the schema's tables and sequences, and CREATE.
    4. Grant: USAGE on the schema, CONNECT on the database; SELECT, INSERT, UPDATE,
       DELETE on the ordinary tables; SELECT, INSERT on the audit tables; SELECT on
       django_migrations; USAGE on the sequences (nextval for inserts).
    """
    with connections[using].cursor() as cursor:
        found = _catalog(cursor, runtime)
    owner, database, schema = found["owner"], found["database"], found["schema"]
    role, qschema = _ident(runtime), _ident(schema)
    roots = {name: root for name, relkind, _, root in found["relations"] if relkind in _TABLES}
    insert_only = {name for name, root in roots.items() if root in insert_only_tables()}
    read_only = set(READ_ONLY_TABLES)
    tables = list(roots)
    statements = [
        f"-- Effectgate: privileges of the runtime role {runtime} on database {database}, "
        f"schema {schema}; run as the owner {owner}.",
        # The name as a literal; the checks ask PostgreSQL, which knows every way of
        # holding a role (membership through other roles included).
        _GUARD.replace("{runtime}", _literal(runtime)),
    ]
    for name, relkind, relation_owner, _ in found["relations"]:
        if relation_owner == runtime and relkind in _KINDS:
            statements.append(
                f"ALTER {_KINDS[relkind]} {qschema}.{_ident(name)} OWNER TO {_ident(owner)}"
            )
    statements += [
        f"ALTER FUNCTION {function} OWNER TO {_ident(owner)}" for function in found["functions"]
    ]
    statements += [
        f"REVOKE ALL ON ALL TABLES IN SCHEMA {qschema} FROM {role}",
        f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {qschema} FROM {role}",
        f"REVOKE CREATE ON SCHEMA {qschema} FROM {role}",
        f"GRANT USAGE ON SCHEMA {qschema} TO {role}",
        f"GRANT CONNECT ON DATABASE {_ident(database)} TO {role}",
    ]
    for privileges, names in (
        (ORDINARY, [t for t in tables if t not in insert_only and t not in read_only]),
        (INSERT_ONLY, [t for t in tables if t in insert_only]),
        ("SELECT", [t for t in tables if t in read_only]),
    ):
        if names:
            listed = ",\n    ".join(f"{qschema}.{_ident(name)}" for name in names)
            statements.append(f"GRANT {privileges} ON TABLE\n    {listed}\nTO {role}")
    statements.append(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {qschema} TO {role}")
    return statements


def roles_apply(*, runtime: str, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Run ``roles_sql`` (the caller is the owner), then ``roles_check``; the
    statements run. RuntimeError names what the runtime role may still do."""
    with transaction.atomic(using=using):
        statements = roles_sql(runtime=runtime, using=using)
        with connections[using].cursor() as cursor:
            for statement in statements:
                if not statement.startswith("--"):
                    cursor.execute(statement)
        problems = roles_check(runtime=runtime, using=using)
        if problems:
            raise RuntimeError("; ".join(problems))
    return statements


def roles_check(*, runtime: str, using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """What ``runtime`` may still do that it must not, read from PostgreSQL's own
    answers (``has_table_privilege``: grants to PUBLIC and to roles it is a member of
    count): own a relation or function of the schema, rewrite an audit table, truncate
    any table or create triggers on it, create objects in the schema."""
    audit_tables = set(insert_only_tables())
    with connections[using].cursor() as cursor:
        found = _catalog(cursor, runtime)
        insert_only = {name for name, _, _, root in found["relations"] if root in audit_tables}
        cursor.execute(
            "SELECT c.relname, p.privilege FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "CROSS JOIN unnest(%s::text[]) AS p(privilege) "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') "
            "AND has_table_privilege(%s, c.oid, p.privilege) ORDER BY 1, 2",
            [list(REFUSED_ON_INSERT_ONLY), found["schema"], runtime],
        )
        held = cursor.fetchall()
        cursor.execute("SELECT has_schema_privilege(%s, %s, 'CREATE')", [runtime, found["schema"]])
        may_create = cursor.fetchone()[0]
    owned = [name for name, _, owner, _ in found["relations"] if owner == runtime]
    problems = []
    if owned or found["functions"]:
        problems.append(f"{runtime} owns {', '.join([*owned, *found['functions']])}")
    problems += [
        f"{runtime} may {privilege} {table}"
        for table, privilege in held
        if privilege in (REFUSED_ON_INSERT_ONLY if table in insert_only else REFUSED_ANYWHERE)
    ]
    if may_create:
        problems.append(f"{runtime} may CREATE in the schema {found['schema']}")
    return problems
