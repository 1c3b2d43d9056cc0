"""A trigram index for the console's substring search (``operations.search``).

PostgreSQL only: it needs the ``pg_trgm`` extension (trusted since PostgreSQL 13, so the
database owner may create it). Other databases scan, and this migration does nothing
there. ``CREATE INDEX CONCURRENTLY`` would not block writes on a large ledger, but it
cannot run inside a transaction: run it by hand before migrating if the table is big
(the statement here is ``IF NOT EXISTS``, so the migration then only records itself).
"""

from django.db import migrations

# Frozen here, as migrations must be; operations.search.HAYSTACK_SQL is the same text,
# and a test checks that its query uses this index.
INDEX_NAME = "op_search_trgm"
CREATE_INDEX_SQL = (
    "CREATE INDEX IF NOT EXISTS op_search_trgm ON operations_operation USING gin (("
    "UPPER(id || E'\\n' || operation_key || E'\\n' || call_id || E'\\n' || downstream_id "
    "|| E'\\n' || principal || E'\\n' || idempotency_key || E'\\n' || (arguments)::text)"
    ") gin_trgm_ops)"
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    schema_editor.execute(CREATE_INDEX_SQL)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX_NAME}")


class Migration(migrations.Migration):
    dependencies = [("operations", "0009_edit_search_views")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
