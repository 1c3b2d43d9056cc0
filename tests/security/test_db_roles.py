"""The runtime role cannot rewrite history (operations/dbroles.py, docs/security.md §4).

A role of the tests' own, given exactly what ``effectgate db roles --apply`` gives the
runtime role, logs in by itself (its own connection, as the application's would) and
tries every way of rewriting history: each is refused by PostgreSQL, and the one write
it keeps, INSERT, is how the application works; a correctly hashed event inserted
without the event key is then named by ``audit verify`` (its MAC). The forger's tests
say which defence catches what.
"""

import contextlib
import secrets
from collections.abc import Iterator
from io import StringIO

import psycopg
import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from approvals.models import Decision
from operations import dbroles, services
from operations.dbroles import (
    as_owner,
    insert_only_tables,
    roles_apply,
    roles_check,
    roles_sql,
    runtime_role,
)
from operations.models import Event
from operations.triggers import TRIGGER_NAME
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner
from tests.support import runtime_role as suite_mode

from .conftest import audit_verify, postgresql_only
from .test_audit_integrity import _decision_and_resolutions, _history

KEY = "c3" * 32

pytestmark = [postgresql_only, pytest.mark.django_db(transaction=True)]


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _as_superuser(statement: str) -> None:
    with as_owner(), connection.cursor() as cursor:
        cursor.execute(statement)


@contextlib.contextmanager
def runtime_login() -> Iterator[str]:
    """A login role of this test with the runtime role's privileges on the test database
    (``roles_apply``, as ``db roles --apply``); dropped afterwards."""
    name = f"eg_roles_rt_{secrets.token_hex(4)}"
    _as_superuser(f"CREATE ROLE {_ident(name)} LOGIN")
    try:
        with as_owner():
            roles_apply(runtime=name)
        yield name
    finally:
        _as_superuser(f"DROP OWNED BY {_ident(name)}")
        _as_superuser(f"DROP ROLE {_ident(name)}")


def _connect(role: str) -> psycopg.Connection:
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"] or "127.0.0.1",
        port=db["PORT"] or 5432,
        dbname=db["NAME"],
        user=role,
        password=db["PASSWORD"] or None,
        autocommit=True,
    )


def _trigger_name(table: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND tgname LIKE %s",
            [table, f"pgtrigger_{TRIGGER_NAME}_%"],
        )
        return cursor.fetchone()[0]


def _trigger_function(table: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.oid::regprocedure::text FROM pg_trigger t JOIN pg_proc p "
            "ON p.oid = t.tgfoid WHERE t.tgrelid = %s::regclass AND t.tgname LIKE %s",
            [table, f"pgtrigger_{TRIGGER_NAME}_%"],
        )
        return cursor.fetchone()[0]


def _refused(conn: psycopg.Connection, statement: str, message: str, *params) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=message):
        conn.execute(statement, params or None)


def test_the_runtime_role_is_refused_every_way_of_rewriting_history():
    api = make_runner()
    op = _history(api)
    decision, resolution, _review = _decision_and_resolutions(api)
    event = Event.objects.filter(stream=op.id).order_by("seq")[1]
    events_before = list(Event.objects.order_by("id").values_list("id", "hash"))
    trigger, function = _trigger_name("operations_event"), _trigger_function("operations_event")
    with as_owner(), connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        owner_name = cursor.fetchone()[0]
    with runtime_login() as role, _connect(role) as conn:
        assert conn.execute("SELECT current_user, session_user").fetchone() == (role, role)
        denied = "permission denied for table"
        _refused(conn, "UPDATE operations_event SET actor = 'x' WHERE id = %s", denied, event.pk)
        _refused(conn, "DELETE FROM operations_event WHERE id = %s", denied, event.pk)
        _refused(conn, "TRUNCATE operations_event", denied)
        _refused(conn, "TRUNCATE operations_operation CASCADE", denied)
        _refused(conn, "TRUNCATE auth_user CASCADE", denied)
        owner = "must be owner of (table|relation) operations_event"
        _refused(conn, "ALTER TABLE operations_event DISABLE TRIGGER ALL", owner)
        _refused(conn, f"ALTER TABLE operations_event DISABLE TRIGGER {trigger}", owner)
        _refused(conn, f"DROP TRIGGER {trigger} ON operations_event", owner)
        _refused(conn, "DROP TABLE operations_event CASCADE", owner)
        _refused(
            conn,
            f"CREATE OR REPLACE FUNCTION {function.removesuffix('()')}() RETURNS trigger "
            "LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$",
            # Refused before the function's owner is even asked.
            "permission denied for schema public|must be owner of function",
        )
        _refused(
            conn,
            "CREATE TRIGGER forged BEFORE UPDATE ON operations_event FOR EACH ROW "
            "EXECUTE FUNCTION suppress_redundant_updates_trigger()",
            denied,
        )
        # pgtrigger.ignore is a setting any role may set; it changes nothing here, since
        # PostgreSQL refuses the UPDATE at the permission check, before any trigger runs.
        conn.execute(
            "SELECT set_config('pgtrigger.ignore', %s, false)",
            [f"{{{trigger},operations_event:{trigger}}}"],
        )
        _refused(conn, "UPDATE operations_event SET actor = 'x' WHERE id = %s", denied, event.pk)
        _refused(conn, "SET session_replication_role = replica", "permission denied to set")
        _refused(conn, f"SET ROLE {_ident(owner_name)}", "permission denied to set role")
        _refused(conn, "CREATE TABLE operations_shadow (id int)", "permission denied for schema")
        # A decision and a resolution: the record of who decided, insert-only too.
        _refused(
            conn,
            "UPDATE approvals_decision SET decision = 'reject' WHERE id = %s",
            denied,
            decision.pk,
        )
        _refused(conn, "DELETE FROM approvals_decision WHERE id = %s", denied, decision.pk)
        _refused(
            conn, "UPDATE operations_resolution SET note = 'x' WHERE id = %s", denied, resolution.pk
        )
        # It reads and appends (the application works): an event of a new stream.
        assert conn.execute("SELECT count(*) FROM operations_event").fetchone()[0] == len(
            events_before
        )
        new = conn.execute(
            "INSERT INTO operations_event (stream, seq, kind, tool_name, from_status, to_status, "
            "actor, at, data, prev_hash, hash, mac) VALUES ('run:probe', 1, 'probe', '', '', '', "
            "'system:test', now(), '{}', %s, %s, '') RETURNING id",
            [services.GENESIS_HASH, "0" * 64],
        ).fetchone()[0]
    assert list(Event.objects.exclude(pk=new).order_by("id").values_list("id", "hash")) == (
        events_before
    )
    assert Decision.objects.get(pk=decision.pk).decision == "approve"


def _privileges(role: str, table: str) -> set[str]:
    """What ``role`` may do to ``table``, as PostgreSQL answers it."""
    every = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p FROM unnest(%s::text[]) p WHERE has_table_privilege(%s, %s, p)",
            [list(every), role, table],
        )
        return {row[0] for row in cursor.fetchall()}


def test_db_roles_grants_exactly_the_runtime_roles_privileges():
    with runtime_login() as role:
        assert roles_check(runtime=role) == []
        for table in ("operations_event", "approvals_decision", "operations_resolution"):
            assert _privileges(role, table) == {"SELECT", "INSERT"}, table
        assert _privileges(role, "operations_operation") == {"SELECT", "INSERT", "UPDATE", "DELETE"}
        assert _privileges(role, "django_migrations") == {"SELECT"}
        # A grant made around it (here: UPDATE on the events, to everyone) is found.
        _as_superuser("GRANT UPDATE ON operations_event TO PUBLIC")
        try:
            assert roles_check(runtime=role) == [f"{role} may UPDATE operations_event"]
            with as_owner(), pytest.raises(RuntimeError, match="may UPDATE operations_event"):
                roles_apply(runtime=role)
        finally:
            _as_superuser("REVOKE UPDATE ON operations_event FROM PUBLIC")


def test_the_transparency_logs_tables_are_insert_only_by_name():
    assert {"operations_logleaf", "operations_lognode", "operations_checkpoint"} <= set(
        insert_only_tables()
    )
    with runtime_login() as role, as_owner():
        # Only the tables that exist are granted (the log may not be migrated yet).
        statements = "\n".join(roles_sql(runtime=role))
    assert '"public"."operations_event"' in statements
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass('operations_checkpoint') IS NOT NULL")
        if not cursor.fetchone()[0]:
            assert "operations_checkpoint" not in statements


def test_a_partition_of_an_insert_only_table_is_insert_only_too(monkeypatch):
    """PostgreSQL checks a partition named directly against its own grants."""
    monkeypatch.setattr(dbroles, "LOG_TABLES", (*dbroles.LOG_TABLES, "eg_roles_ledger"))
    _as_superuser("CREATE TABLE eg_roles_ledger (id int, at date) PARTITION BY RANGE (at)")
    try:
        _as_superuser(
            "CREATE TABLE eg_roles_ledger_2026 PARTITION OF eg_roles_ledger "
            "FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')"
        )
        with runtime_login() as role:
            assert _privileges(role, "eg_roles_ledger") == {"SELECT", "INSERT"}
            assert _privileges(role, "eg_roles_ledger_2026") == {"SELECT", "INSERT"}
    finally:
        _as_superuser("DROP TABLE eg_roles_ledger")


def test_a_runtime_role_that_could_become_the_owner_is_refused():
    with runtime_login() as role:
        with as_owner(), connection.cursor() as cursor:
            cursor.execute("SELECT current_user")
            owner = cursor.fetchone()[0]
        _as_superuser(f"CREATE ROLE {_ident(role + '_su')} SUPERUSER")
        try:
            with as_owner(), pytest.raises(DatabaseError, match="is a superuser"):
                roles_apply(runtime=role + "_su")
        finally:
            _as_superuser(f"DROP ROLE {_ident(role + '_su')}")
        _as_superuser(f"GRANT {_ident(owner)} TO {_ident(role)}")
        try:
            with as_owner(), pytest.raises(DatabaseError, match="can SET ROLE to the owner"):
                roles_apply(runtime=role)
        finally:
            _as_superuser(f"REVOKE {_ident(owner)} FROM {_ident(role)}")


# --- the forger's tests: the runtime role's credentials, without the keys ---------------


def _forged_event(conn: psycopg.Connection, op_id: str, *, kind: str, data: dict) -> int:
    """What the forger writes: the stream's next event, correctly hashed, with no MAC
    (the key is the application's)."""
    last = Event.objects.filter(stream=op_id).order_by("-seq").first()
    forged = Event(
        stream=op_id,
        seq=last.seq + 1,
        kind=kind,
        from_status=last.to_status,
        to_status=last.to_status,
        actor="user:mallory",
        at=timezone.now(),
        data=data,
        prev_hash=last.hash,
    )
    forged.hash = services.event_hash(forged)
    return conn.execute(
        "INSERT INTO operations_event (stream, seq, kind, operation_id, run_id, tool_name, "
        "from_status, to_status, actor, at, data, prev_hash, hash, mac) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, '') RETURNING id",
        [
            forged.stream,
            forged.seq,
            forged.kind,
            op_id,
            last.run_id,
            last.tool_name,
            forged.from_status,
            forged.to_status,
            forged.actor,
            forged.at,
            psycopg.types.json.Jsonb(forged.data),
            forged.prev_hash,
            forged.hash,
        ],
    ).fetchone()[0]


def test_the_forger_with_the_runtime_roles_credentials_is_caught_each_way(settings):
    """Rewriting, deleting and truncating: refused by PostgreSQL (nothing changes, so
    ``audit verify`` still passes). Inserting a correctly hashed event, and replacing
    a decision by another with its event: written, and named by ``audit verify``'s MAC
    check; the chains alone accept them."""
    settings.AUDIT_EVENT_KEY, settings.AUDIT_EVENT_KEY_ID = KEY, "k1"
    settings.AUDIT_EVENT_OLD_KEYS = {}
    api = make_runner()
    op = _history(api)
    api.tool("pay", contract("irreversible", approval={"mode": "always"}))
    pending = api.register(api.run(principal="user:nobody"), "pay")
    rejecter = person(decide_on="pay")
    services.approval_decide(
        request_id=pending["approval"]["id"], user=rejecter, approve=False, comment="no"
    )
    assert audit_verify()[0] == 0
    with runtime_login() as role, _connect(role) as conn:
        # 1-3. Rewrite an old event, delete one, truncate: refused, by PostgreSQL.
        first = Event.objects.get(stream=op.id, seq=1)
        for statement, params in (
            ("UPDATE operations_event SET actor = 'user:mallory' WHERE id = %s", [first.pk]),
            ("DELETE FROM operations_event WHERE id = %s", [first.pk]),
            ("TRUNCATE operations_event", []),
        ):
            _refused(conn, statement, "permission denied for table operations_event", *params)
        assert audit_verify()[0] == 0
        # 4. A correctly hashed event: accepted by the chains, named by its MAC.
        forged = _forged_event(
            conn, op.id, kind="outcome", data={"kind": "succeeded", "note": "paid twice"}
        )
        seq = Event.objects.get(pk=forged).seq
        code, out = audit_verify()
        assert code == 1
        assert "Every chain verifies." in out
        assert f"NO VALID MAC stream {op.id} seq {seq} (event id {forged})" in out
        # 5. Replace the rejection by an approval: the decision is refused; another
        #    decision beside it, with its event, is written and the event is named.
        rejection = Decision.objects.get(request_id=pending["approval"]["id"])
        _refused(
            conn,
            "UPDATE approvals_decision SET decision = 'approve' WHERE id = %s",
            "permission denied for table approvals_decision",
            rejection.pk,
        )
        mallory = person(decide_on="pay")
        conn.execute(
            "INSERT INTO approvals_decision (request_id, user_id, decision, comment, at) "
            "VALUES (%s, %s, 'approve', 'ok', now())",
            [pending["approval"]["id"], mallory.pk],
        )
        decided = _forged_event(
            conn,
            pending["id"],
            kind="decision",
            data={"approval": pending["approval"]["id"], "decision": "approve", "comment": "ok"},
        )
        code, out = audit_verify("--all")
        assert code == 1
        seq = Event.objects.get(pk=decided).seq
        assert f"NO VALID MAC stream {pending['id']} seq {seq} (event id {decided})" in out
        assert "(2 events in all)" in out
        # Without the key, verify says what it could not check: the forgeries pass.
        settings.AUDIT_EVENT_KEY = ""
        code, out = audit_verify()
        assert "MACs not checked" in out


# --- the owner's login, swapped in for the owner's commands ----------------------------


def test_the_owners_commands_swap_to_the_owners_login_and_back(settings):
    """Production's shape: the application logs in as the runtime role itself; migrate,
    flush, archive and audit mac --backfill reconnect with DATABASE_OWNER_URL's login
    for their work (as_owner), then the runtime login again."""
    api = make_runner()
    _history(api)
    suite = connection.settings_dict
    # The owner's login, without the role the suite's runtime-role mode assumes.
    options = {k: v for k, v in suite["OPTIONS"].items() if k not in ("pool", "options")}
    owner = {**suite, "OPTIONS": options, "CONN_MAX_AGE": 0}
    with as_owner(), connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        owner_name = cursor.fetchone()[0]
    with runtime_login() as role:
        settings.DATABASE_OWNER = owner
        settings.AUDIT_EVENT_KEY = KEY
        connection.close()
        connection.settings_dict = {**owner, "USER": role}
        try:
            assert runtime_role() == role
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_user, session_user")
                assert cursor.fetchone() == (role, role)
            with as_owner(), connection.cursor() as cursor:
                cursor.execute("SELECT current_user")
                assert cursor.fetchone()[0] == owner_name
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_user")
                assert cursor.fetchone()[0] == role
            with (
                pytest.raises(RuntimeError, match="cannot run inside a transaction"),
                transaction.atomic(),
                as_owner(),
            ):
                pass
            # The application works on the runtime login; the backfill runs as the owner.
            make_runner()
            assert Event.objects.filter(mac="").exists()
            out = StringIO()
            call_command("audit", "mac", "--backfill", stdout=out)
            assert "Every chain verifies; wrote the MAC of" in out.getvalue()
            assert not Event.objects.filter(mac="").exists()
            out = StringIO()
            call_command("db", "roles", "--apply", stdout=out)
            assert f"{role} owns nothing" in out.getvalue()
            # TRUNCATE, which the runtime login may not send, as the owner's.
            call_command("flush", interactive=False, verbosity=0)
            assert not Event.objects.exists()
        finally:
            connection.close()
            connection.settings_dict = suite


@pytest.mark.skipif(not suite_mode.ENABLED, reason="EFFECTGATE_TEST_RUNTIME_ROLE is not set")
def test_the_suite_runs_as_the_runtime_role():
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        assert cursor.fetchone()[0] == suite_mode.ROLE
        assert runtime_role() == suite_mode.ROLE
        with pytest.raises(DatabaseError, match="permission denied for table operations_event"):
            cursor.execute("TRUNCATE operations_event")
    with as_owner(), connection.cursor() as cursor:
        cursor.execute("SELECT current_user <> %s", [suite_mode.ROLE])
        assert cursor.fetchone()[0]
