"""Pages and sweeps against a large ledger: do they grow with the table?

The ledger is seeded with bulk SQL (``INSERT ... SELECT generate_series``): mostly
terminal operations with one attempt and one event each, a tenth with a decided
approval request, spread over a thousand runs. A fixed *working set* stays the same
whatever the size: 300 operations awaiting approval (the inbox), 300 with an unknown
outcome (the reconciliation queue). Before each sweep measurement a fixed number of
*due* items is added: expired leases for ``services.sweep`` and due lookups for
``probes.probe_due``.

At each size the inbox (``/``), the reconciliation queue (``/reconciliation/``) and the
dashboard (``/dashboard/``, its money at stake included) are rendered in-process by a
console user with object permissions on the tools, and the sweeps run; each is timed
(median of repeats) and its queries are counted. Every SELECT and UPDATE they issue is
then run through ``EXPLAIN``: a sequential scan of a table of more than 100,000 rows is
a query that grows with the table, and is reported with its SQL.

Requires ``django.setup()`` first (``bench.bench`` does it).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .columns import sql_fill

WORKING_PENDING = 300
WORKING_UNKNOWN = 300
DUE = 50
SEED_RUNS = 1000
BIG_ROWS = 100_000


class CommittedLookup:
    """A lookup server on loopback that answers every key ``committed``."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the stdlib's name
                body = json.dumps(
                    {"result": "committed", "downstream_id": "re_seen", "evidence": {}}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/lookup/{{idempotency_key}}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Ledger:
    """Bulk-seeds one runner's ledger and measures pages and sweeps over it."""

    def __init__(self, *, runner: Any, tool: Any, lookup_tool: Any) -> None:
        from django.db import connection

        from operations.models import Run

        self.connection = connection
        self.runner = runner
        self.tool = tool
        self.lookup_tool = lookup_tool
        self.size = 0
        self.batches = 0
        names, marks, fill = sql_fill(
            Run,
            {"id", "runner_id", "external_id", "principal", "status", "tool_calls", "turns",
             "spend", "created_at", "updated_at"},
            key="run",
        )  # fmt: skip
        with connection.cursor() as cursor:
            cursor.execute(
                f"""INSERT INTO operations_run (id, runner_id, external_id, principal, status,
                        tool_calls, turns, spend, created_at, updated_at{names})
                    SELECT 'run_seed' || lpad(i::text, 6, '0'), %(runner)s, '', 'user:seed',
                        'active', 0, 0, 0, now(), now(){marks}
                    FROM generate_series(0, %(last)s) AS i""",  # noqa: S608
                {"runner": runner.pk, "last": SEED_RUNS - 1, **fill},
            )

    def _operations(
        self,
        cursor: Any,
        *,
        prefix: str,
        start: int,
        stop: int,
        status_sql: str,
        tool: Any,
        extra_sql: dict[str, str] | None = None,
    ) -> None:
        """Insert operations ``prefix + i`` for i in [start, stop), each with an attempt
        and its ``registered`` event."""
        from operations.models import Attempt, Event, Operation

        op_id = f"'{prefix}' || lpad(i::text, 12, '0')"
        columns = {
            "id": op_id,
            "runner_id": "%(runner)s",
            "run_id": f"'run_seed' || lpad(mod(i, {SEED_RUNS})::text, 6, '0')",
            "tool_id": "%(tool)s",
            "tool_version_id": "%(version)s",
            "effect_class": "'irreversible'",
            "call_id": "''",
            "operation_key": f"'{prefix}' || i",
            "arguments": "jsonb_build_object('payment_id', 'pay_' || i, "
            "'amount_cents', 100 + mod(i, 9000))",
            "intent_hash": "md5(i::text) || md5((i + 7)::text)",
            "principal": "'user:seed'",
            "idempotency_key": f"'ik_{prefix}' || i",
            "status": status_sql,
            "attempts": "1",
            "downstream_id": "''",
            "error_code": "''",
            "error_detail": "''",
            "unknown_sticky": "false",
            "probes": "0",
            "created_at": "now() - make_interval(secs => %(stop)s - i)",
            "updated_at": "now() - make_interval(secs => %(stop)s - i)",
            "status_changed_at": "now() - make_interval(secs => %(stop)s - i)",
            "next_probe_at": "NULL",
            "lease_until": "NULL",
            # The chain head of the one event inserted below, as the services keep it
            # (without it every transition of a seeded operation first repairs the head).
            "event_seq": "1",
            "event_head": f"md5({op_id}) || md5({op_id} || 'x')",
            **(extra_sql or {}),
        }
        names, marks, fill = sql_fill(Operation, columns, key="op")
        cursor.execute(
            f"INSERT INTO operations_operation ({', '.join(columns)}{names}) "  # noqa: S608
            f"SELECT {', '.join(columns.values())}{marks} "
            "FROM generate_series(%(start)s, %(stop)s - 1) AS i",
            {
                "runner": self.runner.pk,
                "tool": tool.name,
                "version": tool.active_version_id,
                "start": start,
                "stop": stop,
                **fill,
            },
        )
        names, marks, fill = sql_fill(
            Attempt,
            {"id", "operation_id", "number", "status", "claimed_at", "lease_until", "outcome",
             "outcome_code", "closed_at", "not_applied"},
            key="att",
        )  # fmt: skip
        cursor.execute(
            f"""INSERT INTO operations_attempt (id, operation_id, number, status, claimed_at,
                    lease_until, outcome, outcome_code, closed_at, not_applied{names})
                SELECT 'att_' || o.id, o.id, 1,
                    CASE o.status WHEN 'executing' THEN 'executing'
                        WHEN 'outcome_unknown' THEN 'unknown' ELSE 'succeeded' END,
                    o.created_at, coalesce(o.lease_until, o.created_at + interval '30 seconds'),
                    NULL, '', NULL, false{marks}
                FROM operations_operation o
                WHERE o.id >= '{prefix}' || lpad(%(start)s::text, 12, '0')
                  AND o.id < '{prefix}' || lpad(%(stop)s::text, 12, '0')""",  # noqa: S608
            {"start": start, "stop": stop, **fill},
        )
        names, marks, fill = sql_fill(
            Event,
            {"stream", "seq", "kind", "operation_id", "run_id", "tool_name", "from_status",
             "to_status", "actor", "at", "data", "prev_hash", "hash"},
            key="evt",
        )  # fmt: skip
        cursor.execute(
            f"""INSERT INTO operations_event (stream, seq, kind, operation_id, run_id,
                    tool_name, from_status, to_status, actor, at, data, prev_hash, hash{names})
                SELECT o.id, 1, 'registered', o.id, o.run_id, o.tool_id, '', o.status,
                    'runner:bench', o.created_at, '{{}}'::jsonb, repeat('0', 64),
                    md5(o.id) || md5(o.id || 'x'){marks}
                FROM operations_operation o
                WHERE o.id >= '{prefix}' || lpad(%(start)s::text, 12, '0')
                  AND o.id < '{prefix}' || lpad(%(stop)s::text, 12, '0')""",  # noqa: S608
            {"start": start, "stop": stop, **fill},
        )

    def _requests(self, cursor: Any, *, where: str, status: str, expires: str) -> None:
        from approvals.models import ApprovalRequest

        names, marks, fill = sql_fill(
            ApprovalRequest,
            {"id", "operation_id", "intent_hash", "status", "approvals_required",
             "grant_ttl_s", "reason", "context", "created_at", "expires_at", "decided_at"},
            key="apr",
        )  # fmt: skip
        cursor.execute(
            f"""INSERT INTO approvals_approvalrequest (id, operation_id, intent_hash, status,
                    approvals_required, grant_ttl_s, reason, context, created_at, expires_at,
                    decided_at{names})
                SELECT 'apr_' || o.id, o.id, o.intent_hash, {status}, 1, 900,
                    'Seeded for the bench.', '{{}}'::jsonb, o.created_at, {expires},
                    CASE WHEN {status} = 'pending' THEN NULL ELSE o.created_at END{marks}
                FROM operations_operation o WHERE {where}""",  # noqa: S608
            fill,
        )

    def grow(self, size: int, *, log: Callable[[str], None] = print) -> float:
        """Add terminal operations until the ledger holds ``size``; seconds spent."""
        started = time.monotonic()
        batch = 100_000
        with self.connection.cursor() as cursor:
            if self.size == 0:
                self._working_set(cursor)
            while self.size < size:
                stop = min(size, self.size + batch)
                prefix = "op_bulk"
                self._operations(
                    cursor,
                    prefix=prefix,
                    start=self.size,
                    stop=stop,
                    tool=self.tool,
                    status_sql="CASE WHEN mod(i, 100) < 90 THEN 'succeeded' "
                    "WHEN mod(i, 100) < 94 THEN 'failed_permanent' "
                    "WHEN mod(i, 100) < 97 THEN 'rejected' ELSE 'budget_exhausted' END",
                )
                lower = f"'{prefix}' || lpad({self.size}::text, 12, '0')"
                upper = f"'{prefix}' || lpad({stop}::text, 12, '0')"
                self._requests(
                    cursor,
                    where=f"o.id >= {lower} AND o.id < {upper} AND right(o.operation_key, 1) = '0'",
                    status="CASE o.status WHEN 'rejected' THEN 'rejected' ELSE 'approved' END",
                    expires="o.created_at + interval '1 day'",
                )
                self.size = stop
                log(f"  seeded {self.size:>9,} operations ({time.monotonic() - started:.0f} s)")
            cursor.execute("ANALYZE")
        return time.monotonic() - started

    def _working_set(self, cursor: Any) -> None:
        self._operations(
            cursor,
            prefix="op_pend",
            start=0,
            stop=WORKING_PENDING,
            tool=self.tool,
            status_sql="'awaiting_approval'",
            extra_sql={"attempts": "0"},
        )
        self._requests(
            cursor,
            where="left(o.id, 7) = 'op_pend'",
            status="'pending'",
            expires="now() + make_interval(mins => 60 + mod(substr(o.id, 8)::int, 600))",
        )
        self._operations(
            cursor,
            prefix="op_unkn",
            start=0,
            stop=WORKING_UNKNOWN,
            tool=self.tool,
            status_sql="'outcome_unknown'",
            extra_sql={
                "error_code": "CASE WHEN mod(i, 3) = 0 THEN 'lease_expired' "
                "ELSE 'timeout_unknown' END",
                "unknown_sticky": "true",
                "probes": "mod(i, 3)",
            },
        )

    def add_due_leases(self) -> None:
        """``DUE`` executing operations whose lease expired a minute ago (for the sweep)."""
        self.batches += 1
        with self.connection.cursor() as cursor:
            self._operations(
                cursor,
                prefix=f"op_lease{self.batches}",
                start=0,
                stop=DUE,
                tool=self.tool,
                status_sql="'executing'",
                extra_sql={"lease_until": "now() - interval '1 minute'"},
            )

    def add_due_probes(self) -> None:
        """``DUE`` unknown outcomes of a lookup tool whose probe is due (for probe_due)."""
        self.batches += 1
        with self.connection.cursor() as cursor:
            self._operations(
                cursor,
                prefix=f"op_probe{self.batches}",
                start=0,
                stop=DUE,
                tool=self.lookup_tool,
                status_sql="'outcome_unknown'",
                extra_sql={
                    "next_probe_at": "now() - interval '1 second'",
                    "unknown_sticky": "true",
                },
            )

    # --- measuring --------------------------------------------------------------------------

    def measure(
        self,
        name: str,
        action: Callable[[], Any],
        *,
        repeat: int = 5,
        prepare: Callable[[], Any] | None = None,
    ) -> dict[str, Any]:
        """Median time of ``action`` (``prepare`` runs untimed before each repeat), the
        time its queries took (best and median run), their number, the slowest one,
        and the big tables their plans scan sequentially."""
        from django.test.utils import CaptureQueriesContext

        times, db_times = [], []
        for _ in range(repeat):
            if prepare is not None:
                prepare()
            with CaptureQueriesContext(self.connection) as captured:
                started = time.perf_counter()
                action()
                times.append(time.perf_counter() - started)
            db_times.append(sum(float(query["time"]) for query in captured.captured_queries))
        queries = captured.captured_queries
        slowest = max(queries, key=lambda query: float(query["time"]), default=None)
        return {
            "name": name,
            "ms": round(statistics.median(times) * 1000, 1),
            # The least disturbed run: on a shared machine the median of a few
            # milliseconds mostly measures the neighbours.
            "db_ms": round(min(db_times) * 1000, 1),
            "db_ms_median": round(statistics.median(db_times) * 1000, 1),
            "queries": len(queries),
            "slowest_query": {"ms": round(float(slowest["time"]) * 1000, 1), "sql": slowest["sql"]}
            if slowest
            else None,
            "seq_scans": self.seq_scans(queries),
        }

    def seq_scans(self, queries: list[dict[str, str]]) -> list[dict[str, str]]:
        """Tables of more than ``BIG_ROWS`` rows that the plan of a captured query reads
        with a sequential scan (and the statements EXPLAIN could not take as logged).
        Smaller tables do not count: there a sequential scan is often the best plan."""
        from django.db import DatabaseError

        found = []
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT relname FROM pg_class WHERE relkind = 'r' AND reltuples > %s",
                [BIG_ROWS],
            )
            big = {row[0] for row in cursor.fetchall()}
            for query in queries:
                sql = query["sql"]
                if not sql.lstrip().upper().startswith(("SELECT", "UPDATE", "WITH")):
                    continue
                try:
                    cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
                except DatabaseError as exc:
                    found.append({"table": f"(not explained: {exc})", "sql": sql[:4000]})
                    continue
                for table in _seq_scanned(cursor.fetchone()[0][0]["Plan"]):
                    if table in big:
                        found.append({"table": table, "sql": sql[:4000]})
        return found


def _seq_scanned(plan: dict[str, Any]) -> list[str]:
    tables = [plan["Relation Name"]] if plan.get("Node Type") == "Seq Scan" else []
    for child in plan.get("Plans", []):
        tables.extend(_seq_scanned(child))
    return tables
