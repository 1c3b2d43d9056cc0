"""The lifecycle bench's instruments: the statement counter gunicorn loads, the names
given to statements, CPU time from /proc, and the table it prints.

If the counter misses a round trip or a CPU reading is off by a process, the
"statements per lifecycle" and "CPU ms per lifecycle" figures lie; these check each
piece without a server or a database.
"""

import json

import pytest

from bench import gunicorn_conf, procstat
from bench.bench import headline, summary
from bench.lifecycle import Phase
from bench.lifecycle_report import per_effect, table
from bench.parallel import table as parallel_table
from bench.statements import beyond, labels, statement_label

# --- the gunicorn counter ---------------------------------------------------------------------


class FakeCursor:
    def __init__(self, sent):
        self.sent = sent

    def execute(self, query, params=None):
        self.sent.append(query)
        return self

    def executemany(self, query, params_seq):
        self.sent.append(f"{query} x{len(params_seq)}")


class FakePsycopg:
    """A psycopg connection as far as the counter goes: a cursor factory."""

    def __init__(self, sent):
        self.sent = sent
        self.cursor_factory = FakeCursor

    def cursor(self):
        return self.cursor_factory(self.sent)


class FakeConnection:
    """The parts of Django's DatabaseWrapper the counter wraps, noting what reaches the
    database."""

    def __init__(self):
        self.sent = []
        self.connection = FakePsycopg(self.sent)

    def _set_autocommit(self, autocommit):
        self.sent.append(f"autocommit={autocommit}")

    def _commit(self):
        self.sent.append("commit")

    def _rollback(self):
        self.sent.append("rollback")

    def is_usable(self):
        # As Django's: a cursor of the psycopg connection, bypassing Django's own.
        self.connection.cursor().execute("SELECT 1")
        return True

    def execute(self, sql):
        return self.connection.cursor().execute(sql)

    def reconnect(self):
        self.connection = FakePsycopg(self.sent)


def request_through(app, connection, work, headers=None):
    """Call the WSGI ``app`` once; ``work`` is what the view does on ``connection``."""
    seen = {}

    def view(environ, start_response):
        work(connection)
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b"{}"]

    def start_response(status, response_headers, exc_info=None):
        seen.update(response_headers)

    app.app = view
    body = app({**(headers or {})}, start_response)
    return seen, body


def test_counter_counts_statements_transactions_and_the_health_check(tmp_path):
    connection = FakeConnection()
    gunicorn_conf.instrument(connection)
    app = gunicorn_conf.CountingApp(None, str(tmp_path))

    def work(conn):
        assert conn.is_usable()
        conn.execute("SELECT 1 FROM t")
        conn._set_autocommit(False)
        conn.execute('INSERT INTO "t" VALUES (%s)')
        conn.connection.cursor().executemany(b"INSERT INTO u VALUES (%s)", [1, 2])
        conn._commit()
        conn._set_autocommit(True)

    headers, body = request_through(app, connection, work, {"HTTP_X_BENCH_TRACE": "step"})

    assert body == [b"{}"]
    assert headers[gunicorn_conf.STATEMENTS_HEADER] == "6"
    assert int(headers[gunicorn_conf.CPU_HEADER]) >= 0
    assert json.loads((tmp_path / "step.json").read_text()) == [
        "SELECT 1",
        "SELECT 1 FROM t",
        "BEGIN",
        'INSERT INTO "t" VALUES (%s)',
        "INSERT INTO u VALUES (%s)",
        "COMMIT",
    ]
    # What the wrapped connection does is unchanged.
    assert connection.sent == [
        "SELECT 1",
        "SELECT 1 FROM t",
        "autocommit=False",
        'INSERT INTO "t" VALUES (%s)',
        "b'INSERT INTO u VALUES (%s)' x2",
        "commit",
        "autocommit=True",
    ]


def test_a_reconnecting_wrapper_is_counted_once_on_its_new_connection():
    connection = FakeConnection()
    gunicorn_conf.instrument(connection)
    gunicorn_conf.instrument(connection)
    connection.reconnect()
    gunicorn_conf.instrument(connection)
    app = gunicorn_conf.CountingApp(None)

    def work(conn):
        conn._set_autocommit(False)
        conn.execute("SELECT 2")
        conn._commit()

    headers, _ = request_through(app, connection, work)

    assert headers[gunicorn_conf.STATEMENTS_HEADER] == "3"


def test_statements_outside_a_request_are_not_counted():
    connection = FakeConnection()
    gunicorn_conf.instrument(connection)
    connection.execute("SELECT 3")  # e.g. at worker start: no request, no log
    app = gunicorn_conf.CountingApp(None)

    headers, _ = request_through(app, connection, lambda conn: None)

    assert headers[gunicorn_conf.STATEMENTS_HEADER] == "0"


@pytest.mark.parametrize("name", ["../escape", "a/b", "", "x" * 81, None])
def test_a_trace_name_cannot_leave_the_trace_folder(tmp_path, name):
    assert gunicorn_conf.trace_path(str(tmp_path), name) is None


def test_no_trace_without_a_trace_folder():
    assert gunicorn_conf.trace_path(None, "step") is None


# --- statement names ---------------------------------------------------------------------------

OPERATION_UPDATE = (
    'UPDATE "operations_operation" SET "status" = %s, "attempts" = %s, "lease_until" = %s '
    'WHERE "operations_operation"."id" = %s'
)


@pytest.mark.parametrize(
    ("sql", "label"),
    [
        ("BEGIN", "BEGIN"),
        ("COMMIT", "COMMIT"),
        ('SAVEPOINT "s1407_x4"', "SAVEPOINT"),
        ('RELEASE SAVEPOINT "s1407_x4"', "RELEASE SAVEPOINT"),
        ('ROLLBACK TO SAVEPOINT "s1407_x4"', "ROLLBACK TO SAVEPOINT"),
        ("SELECT 1", "SELECT 1 (connection health check)"),
        ("SELECT value FROM t WHERE id = 1", "SELECT t"),
        (
            'SELECT "operations_run"."id" FROM "operations_run" WHERE "operations_run"."id" = %s '
            "LIMIT 21 FOR UPDATE",
            "SELECT operations_run FOR UPDATE",
        ),
        (
            'SELECT "o"."id" FROM "operations_operation" INNER JOIN "operations_tool" ON (1=1) '
            'INNER JOIN "operations_toolversion" ON (1=1) '
            'LEFT OUTER JOIN "operations_toolversion" T6 ON (1=1) WHERE "o"."id" = %s',
            "SELECT operations_operation + operations_tool, operations_toolversion x2",
        ),
        (
            'INSERT INTO "operations_event" ("stream") VALUES (%s) RETURNING "id"',
            "INSERT operations_event RETURNING",
        ),
        (OPERATION_UPDATE, "UPDATE operations_operation (3 columns)"),
        (
            'UPDATE "operations_run" SET "tool_calls" = ("operations_run"."tool_calls" + %s), '
            '"turns" = %s, "updated_at" = %s WHERE "operations_run"."id" = %s',
            "UPDATE operations_run (3 columns)",
        ),
        (
            "UPDATE operations_operation SET status = 'executing', attempts = attempts + 1 "
            "WHERE id = %s AND status = 'ready' RETURNING attempts",
            "UPDATE operations_operation (2 columns) RETURNING",
        ),
        ('DELETE FROM "operations_outbox" WHERE "id" = %s', "DELETE operations_outbox"),
    ],
)
def test_statement_label(sql, label):
    assert statement_label(sql) == label


def test_beyond_counts_repeats_and_ignores_the_columns_an_update_sets():
    path = labels(
        [
            "BEGIN",
            'INSERT INTO "operations_event" ("a") VALUES (%s) RETURNING "id"',
            'INSERT INTO "operations_event" ("a") VALUES (%s) RETURNING "id"',
            OPERATION_UPDATE,
            'SELECT "x" FROM "operations_event" WHERE 1 = 1',
            "COMMIT",
        ]
    )
    anchor = labels(
        [
            "BEGIN",
            "INSERT INTO operations_event (a) VALUES (%s)",
            "UPDATE operations_operation SET status = %s WHERE id = %s RETURNING id",
            "COMMIT",
            "BEGIN",
            "COMMIT",
        ]
    )

    assert beyond(path, anchor) == [
        "INSERT operations_event RETURNING",
        "SELECT operations_event",
    ]
    assert beyond(anchor, path) == ["BEGIN", "COMMIT"]


# --- CPU time from /proc -------------------------------------------------------------------------


def stat_line(pid, comm, ppid, utime, stime):
    # Fields 3..15 of /proc/<pid>/stat; 16 onwards do not matter here.
    middle = ["S", ppid, 1, 1, 0, -1, 4194560, 100, 0, 0, 0, utime, stime]
    return f"{pid} ({comm}) " + " ".join(map(str, middle)) + " 0 0 20 0 1 0"


def test_parse_stat_reads_cpu_after_a_command_name_with_spaces_and_parentheses():
    stat = procstat.parse_stat(stat_line(42, "gunicorn: worker (a) [b]", 7, 120, 30))

    assert stat == procstat.Stat(pid=42, comm="gunicorn: worker (a) [b]", ppid=7, cpu_ticks=150)


def test_children_and_cpu_ticks_from_a_proc_folder(tmp_path):
    for pid, ppid, utime in ((10, 1, 5), (11, 10, 100), (12, 10, 200), (13, 11, 7)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat_line(pid, "python", ppid, utime, 1))
    (tmp_path / "self").mkdir()  # not a pid: skipped

    assert sorted(procstat.children(10, tmp_path)) == [11, 12]
    assert procstat.cpu_ticks([10, 11, 99], tmp_path) == {10: 6, 11: 101}


def test_spent_counts_new_processes_whole_and_reports_the_ones_that_ended():
    before = {1: 100, 2: 50, 3: 10}
    after = {1: 130, 2: 50, 4: 20}

    ms, lost = procstat.spent_ms(before, after)

    assert ms == (30 + 0 + 20) * 1000 / procstat.TICKS_PER_S
    assert lost == 1


# --- the report ----------------------------------------------------------------------------------


def phase(wall_s, lifecycles, statements, cpu, *, batch=1, in_process=False):
    return Phase(
        wall_s=wall_s,
        lifecycles=lifecycles,
        statements=statements * lifecycles,
        steps={"outcome": [0.01] * lifecycles},
        cpu_ms=cpu,
        per_lifecycle_statements={statements * batch: lifecycles // batch},
        batch=batch,
        in_process=in_process,
    )


def test_a_batch_phase_reports_per_effect_and_counts_per_batch():
    report = phase(2.0, 100, 0.4, {"app": 0.0, "postgres": 50.0, "client": 50.0}, batch=20).report()

    assert report["lifecycles_s"] == 50.0
    assert report["batch"] == 20
    assert report["statements_per_lifecycle"] == 0.4
    assert report["statements_per_batch_seen"] == {"8.0": 5}
    assert report["cpu_ms_per_lifecycle"]["total"] == 1.0


def test_phases_add_up_and_report_per_lifecycle():
    total = Phase()
    total.add(phase(1.0, 100, 12, {"app": 0.0, "postgres": 300.0, "client": 200.0}))
    total.add(phase(1.0, 100, 12, {"app": 0.0, "postgres": 100.0, "client": 200.0}))

    report = total.report()

    assert report["lifecycles_s"] == 100.0
    assert report["statements_per_lifecycle"] == 12
    assert report["statements_per_lifecycle_seen"] == {"12": 200}
    assert report["cpu_ms_per_lifecycle"] == {
        "app": 0.0,
        "postgres": 2.0,
        "client": 2.0,
        "total": 4.0,
    }


def test_headline_and_table_from_a_report():
    paths = {
        "essential": phase(1.0, 200, 12, {"app": 0.0, "postgres": 600.0, "client": 700.0}),
        "replica": phase(2.0, 200, 41, {"app": 0.0, "postgres": 1600.0, "client": 1600.0}),
        "unprepared": phase(3.0, 200, 41, {"app": 0.0, "postgres": 3600.0, "client": 1600.0}),
        "dbos": phase(
            4.0, 200, 17, {"app": 1000.0, "postgres": 400.0, "client": 0.0}, in_process=True
        ),
        "api": phase(20.0, 200, 41, {"app": 13000.0, "postgres": 3800.0, "client": 3000.0}),
        "essential_x5": phase(
            0.5, 200, 1.6, {"app": 0.0, "postgres": 200.0, "client": 200.0}, batch=5
        ),
        "dbos_x5": phase(
            2.0,
            200,
            11.4,
            {"app": 800.0, "postgres": 200.0, "client": 0.0},
            batch=5,
            in_process=True,
        ),
    }
    paths["api"].django_cpu_ms = {"register_claim": 4000.0, "outcome": 2000.0}
    reports = {name: p.report() for name, p in paths.items()}
    life = {
        "threads": 8,
        "lifecycles_per_path": 200,
        "paths": reports,
        "peer": per_effect(reports, (5,)),
        "statements": {"dbos": {"workflow": ["BEGIN", "INSERT workflow_status", "COMMIT"]}},
        "api_beyond_essential": ["SELECT 1 (connection health check)"] * 2,
        "essential_beyond_api": ["BEGIN", "COMMIT"],
        "usual_statements": {
            "essential": 12,
            "replica": 41,
            "unprepared": 41,
            "dbos": 17,
            "api": 41,
        },
        "traced_statements": {
            "essential": 12,
            "replica": 41,
            "unprepared": 41,
            "dbos": 17,
            "api": 42,
        },
        "replica_matches_api": True,
    }
    parallel = {
        "threads": 16,
        "rounds_each": 10,
        "one_run": {"round_ms_median": 900.0, "request": {"p50_ms": 500.0}},
        "spread": {"round_ms_median": 600.0, "request": {"p50_ms": 300.0}},
        "ratio": 1.5,
    }

    figures = headline(life, parallel)
    text = "\n".join(table(life) + parallel_table(parallel))

    assert figures["lifecycle_api_vs_essential"] == 20.0
    assert figures["lifecycle_api_vs_replica"] == 10.0
    assert figures["statements_per_lifecycle"] == {
        "essential": 12,
        "replica": 41,
        "unprepared": 41,
        "dbos": 17,
        "api": 41,
        "essential_x5": 1.6,
        "dbos_x5": 11.4,
    }
    # Per effect: the API's throughput (10/s) over DBOS's (50/s) and the anchor's (200/s);
    # no API batch path, so no ratio for batches.
    assert figures["api_over_dbos"] == {"single": 0.2, "batch_5": None}
    assert figures["api_over_essential"] == {"single": 0.05, "batch_5": None}
    assert figures["cpu_ms_per_lifecycle"]["dbos"]["total"] == 7.0
    assert figures["cpu_ms_per_lifecycle"]["api"] == {
        "app": 65.0,
        "postgres": 19.0,
        "client": 15.0,
        "total": 99.0,
    }
    assert figures["parallel_in_one_run_vs_spread"] == 1.5
    assert "2 x SELECT 1 (connection health check)" in text
    assert "inside the Django app: register_claim 20.0, outcome 10.0\n" in text
    assert "(gunicorn's processes: 65.0 per lifecycle;" in text
    assert "needs an update" not in text
    assert "in the traced lifecycle (42 statements; most sent 41):" in text
    assert "essential statements the API does not send: BEGIN, COMMIT" in text
    assert "parallel_in_one_run_vs_spread 1.5" in text
    assert "    dbos                 50.0         4.00        17.0" in text
    assert "in app" in text
    assert "    5       api        n/a (no batch endpoint)" in text
    assert "    5       dbos            100.0       11.40" in text
    assert "throughput api / DBOS: single 0.20, x5 n/a (no batch endpoint)" in text
    assert "throughput api / essential: single 0.05, x5 n/a (no batch endpoint)" in text
    assert "      1 x INSERT workflow_status" in text
    assert (
        summary({"lifecycle": life, "parallel_registrations": parallel})
        .strip()
        .startswith("(a) lifecycle")
    )
