"""A gunicorn configuration for ``make bench``: count the SQL every request sends.

Loaded with ``gunicorn -c python:bench.gunicorn_conf`` by ``bench.stack.Stack`` when
asked; the application's code is untouched. After each worker has loaded the Django
application (``post_worker_init``) it

1. connects to ``connection_created``, so that every database connection a worker
   thread opens records, for the request running on that thread, each statement sent
   through a cursor of its psycopg connection (its ``cursor_factory`` becomes a
   counting subclass: Django's cursors, and also what bypasses them, such as the
   connection health check's ``SELECT 1``), the ``BEGIN`` psycopg sends when an atomic
   block turns autocommit off, and each ``COMMIT`` and ``ROLLBACK``;
2. wraps the WSGI application, so that each response carries the number of statements
   its request sent (``X-Bench-Statements``) and the CPU time its thread spent in the
   Django application until the response began (``X-Bench-App-Cpu-Us``: no HTTP
   parsing or writing, which gunicorn does around it) and, when the request names a trace
   (``X-Bench-Trace: <name>``), the statements themselves go to
   ``$EFFECTGATE_BENCH_TRACE_DIR/<name>.json``.

Each statement is one round trip to PostgreSQL; ``executemany`` counts as one. The
cost is a list append per statement, next to milliseconds per request. Server-side
(named) cursors, which Django creates only for ``.iterator()``, are not counted.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

STATEMENTS_HEADER = "X-Bench-Statements"
CPU_HEADER = "X-Bench-App-Cpu-Us"
TRACE_HEADER = "X-Bench-Trace"
TRACE_DIR_ENV = "EFFECTGATE_BENCH_TRACE_DIR"
TRACE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,80}$")

_current = threading.local()


def record(statement: str) -> None:
    """Note ``statement`` for the request running on this thread, if any."""
    log = getattr(_current, "log", None)
    if log is not None:
        log.append(statement)


def _text(query: Any) -> str:
    if isinstance(query, bytes):
        return query.decode()
    if isinstance(query, str):
        return query
    return repr(query)  # a psycopg.sql.Composed: its parts, readable enough


_counting: dict[type, type] = {}


def counting_cursor(base: type) -> type:
    """A subclass of the psycopg cursor class ``base`` that records what it executes."""
    if base not in _counting:

        def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            record(_text(query))
            return base.execute(self, query, *args, **kwargs)

        def executemany(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            record(_text(query))
            return base.executemany(self, query, *args, **kwargs)

        _counting[base] = type(
            f"Counting{base.__name__}", (base,), {"execute": execute, "executemany": executemany}
        )
    return _counting[base]


def instrument(connection: Any) -> None:
    """Record what ``connection`` (a Django ``DatabaseWrapper`` that just connected)
    sends. A wrapper that reconnects sends ``connection_created`` again: its new psycopg
    connection is instrumented, its own methods only once."""
    raw = connection.connection
    if raw.cursor_factory not in _counting.values():
        raw.cursor_factory = counting_cursor(raw.cursor_factory)
    if getattr(connection, "_bench_counted", False):
        return
    connection._bench_counted = True
    set_autocommit, commit, rollback = (
        connection._set_autocommit,
        connection._commit,
        connection._rollback,
    )

    def _set_autocommit(autocommit: bool) -> Any:
        if not autocommit:
            # psycopg sends BEGIN before the next statement.
            record("BEGIN")
        return set_autocommit(autocommit)

    def _commit() -> Any:
        record("COMMIT")
        return commit()

    def _rollback() -> Any:
        record("ROLLBACK")
        return rollback()

    connection._set_autocommit = _set_autocommit
    connection._commit = _commit
    connection._rollback = _rollback


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    instrument(connection)


def trace_path(directory: str | None, name: str | None) -> Path | None:
    """Where a request's trace goes: only a plain name, inside the configured folder."""
    if not directory or not name or not TRACE_NAME.match(name):
        return None
    return Path(directory) / f"{name}.json"


class CountingApp:
    """A WSGI application that runs ``app`` and reports the statements it sent."""

    def __init__(self, app: Callable, trace_dir: str | None = None) -> None:
        self.app = app
        self.trace_dir = trace_dir

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        log: list[str] = []
        _current.log = log
        started = time.thread_time_ns()

        def counted_start_response(status: str, headers: list, exc_info: Any = None) -> Any:
            cpu_us = (time.thread_time_ns() - started) // 1000
            headers = [*headers, (STATEMENTS_HEADER, str(len(log))), (CPU_HEADER, str(cpu_us))]
            path = trace_path(self.trace_dir, environ.get("HTTP_X_BENCH_TRACE"))
            if path is not None:
                path.write_text(json.dumps(log, indent=1) + "\n")
            return start_response(status, headers, exc_info)

        try:
            return self.app(environ, counted_start_response)
        finally:
            _current.log = None


def post_worker_init(worker: Any) -> None:
    from django.db.backends.signals import connection_created

    connection_created.connect(_on_connection_created, weak=False)
    worker.wsgi = CountingApp(worker.wsgi, os.environ.get(TRACE_DIR_ENV))
