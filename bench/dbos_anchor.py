"""The durable-execution peer: DBOS (``dbos`` on PyPI), in the bench's own process.

A team that wants "no duplicate side effects" from Python can also write each side
effect as a ``@DBOS.step()`` of a ``@DBOS.workflow()``: DBOS records the workflow and
each step's output in its system database in PostgreSQL, and a workflow started again
with the same id (``SetWorkflowID``) returns what it recorded instead of running again.
This module is that peer, as its documentation has one write it:

- one **effect** is one workflow with one step, its workflow id the operation key, its
  input the tool call's arguments; the step does what the other paths' side effect
  stands for: nothing is called (their runners post ``succeeded`` with a downstream id
  without calling a provider), the downstream id is the step's recorded output;
- a **batch** of N effects (the parallel tool calls of one model turn) is one workflow
  with N steps, run one after the other as DBOS runs a synchronous workflow's steps.

DBOS is a library: it runs in the process that calls it, here the bench's client
threads, with its own system database (``effectgate_bench_dbos`` beside the bench's)
on the same PostgreSQL server, its own engine and pool (DBOS's defaults: SQLAlchemy,
psycopg, 20 connections, pre-ping on checkout) and its background threads (queues,
notifications, scheduler), which run through every phase of the bench but send little.

Statements: ``pg_stat_statements`` is not loaded on the bench's server, so the round
trips are counted at DBOS's SQLAlchemy engine, per client thread: every statement it
sends (``before_cursor_execute``), the ``BEGIN`` psycopg sends before the first
statement of a transaction (autocommit off, connection idle), each ``COMMIT`` and
``ROLLBACK`` that ends a transaction (one sent on an idle connection sends nothing, so
it is not counted), and the pool's pre-ping on checkout (an empty query, ``;``, sent
by the dialect below the engine's events). This is the gunicorn counter's method
(``bench.gunicorn_conf``) at SQLAlchemy's level.
"""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, SetWorkflowID

from .stack import recreate_postgres

PING = "; (pool pre-ping)"


@DBOS.step()
def effect(payment_id: str, amount_cents: int) -> str:
    """The side effect: nothing is called, as in the other paths; its downstream id is
    what DBOS records as the step's output."""
    return "re_" + payment_id.removeprefix("pay_")


@DBOS.workflow()
def one_effect(arguments: dict[str, Any]) -> str:
    return effect(**arguments)


@DBOS.workflow()
def effects(items: list[dict[str, Any]]) -> list[str]:
    return [effect(**arguments) for arguments in items]


class StatementCounter:
    """The round trips an engine makes for the thread that asks (see the module
    docstring), and, while ``log`` is a list, the statements themselves."""

    def __init__(self, engine: sa.Engine) -> None:
        self._local = threading.local()
        sa.event.listen(engine, "before_cursor_execute", self._before_execute)
        sa.event.listen(engine, "commit", self._end("COMMIT"))
        sa.event.listen(engine, "rollback", self._end("ROLLBACK"))
        dialect = engine.dialect
        ping = dialect.do_ping

        def do_ping(dbapi_connection: Any) -> bool:
            self._note(PING)
            return ping(dbapi_connection)

        dialect.do_ping = do_ping  # type: ignore[method-assign]

    @property
    def count(self) -> int:
        return getattr(self._local, "count", 0)

    @property
    def log(self) -> list[str] | None:
        return getattr(self._local, "log", None)

    @log.setter
    def log(self, value: list[str] | None) -> None:
        self._local.log = value

    def _note(self, statement: str) -> None:
        self._local.count = self.count + 1
        if self.log is not None:
            self.log.append(statement)

    @staticmethod
    def _idle(connection: sa.Connection) -> bool:
        raw = connection.connection.dbapi_connection
        return raw is None or raw.info.transaction_status.name == "IDLE"

    def _before_execute(
        self,
        connection: sa.Connection,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        raw = connection.connection.dbapi_connection
        if raw is not None and not raw.autocommit and self._idle(connection):
            self._note("BEGIN")
        self._note(" ".join(statement.split()))

    def _end(self, word: str) -> Any:
        def ended(connection: sa.Connection) -> None:
            if not self._idle(connection):
                self._note(word)

        return ended


class DbosPeer:
    """DBOS launched in this process on a fresh system database; close() shuts it
    down. One per process (DBOS is a process-wide singleton)."""

    def __init__(self, url: str) -> None:
        recreate_postgres(url)
        self.url = url
        DBOS(
            config={
                "name": "effectgate-bench",
                "system_database_url": url,
                "log_level": "WARNING",
            }
        )
        DBOS.launch()
        from dbos._dbos import _get_dbos_instance  # the engine DBOS made, to count on it

        self.counter = StatementCounter(_get_dbos_instance()._sys_db.engine)

    def close(self) -> None:
        DBOS.destroy()

    @property
    def statements(self) -> int:
        """Round trips this thread has made through DBOS so far."""
        return self.counter.count

    def one(self, key: str, arguments: dict[str, Any]) -> str:
        with SetWorkflowID(key):
            return one_effect(arguments)

    def batch(self, key: str, items: list[dict[str, Any]]) -> list[str]:
        with SetWorkflowID(key):
            return effects(items)

    def traced(self, key: str, arguments: dict[str, Any]) -> list[str]:
        """The statements of one effect, as the counter saw them."""
        self.counter.log = []
        try:
            self.one(key, arguments)
            return self.counter.log or []
        finally:
            self.counter.log = None
