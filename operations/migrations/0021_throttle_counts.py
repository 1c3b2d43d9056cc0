"""The request throttle's window counters, when the shared cache is the database
(operations/http/throttling.py, ``DatabaseCache.window_count``).

One row per identity and fixed window (``throttle:runner:<token>:<window number>``),
incremented by one ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``; ``expires`` (Unix
seconds) only says when the row may be deleted, as the key already names its window.

On PostgreSQL the table is UNLOGGED: its writes skip the WAL, which a counter does not
need. After a crash PostgreSQL empties it, and a standby holds none of its rows: after a
crash or a failover the current windows' counts start again from zero, so each of those
windows may admit up to its rate once more. SQLite (the local mode) has no such tables.

The table has no model: nothing but the throttle reads it, and Django's ``flush`` (run
between transactional tests) leaves it alone, as it leaves the cache's table. The
runtime role gets SELECT, INSERT, UPDATE and DELETE on it like on every ordinary table
(operations/dbroles.py).
"""

from django.db import migrations

POSTGRESQL = """
CREATE UNLOGGED TABLE operations_throttle_count (
    key text PRIMARY KEY,
    count bigint NOT NULL,
    expires bigint NOT NULL
);
CREATE INDEX operations_throttle_count_expires ON operations_throttle_count (expires);
"""

SQLITE = (
    "CREATE TABLE operations_throttle_count ("
    "key text PRIMARY KEY, count integer NOT NULL, expires integer NOT NULL)",
    "CREATE INDEX operations_throttle_count_expires ON operations_throttle_count (expires)",
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRESQL, params=None)
    else:
        for statement in SQLITE:
            schema_editor.execute(statement)


def drop(apps, schema_editor):
    schema_editor.execute("DROP TABLE operations_throttle_count")


class Migration(migrations.Migration):
    dependencies = [("operations", "0020_event_mac")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
