"""The token generation: a one-row table that changes whenever a cached token could lie.

Each process remembers authenticated tokens for a few seconds (operations/tokencache.py)
and trusts what it remembers only while this row holds the value it held when the token
was read. Triggers set the row, in the same transaction, on every change that could make
a remembered token wrong: an update of a token other than its ``last_used_at`` (revoked,
scopes, expiry), an update of a runner (deactivated, owner, tool restriction), and a
delete or truncate of either table. Triggers rather than calls in the services, so that
no way of writing those tables (the admin, a shell, a data migration, SQL typed during an
incident) can leave a revoked token served from a cache.

The new value is the bumping transaction's id (``pg_current_xact_id()``, 64 bits, never
reused), not a counter: a value never comes back, even if someone empties the table, so
an old cache entry can never match again.

PostgreSQL only, like the append-only triggers: on SQLite (the local mode) the cache is
off and every request reads its token from the database. The table has no model, so
Django's ``flush`` (run between transactional tests) leaves it alone.
"""

from django.db import migrations

CREATE = """
CREATE TABLE operations_token_generation (
    id smallint PRIMARY KEY CHECK (id = 1),
    value bigint NOT NULL
);
INSERT INTO operations_token_generation (id, value) VALUES (1, 0);

CREATE FUNCTION operations_token_generation_bump() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO operations_token_generation (id, value)
    VALUES (1, pg_current_xact_id()::text::bigint)
    ON CONFLICT (id) DO UPDATE SET value = EXCLUDED.value;
    RETURN NULL;
END;
$$;

-- Recording a token's use is not a change anyone caches against; everything else is,
-- columns added later included.
CREATE TRIGGER operations_runnertoken_generation
AFTER UPDATE ON operations_runnertoken FOR EACH ROW
WHEN ((to_jsonb(OLD) - 'last_used_at') IS DISTINCT FROM (to_jsonb(NEW) - 'last_used_at'))
EXECUTE FUNCTION operations_token_generation_bump();

CREATE TRIGGER operations_runnertoken_generation_gone
AFTER DELETE OR TRUNCATE ON operations_runnertoken FOR EACH STATEMENT
EXECUTE FUNCTION operations_token_generation_bump();

CREATE TRIGGER operations_runner_generation
AFTER UPDATE ON operations_runner FOR EACH ROW
WHEN (OLD.* IS DISTINCT FROM NEW.*)
EXECUTE FUNCTION operations_token_generation_bump();

CREATE TRIGGER operations_runner_generation_gone
AFTER DELETE OR TRUNCATE ON operations_runner FOR EACH STATEMENT
EXECUTE FUNCTION operations_token_generation_bump();
"""

DROP = """
DROP TRIGGER operations_runner_generation_gone ON operations_runner;
DROP TRIGGER operations_runner_generation ON operations_runner;
DROP TRIGGER operations_runnertoken_generation_gone ON operations_runnertoken;
DROP TRIGGER operations_runnertoken_generation ON operations_runnertoken;
DROP FUNCTION operations_token_generation_bump();
DROP TABLE operations_token_generation;
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("operations", "0004_tool_owner")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
