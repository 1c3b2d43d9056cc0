"""The register -> claim -> outcome lifecycle as hand-written SQL over raw psycopg.

Each step replicates, statement by statement, what one API request makes the service
do (captured from ``operations.services`` with Django's query log, Effectgate 0.1):

- every request: the bearer token's lookup, then the operation (and its approval
  requests) for the access check and, after the commit, for the response body;
- register: the run, the ``operation_key`` replay check, the tool and its active
  contract, then one transaction: the run's row lock, the principal's user, the insert
  (in a savepoint), the run's tool-call count, the event chain's last hash and the new
  event, the runner's webhook endpoints (the outbox check);
- claim: one transaction: the operation's row lock, its latest approval request, the
  attempt insert and the operation update (in a savepoint), the event, the outbox check;
- outcome: one transaction: the operation's lock, the attempt's lock, both updates, the
  event, the outbox check.

What it leaves out is what makes the API an API: HTTP, authentication middleware,
JSON parsing and schema validation, serialization, the contract and state-machine
code in Python. The ratio of the two is the price of those.
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


class SqlRunner:
    """One runner's lifecycle steps on one persistent connection."""

    def __init__(self, url: str, *, token_hash: str, tool: str) -> None:
        # Autocommit, like Django: reads outside a transaction, each step's writes in
        # one explicit transaction (BEGIN ... COMMIT), savepoints where Django has them.
        self.conn = psycopg.connect(url, autocommit=True)
        self.token_hash = token_hash
        self.tool = tool
        self.statements = 0
        self.extra_op = missing_not_null_columns(self.conn, "operations_operation", OP_COLUMNS)
        self.extra_event = missing_not_null_columns(self.conn, "operations_event", EVENT_COLUMNS)

    def close(self) -> None:
        self.conn.close()

    def _x(self, sql: str, params: Any = None) -> psycopg.Cursor:
        self.statements += 1
        return self.conn.execute(sql, params)

    def _transaction(self) -> psycopg.Transaction:
        """BEGIN/COMMIT, or SAVEPOINT/RELEASE when nested: two statements either way."""
        self.statements += 2
        return self.conn.transaction()

    def _authenticate(self) -> str:
        row = self._x(
            "SELECT t.runner_id, t.*, r.* FROM operations_runnertoken t "
            "JOIN operations_runner r ON r.id = t.runner_id WHERE t.token_hash = %s",
            (self.token_hash,),
        ).fetchone()
        return row[0]

    def _operation_for_response(self, op_id: str, runner_id: str) -> None:
        self._x(
            "SELECT o.*, v.*, r.* FROM operations_operation o "
            "JOIN operations_toolversion v ON v.id = o.tool_version_id "
            "JOIN operations_run r ON r.id = o.run_id WHERE o.id = %s AND o.runner_id = %s",
            (op_id, runner_id),
        ).fetchone()
        self._x(
            "SELECT a.*, g.* FROM approvals_approvalrequest a "
            "LEFT JOIN approvals_grant g ON g.request_id = a.id "
            "WHERE a.operation_id = %s ORDER BY a.created_at",
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
        self._insert("operations_event", columns)
        self._x(
            "SELECT * FROM operations_webhookendpoint WHERE is_active AND runner_id = %s",
            (runner_id,),
        ).fetchall()

    def _insert(self, table: str, columns: dict[str, Any]) -> None:
        names = ", ".join(columns)
        marks = ", ".join(["%s"] * len(columns))
        self._x(f"INSERT INTO {table} ({names}) VALUES ({marks})", list(columns.values()))  # noqa: S608

    # --- the three steps ------------------------------------------------------------------

    def register(self, *, run_id: str, key: str, arguments: dict[str, Any]) -> str:
        runner_id = self._authenticate()
        self._x(
            "SELECT * FROM operations_run WHERE id = %s AND runner_id = %s", (run_id, runner_id)
        ).fetchone()
        self._x(
            "SELECT * FROM operations_operation o "
            "JOIN operations_toolversion v ON v.id = o.tool_version_id "
            "WHERE o.runner_id = %s AND o.operation_key = %s LIMIT 1",
            (runner_id, key),
        ).fetchone()
        version_id = self._x(
            "SELECT v.id FROM operations_tool t "
            "JOIN operations_toolversion v ON v.id = t.active_version_id WHERE t.name = %s",
            (self.tool,),
        ).fetchone()[0]
        op_id = new_id("op")
        with self._transaction():
            principal = self._x(
                "SELECT principal FROM operations_run WHERE id = %s FOR UPDATE", (run_id,)
            ).fetchone()[0]
            self._x(
                "SELECT * FROM auth_user WHERE username = %s ORDER BY id LIMIT 1",
                (principal.removeprefix("user:"),),
            ).fetchone()
            now = datetime.now(UTC)
            frozen = json.dumps(arguments, sort_keys=True)
            with self._transaction():  # the savepoint around the insert
                self._insert(
                    "operations_operation",
                    {
                        "id": op_id,
                        "runner_id": runner_id,
                        "run_id": run_id,
                        "tool_id": self.tool,
                        "tool_version_id": version_id,
                        "effect_class": "irreversible",
                        "call_id": "",
                        "operation_key": key,
                        "arguments": frozen,
                        "intent_hash": _hash(self.tool, frozen, principal),
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
                        **self.extra_op,
                    },
                )
            self._x(
                "UPDATE operations_run SET tool_calls = tool_calls + 1, updated_at = %s "
                "WHERE id = %s",
                (now, run_id),
            )
            self._append_event(op_id, run_id, "registered", "", "ready", runner_id)
        self._operation_for_response(op_id, runner_id)
        return op_id

    def _lock(self, op_id: str) -> tuple:
        return self._x(
            "SELECT o.status, o.attempts, o.run_id, o.*, v.*, t.*, r.*, n.* "
            "FROM operations_operation o "
            "JOIN operations_toolversion v ON v.id = o.tool_version_id "
            "JOIN operations_tool t ON t.name = o.tool_id "
            "JOIN operations_run r ON r.id = o.run_id "
            "JOIN operations_runner n ON n.id = o.runner_id "
            "WHERE o.id = %s FOR UPDATE OF o",
            (op_id,),
        ).fetchone()

    def claim(self, op_id: str, *, lease_s: int = 30) -> int:
        runner_id = self._authenticate()
        self._operation_for_response(op_id, runner_id)  # the access check
        with self._transaction():
            row = self._lock(op_id)
            status, attempts, run_id = row[0], row[1], row[2]
            if status != "ready":
                raise RuntimeError(f"{op_id} is {status}")
            self._x(
                "SELECT * FROM approvals_approvalrequest WHERE operation_id = %s "
                "ORDER BY created_at DESC LIMIT 1",
                (op_id,),
            ).fetchone()
            now = datetime.now(UTC)
            lease_until = now + timedelta(seconds=lease_s)
            number = attempts + 1
            with self._transaction():
                self._insert(
                    "operations_attempt",
                    {
                        "id": new_id("att"),
                        "operation_id": op_id,
                        "number": number,
                        "status": "executing",
                        "claimed_at": now,
                        "lease_until": lease_until,
                        "outcome_code": "",
                        "not_applied": False,
                    },
                )
                self._x(
                    "UPDATE operations_operation SET status = 'executing', attempts = %s, "
                    "lease_until = %s, not_before = NULL, status_changed_at = %s, "
                    "updated_at = %s WHERE id = %s",
                    (number, lease_until, now, now, op_id),
                )
                self._append_event(op_id, run_id, "claimed", "ready", "executing", runner_id)
        return number

    def outcome(self, op_id: str, number: int, body: dict[str, Any]) -> None:
        runner_id = self._authenticate()
        self._operation_for_response(op_id, runner_id)  # the access check
        with self._transaction():
            row = self._lock(op_id)
            run_id = row[2]
            attempt_id = self._x(
                "SELECT id FROM operations_attempt WHERE number = %s AND operation_id = %s "
                "FOR UPDATE",
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
                "downstream_id = %s, next_probe_at = NULL, snoozed_until = NULL, "
                "status_changed_at = %s, updated_at = %s WHERE id = %s",
                (body.get("downstream_id", ""), now, now, op_id),
            )
            self._append_event(op_id, run_id, "outcome", "executing", "succeeded", runner_id)
        self._operation_for_response(op_id, runner_id)


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
