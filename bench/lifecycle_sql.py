"""The runner's lifecycle as hand-written SQL over raw psycopg: the API's replica.

A runner registers an operation and claims its first attempt in the same request
(``"claim": {"lease_s": ...}``), then posts the attempt's outcome. ``SqlRunner`` sends,
statement by statement, what those two requests make the service send (captured with
the bench's gunicorn counter, ``bench.gunicorn_conf``; ``make bench`` prints both
counts, so a change in the service that the replica misses shows up):

- every request: the token generation's read (the token cache's question, in place of
  the connection health check; the replica's token is always remembered), then, when
  the API's throttle counts in the database (no Redis configured), the count's one
  upsert;
- register and claim: one read of the run, the tool and its active contract, then one
  transaction: the operation inserted already executing (``ON CONFLICT DO NOTHING``),
  its attempt and its two events in one statement, the run's budgets taken last by a
  conditional UPDATE;
- outcome: one transaction: the locking read of the runner's operation and attempt
  (the access check is its filter), the attempt's and the operation's UPDATEs (the
  columns that change, the event chain's head among them) and the event.

What the replica leaves out is what makes the API
an API: HTTP, middleware, authentication, JSON parsing and schema validation,
serialization, the contract and state-machine code in Python, the ORM.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from approvals.ids import new_id
from operations.eventmac import event_mac

from .columns import unnamed_defaults


def _hash(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, default=str, sort_keys=True).encode()).hexdigest()


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

    def _insert_many(
        self, table: str, rows: list[dict[str, Any]], *, conflict: bool = True
    ) -> psycopg.Cursor:
        """One ``INSERT`` of ``rows`` (all with the same columns); with ``conflict``, rows
        that break a unique constraint are skipped (``ON CONFLICT DO NOTHING``) and the
        ids of those inserted come back (``RETURNING id``)."""
        names = ", ".join(rows[0])
        row = "(" + ", ".join(["%s"] * len(rows[0])) + ")"
        tail = " ON CONFLICT DO NOTHING RETURNING id" if conflict else ""
        return self._x(
            f"INSERT INTO {table} ({names}) VALUES {', '.join([row] * len(rows))}{tail}",  # noqa: S608
            [value for columns in rows for value in columns.values()],
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
        from operations.http.throttling import COUNT_SQL
        from operations.models import Attempt, Event, Operation

        self.count_sql = COUNT_SQL
        self.extra_op = unnamed_defaults(Operation, OP_COLUMNS | INLINE_CLAIM_COLUMNS)
        self.extra_event = unnamed_defaults(Event, EVENT_COLUMNS)
        self.extra_attempt = unnamed_defaults(Attempt, ATTEMPT_COLUMNS)
        self.throttle_key = self._throttle_key()
        # The API's sweep of old counters leaves the replica's row alone for a day.
        self.throttle_expires = int(time.time()) + 86400

    def _throttle_key(self) -> str | None:
        """The counter this replica's token counts in, when the API counts in the
        database (no Redis configured, a runner rate set); None otherwise."""
        from django.conf import settings

        backend = settings.CACHES["default"]["BACKEND"]
        if (
            backend != "operations.http.throttling.DatabaseCache"
            or not settings.THROTTLE_RUNNER_RATE
        ):
            return None
        return f"throttle:runner:replica-{secrets.token_hex(6)}:0"

    def _request(self) -> str:
        """What every request starts with: the health check and the token's lookup, then
        the throttle's count (operations/http/throttling.py) when it is in the database."""
        if self.token_cache:
            self._x("SELECT value FROM operations_token_generation WHERE id = 1").fetchone()
            runner_id = self.runner_id
        else:
            self._x("SELECT 1")
            runner_id = self._x(
                "SELECT t.runner_id, t.*, r.* FROM operations_runnertoken t "
                "JOIN operations_runner r ON r.id = t.runner_id WHERE t.token_hash = %s "
                "ORDER BY t.id LIMIT 1",
                (self.token_hash,),
            ).fetchone()[0]
        if self.throttle_key is not None:
            # The statement of ``DatabaseCache.window_count``: the count's one upsert.
            self._x(self.count_sql, (self.throttle_key, 1, self.throttle_expires)).fetchone()
        return runner_id

    def _event_row(
        self,
        op_id: str,
        run_id: str,
        runner_id: str,
        *,
        seq: int,
        prev: str,
        kind: str,
        source: str,
        target: str,
        now: datetime,
    ) -> dict[str, Any]:
        data = json.dumps({"kind": kind, "at": now.isoformat()})
        digest = _hash(op_id, seq, kind, source, target, now, data, prev)
        return {
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
            "hash": digest,
            # The service's MAC under AUDIT_EVENT_KEY when one is set: the same work.
            "mac": event_mac(digest),
            **self.extra_event,
        }

    # --- the two requests -----------------------------------------------------------------

    def register_and_claim(
        self, *, run_id: str, key: str, arguments: dict[str, Any], lease_s: int = 30
    ) -> tuple[str, int]:
        runner_id = self._request()
        principal, version_id = self._x(
            "SELECT r.principal, v.id, r.principal_user_id, t.name, t.active_version_id, "
            "t.owner_id, t.breaker_state, v.tool_id, v.number, v.contract, v.contract_hash "
            "FROM operations_run r LEFT JOIN operations_tool t ON t.name = %s "
            "LEFT JOIN operations_toolversion v ON v.id = t.active_version_id "
            "WHERE r.id = %s AND r.runner_id = %s",
            (self.tool, run_id, runner_id),
        ).fetchone()[:2]
        op_id = new_id("op")
        now = datetime.now(UTC)
        frozen = json.dumps(arguments, sort_keys=True)
        lease_until = now + timedelta(seconds=lease_s)
        registered = self._event_row(
            op_id,
            run_id,
            runner_id,
            seq=1,
            prev="0" * 64,
            kind="registered",
            source="",
            target="ready",
            now=now,
        )
        claimed = self._event_row(
            op_id,
            run_id,
            runner_id,
            seq=2,
            prev=registered["hash"],
            kind="claimed",
            source="ready",
            target="executing",
            now=now,
        )
        with self._transaction():
            row = {
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
                "status": "executing",
                "attempts": 1,
                "lease_until": lease_until,
                "event_seq": 2,
                "event_head": claimed["hash"],
            }
            names = ", ".join(row)
            marks = ", ".join(["%s"] * len(row))
            self._x(
                f"INSERT INTO operations_operation ({names}) VALUES ({marks}) "  # noqa: S608
                "ON CONFLICT DO NOTHING",
                list(row.values()),
            )
            attempt = {
                "id": new_id("att"),
                "operation_id": op_id,
                "number": 1,
                "status": "executing",
                "claimed_at": now,
                "lease_until": lease_until,
                "outcome_code": "",
                "not_applied": False,
                **self.extra_attempt,
            }
            event_names = ", ".join(registered)
            event_marks = "(" + ", ".join(["%s"] * len(registered)) + ")"
            self._x(
                f"WITH w0 AS (INSERT INTO operations_attempt ({', '.join(attempt)}) "  # noqa: S608
                f"VALUES ({', '.join(['%s'] * len(attempt))})) "
                f"INSERT INTO operations_event ({event_names}) VALUES {event_marks}, {event_marks}",
                [*attempt.values(), *registered.values(), *claimed.values()],
            )
            self._x(
                "UPDATE operations_run SET tool_calls = tool_calls + 1, "
                "turns = CASE WHEN turns < %s THEN %s ELSE turns END, updated_at = %s "
                "WHERE id = %s AND status = %s AND (deadline_at IS NULL OR deadline_at > %s) "
                "AND (max_tool_calls IS NULL OR tool_calls < max_tool_calls) "
                "AND (max_spend IS NULL OR spend < max_spend) "
                "AND (max_turns IS NULL OR %s <= max_turns)",
                (0, 0, now, run_id, "active", now, 0),
            )
        return op_id, 1

    def outcome(self, op_id: str, number: int, body: dict[str, Any]) -> None:
        runner_id = self._request()
        with self._transaction():
            row = self._x(
                "SELECT o.run_id, o.event_seq, o.event_head, a.id, o.*, a.*, v.*, t.*, av.*, "
                "EXISTS (SELECT 1 FROM approvals_approvalrequest r WHERE r.operation_id = o.id) "
                "FROM operations_attempt a "
                "JOIN operations_operation o ON o.id = a.operation_id "
                "JOIN operations_toolversion v ON v.id = o.tool_version_id "
                "JOIN operations_tool t ON t.name = o.tool_id "
                "LEFT JOIN operations_toolversion av ON av.id = t.active_version_id "
                "WHERE a.operation_id = %s AND a.number = %s AND o.runner_id = %s "
                "FOR UPDATE OF o, a",
                (op_id, number, runner_id),
            ).fetchone()
            run_id, seq, head, attempt_id = row[:4]
            now = datetime.now(UTC)
            self._x(
                "UPDATE operations_attempt SET status = %s, outcome = %s, "
                "outcome_code = %s, closed_at = %s WHERE id = %s",
                ("succeeded", json.dumps(body), "", now, attempt_id),
            )
            event = self._event_row(
                op_id,
                run_id,
                runner_id,
                seq=seq + 1,
                prev=head,
                kind="outcome",
                source="executing",
                target="succeeded",
                now=now,
            )
            self._insert("operations_event", event)
            self._x(
                "UPDATE operations_operation SET status = %s, status_changed_at = %s, "
                "lease_until = NULL, updated_at = %s, event_seq = %s, event_head = %s, "
                "result = NULL, downstream_id = %s, error_code = '', error_detail = '', "
                "unknown_sticky = false, next_probe_at = NULL, snoozed_until = NULL "
                "WHERE id = %s",
                (
                    "succeeded",
                    now,
                    now,
                    seq + 1,
                    event["hash"],
                    body.get("downstream_id", ""),
                    op_id,
                ),
            )


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
# What the operation's row of an inline claim names beyond a ready operation's.
INLINE_CLAIM_COLUMNS = {"lease_until", "event_seq", "event_head"}
ATTEMPT_COLUMNS = {
    "id",
    "operation_id",
    "number",
    "status",
    "claimed_at",
    "lease_until",
    "outcome_code",
    "not_applied",
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
    "mac",
}
