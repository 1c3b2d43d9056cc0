"""The DBOS anchor's statement counter, on a real SQLAlchemy engine against the suite's
PostgreSQL server: what it counts is what reaches PostgreSQL, round trip by round trip.

If it missed psycopg's implicit ``BEGIN`` or the pool's pre-ping, or counted a
``ROLLBACK`` that sends nothing, or another thread's statements, the bench's
"statements per effect" for DBOS would lie. (The whole anchor, DBOS included, runs in
tests/bench/test_commands.py.)
"""

import threading

import pytest
import sqlalchemy as sa
from django.conf import settings

from bench.dbos_anchor import PING, StatementCounter
from tests.support.db import skip_unless_postgresql

pytestmark = skip_unless_postgresql("the counter is read on psycopg's PostgreSQL connections")


@pytest.fixture
def engine():
    """An engine as DBOS makes one (psycopg, a pool with pre-ping on checkout), on the
    server's ``postgres`` database, which the statements here only read."""
    db = settings.DATABASES["default"]
    url = sa.engine.URL.create(
        "postgresql+psycopg",
        username=db["USER"],
        password=db["PASSWORD"] or None,
        host=db["HOST"] or "127.0.0.1",
        port=int(db["PORT"] or 5432),
        database="postgres",
    )
    made = sa.create_engine(url, pool_size=2, max_overflow=0, pool_pre_ping=True)
    yield made
    made.dispose()


def test_it_counts_begin_commit_and_the_pre_ping_but_not_an_idle_rollback(engine):
    counter = StatementCounter(engine)
    with engine.connect() as conn:  # a fresh connection: the pool does not ping it
        conn.execute(sa.text("SELECT 0"))
        conn.commit()
    before = counter.count
    counter.log = []

    with engine.begin() as conn:
        conn.execute(sa.text("SELECT 1"))
        conn.execute(sa.text("SELECT 2"))
    with engine.connect() as conn:
        pass  # checked out and back: a ping, and the pool's ROLLBACK on an idle connection
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("SELECT 3"))

    assert counter.log == [
        PING,
        "BEGIN",
        "SELECT 1",
        "SELECT 2",
        "COMMIT",
        PING,
        PING,
        "SELECT 3",
    ]
    assert counter.count - before == 8


def test_a_rolled_back_transaction_counts_its_rollback(engine):
    counter = StatementCounter(engine)
    counter.log = []

    with engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
        conn.rollback()

    assert counter.log == ["BEGIN", "SELECT 1", "ROLLBACK"]


def test_each_thread_counts_only_its_own_statements(engine):
    counter = StatementCounter(engine)
    seen = {}

    def other() -> None:
        with engine.begin() as conn:
            for n in range(5):
                conn.execute(sa.text(f"SELECT {n}"))
        seen["other"] = counter.count

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    with engine.begin() as conn:
        conn.execute(sa.text("SELECT 1"))

    assert seen["other"] == 7  # BEGIN, five statements, COMMIT: a fresh connection
    assert counter.count == 4  # its connection again: a ping, BEGIN, SELECT 1, COMMIT
