"""The runner's lifecycle as hand-written SQL over raw psycopg: the API's replica.

A runner registers an operation and claims its first attempt in the same request
(``"claim": {"lease_s": ...}``), then posts the attempt's outcome. ``SqlRunner`` sends,
statement by statement, what those two requests make the service send (captured with
the bench's gunicorn counter, ``bench.gunicorn_conf``; ``make bench`` prints both
counts, so a change in the service that the replica misses shows up):

- every request: the connection health check (``SELECT 1``, ``CONN_HEALTH_CHECKS``),
  the bearer token's lookup (with the token cache, where it exists: the token
  generation's read instead of both); after the commit, the operation and its approval
  requests for the response body;
- register and claim: the run, the ``operation_key`` replay check, the tool and its
  active contract, then one transaction: the run's row lock, the principal's user, the
  insert (in a savepoint), the run's tool-call count, the event chain's last hash and
  the ``registered`` event, the runner's webhook endpoints (the outbox check), the
  latest approval request, then in a savepoint the attempt insert, the operation
  update, the ``claimed`` event with its chain read and outbox check;
- outcome: the operation and its approval requests (the access check), then one
  transaction: the operation's lock, the attempt's lock, both updates, the event with
  its chain read, the outbox check.

Django's operation UPDATE sets all 32 columns; the replica's sets those that change,
which writes the same row version. What the replica leaves out is what makes the API
an API: HTTP, middleware, authentication, JSON parsing and schema validation,
serialization, the contract and state-machine code in Python, the ORM.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from approvals.ids import new_id


def _hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, default=str, sort_keys=True).encode()).hexdigest()


def missing_not_null_columns(conn: psycopg.Connection, table: str, known: set[str]) -> dict:
    """NOT NULL columns without a default that the statements here do not name, with
    the empty value Django's field default would give (``''``, 0, false, ``{}``), so
    that a column added later does not break the replica."""
    rows = conn.execute(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_name = %s AND is_nullable = 'NO' AND column_default IS NULL "
        "AND is_identity = 'NO'",
        (table,),
    ).fetchall()
    empty = {"boolean": False, "integer": 0, "bigint": 0, "smallint": 0, "jsonb": "{}"}
    return {name: empty.get(kind, "") for name, kind in rows if name not in known}


def new_operation_row(
    *,
    op_id: str,
    runner_id: str,
    run_id: str,
    tool: str,
    version_id: int,
    key: str,
    arguments: str,
    intent_hash: str,
    principal: str,
    now: datetime,
) -> dict[str, Any]:
    """The columns of a freshly registered, ready operation of an irreversible tool."""
    return {
        "id": op_id,
        "runner_id": runner_id,
        "run_id": run_id,
        "tool_id": tool,
        "tool_version_id": version_id,
        "effect_class": "irreversible",
        "call_id": "",
        "operation_key": key,
        "arguments": arguments,
        "intent_hash": intent_hash,
        "principal": principal,
        "idempotency_key": "ik_" + secrets.token_urlsafe(24),
        "status": "ready",
        "attempts": 0,
        "downstream_id": "",
        "error_code": "",
        "error_detail": "",
        "unknown_sticky": False,
        "probes": 0,
        "created_at": now,
        "updated_at": now,
        "status_changed_at": now,
    }


class Statements:
    """One persistent connection that counts (and, when asked, keeps) what it sends.

    Autocommit, like Django: reads outside a transaction, writes in an explicit
    transaction (BEGIN ... COMMIT) or, nested, a savepoint (SAVEPOINT ... RELEASE).
    """

    def __init__(self, url: str, *, prepared: bool = True) -> None:
        # psycopg prepares a statement on the server once it has run it five times;
        # without that (``prepared=False``) every statement is parsed and planned again,
        # as with Django, which binds parameters on the client.
        self.conn = psycopg.connect(url, autocommit=True, prepare_threshold=5 if prepared else None)
        self.backend_pid = self.conn.info.backend_pid
        self.statements = 0
        self.log: list[str] | None = None
        self._depth = 0

    def close(self) -> None:
        self.conn.close()

    def _note(self, sql: str) -> None:
        self.statements += 1
        if self.log is not None:
            self.log.append(sql)

    def _x(self, sql: str, params: Any = None) -> psycopg.Cursor:
        self._note(sql)
        return self.conn.execute(sql, params)

    def _transaction(self) -> Any:
        """BEGIN/COMMIT, or SAVEPOINT/RELEASE when nested: two statements either way."""
        runner = self

        class _Block:
            def __enter__(self) -> None:
                runner._depth += 1
                runner._note("BEGIN" if runner._depth == 1 else "SAVEPOINT")
                self.inner = runner.conn.transaction()
                self.inner.__enter__()

            def __exit__(self, *exc_info: Any) -> None:
                runner._note("COMMIT" if runner._depth == 1 else "RELEASE SAVEPOINT")
                runner._depth -= 1
                self.inner.__exit__(*exc_info)

        return _Block()

    def _insert(self, table: str, columns: dict[str, Any], returning: str = "") -> psycopg.Cursor:
        names = ", ".join(columns)
        marks = ", ".join(["%s"] * len(columns))
        tail = f" RETURNING {returning}" if returning else ""
        return self._x(
            f"INSERT INTO {table} ({names}) VALUES ({marks}){tail}",  # noqa: S608
            list(columns.values()),
        )


class SqlRunner(Statements):
    """One runner's requests, replayed as the service's statements."""

    def __init__(self, url: str, *, token_hash: str, tool: str, prepared: bool = True) -> None:
        super().__init__(url, prepared=prepared)
        self.token_hash = token_hash
        self.tool = tool
        # With the per-process token cache (operations/tokencache.py, where its table
        # exists), a request reads the token generation in place of the health check and
        # a remembered token needs no lookup: the replica's token is always remembered.
        self.token_cache = self.conn.execute(
            "SELECT to_regclass('operations_token_generation') IS NOT NULL"
        ).fetchone()[0]
        self.runner_id = self.conn.execute(
            "SELECT runner_id FROM operations_runnertoken WHERE token_hash = %s", (token_hash,)
        ).fetchone()[0]
        self.extra_op = missing_not_null_columns(self.conn, "operations_operation", OP_COLUMNS)
        self.extra_event = missing_not_null_columns(self.conn, "operations_event", EVENT_COLUMNS)

    def _request(self) -> str:
        """What every request starts with: the health check and the token's lookup."""
        if self.token_cache:
            self._x("SELECT value FROM operations_token_generation WHERE id = 1").fetchone()
            return self.runner_id
        self._x("SELECT 1")
        row = self._x(
            "SELECT t.runner_id, t.*, r.* FROM operations_runnertoken t "
            "JOIN operations_runner r ON r.id = t.runner_id WHERE t.token_hash = %s "
            "ORDER BY t.id LIMIT 1",
            (self.token_hash,),
        ).fetchone()
        return row[0]

    def _operation_for_response(self, op_id: str, runner_id: str | None = None) -> None:
        # The access check reads the runner's own operation; the response any.
        self._x(
            "SELECT o.*, r.*, v.* FROM operations_operation o "
            "JOIN operations_run r ON r.id = o.run_id "
            "JOIN operations_toolversion v ON v.id = o.tool_version_id "
            "WHERE o.id = %s AND (%s::text IS NULL OR o.runner_id = %s) LIMIT 21",
            (op_id, runner_id, runner_id),
        ).fetchone()
        self._x(
            "SELECT a.*, g.* FROM approvals_approvalrequest a "
            "LEFT JOIN approvals_grant g ON g.request_id = a.id "
            "WHERE a.operation_id IN (%s) ORDER BY a.created_at",
            (op_id,),
        ).fetchall()

    def _append_event(
        self, op_id: str, run_id: str, kind: str, source: str, target: str, runner_id: str
    ) -> None:
        last = self._x(
            "SELECT seq, hash FROM operations_event WHERE stream = %s ORDER BY seq DESC LIMIT 1",
            (op_id,),
        ).fetchone()
        seq, prev = (last[0] + 1, last[1]) if last else (1, "0" * 64)
        now = datetime.now(UTC)
        data = json.dumps({"kind": kind, "at": now.isoformat()})
        columns = {
            "stream": op_id,
            "seq": seq,
            "kind": kind,
            "operation_id": op_id,
            "run_id": run_id,
            "tool_name": self.tool,
            "from_status": source,
            "to_status": target,
            "actor": "runner:bench",
            "actor_runner_id": runner_id,
            "at": now,
            "data": data,
            "prev_hash": prev,
            "hash": _hash(op_id, seq, kind, source, target, now, data, prev),
            **self.extra_event,
        }
        self._insert("operations_event", columns, returning="id").fetchone()
        self._x(
            "SELECT * FROM operations_webhookendpoint WHERE is_active AND runner_id = %s",
            (runner_id,),
        ).fetchall()

    # --- the two requests -----------------------------------------------------------------

    def register_and_claim(
        self, *, run_id: str, key: str, arguments: dict[str, Any], lease_s: int = 30
    ) -> tuple[str, int]:
        runner_id = self._request()
        self._x(
            "SELECT * FROM operations_run WHERE id = %s AND runner_id = %s ORDER BY id LIMIT 1",
            (run_id, runner_id),
        ).fetchone()
        self._x(
            "SELECT * FROM operations_operation o "
            "JOIN operations_toolversion v ON v.id = o.tool_version_id "
            "WHERE o.operation_key = %s AND o.runner_id = %s ORDER BY o.id LIMIT 1",
            (key, runner_id),
        ).fetchone()
        version_id = self._x(
            "SELECT v.id, t.*, v.* FROM operations_tool t "
            "LEFT JOIN operations_toolversion v ON v.id = t.active_version_id "
            "WHERE t.name = %s ORDER BY t.name LIMIT 1",
            (self.tool,),
        ).fetchone()[0]
        op_id = new_id("op")
        with self._transaction():
            principal = self._x(
                "SELECT principal, * FROM operations_run WHERE id = %s LIMIT 21 FOR UPDATE",
                (run_id,),
            ).fetchone()[0]
            self._x(
                "SELECT id, username FROM auth_user WHERE UPPER(username::text) = UPPER(%s)",
                (principal.removeprefix("user:"),),
            ).fetchall()
            now = datetime.now(UTC)
            frozen = json.dumps(arguments, sort_keys=True)
            with self._transaction():  # the savepoint around the insert
                self._insert(
                    "operations_operation",
                    {
                        **new_operation_row(
                            op_id=op_id,
                            runner_id=runner_id,
                            run_id=run_id,
                            tool=self.tool,
                            version_id=version_id,
                            key=key,
                            arguments=frozen,
                            intent_hash=_hash(self.tool, frozen, principal),
                            principal=principal,
                            now=now,
                        ),
                        **self.extra_op,
                    },
                )
            self._x(
                "UPDATE operations_run SET tool_calls = tool_calls + 1, turns = turns, "
                "updated_at = %s WHERE id = %s",
                (now, run_id),
            )
            self._append_event(op_id, run_id, "registered", "", "ready", runner_id)
            # The inline claim, in the same transaction.
            self._x(
                "SELECT a.*, g.* FROM approvals_approvalrequest a "
                "LEFT JOIN approvals_grant g ON g.request_id = a.id "
                "WHERE a.operation_id = %s ORDER BY a.created_at DESC, a.id DESC LIMIT 1",
                (op_id,),
            ).fetchone()
            lease_until = now + timedelta(seconds=lease_s)
            with self._transaction():
                self._insert(
                    "operations_attempt",
                    {
                        "id": new_id("att"),
                        "operation_id": op_id,
                        "number": 1,
                        "status": "executing",
                        "claimed_at": now,
                        "lease_until": lease_until,
                        "outcome_code": "",
                        "not_applied": False,
                    },
                )
                self._x(
                    "UPDATE operations_operation SET status = 'executing', attempts = 1, "
                    "lease_until = %s, not_before = NULL, status_changed_at = %s, "
                    "updated_at = %s WHERE id = %s",
                    (lease_until, now, now, op_id),
                )
                self._append_event(op_id, run_id, "claimed", "ready", "executing", runner_id)
        self._operation_for_response(op_id)
        return op_id, 1

    def _lock(self, op_id: str) -> tuple:
        return self._x(
            "SELECT o.status, o.attempts, o.run_id, o.*, n.*, r.*, t.*, v.*, av.* "
            "FROM operations_operation o "
            "JOIN operations_runner n ON n.id = o.runner_id "
            "JOIN operations_run r ON r.id = o.run_id "
            "JOIN operations_tool t ON t.name = o.tool_id "
            "JOIN operations_toolversion v ON v.id = o.tool_version_id "
            "LEFT JOIN operations_toolversion av ON av.id = t.active_version_id "
            "WHERE o.id = %s LIMIT 21 FOR UPDATE OF o",
            (op_id,),
        ).fetchone()

    def outcome(self, op_id: str, number: int, body: dict[str, Any]) -> None:
        runner_id = self._request()
        self._operation_for_response(op_id, runner_id)  # the access check
        with self._transaction():
            row = self._lock(op_id)
            run_id = row[2]
            attempt_id = self._x(
                "SELECT id FROM operations_attempt WHERE number = %s AND operation_id = %s "
                "ORDER BY operation_id, number LIMIT 1 FOR UPDATE",
                (number, op_id),
            ).fetchone()[0]
            now = datetime.now(UTC)
            self._x(
                "UPDATE operations_attempt SET status = 'succeeded', outcome = %s, "
                "outcome_code = '', closed_at = %s WHERE id = %s",
                (json.dumps(body), now, attempt_id),
            )
            self._x(
                "UPDATE operations_operation SET status = 'succeeded', lease_until = NULL, "
                "downstream_id = %s, status_changed_at = %s, updated_at = %s WHERE id = %s",
                (body.get("downstream_id", ""), now, now, op_id),
            )
            self._append_event(op_id, run_id, "outcome", "executing", "succeeded", runner_id)
        self._operation_for_response(op_id)


OP_COLUMNS = {
    "id",
    "runner_id",
    "run_id",
    "tool_id",
    "tool_version_id",
    "effect_class",
    "call_id",
    "operation_key",
    "arguments",
    "intent_hash",
    "principal",
    "idempotency_key",
    "status",
    "attempts",
    "downstream_id",
    "error_code",
    "error_detail",
    "unknown_sticky",
    "probes",
    "created_at",
    "updated_at",
    "status_changed_at",
}
EVENT_COLUMNS = {
    "stream",
    "seq",
    "kind",
    "operation_id",
    "run_id",
    "tool_name",
    "from_status",
    "to_status",
    "actor",
    "actor_runner_id",
    "at",
    "data",
    "prev_hash",
    "hash",
}
