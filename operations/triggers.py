"""Append-only audit tables, enforced by PostgreSQL (django-pgtrigger).

Events, approval decisions, standing grants' signatures, reconciliation resolutions and
their reviews are the record of who did what, and the transparency log's leaves, subtree
hashes and checkpoints what was signed of it; the application only ever inserts them. A
row-level trigger on each table refuses UPDATE and DELETE, so a bug, a careless admin
action or an injected query through the application's connection cannot rewrite history
in place. A statement-level trigger refuses TRUNCATE, which fires no row-level trigger
and would empty a table in one statement (``TRUNCATE operations_operation CASCADE``
reaches the events too, and is refused with them).

The triggers are registered here rather than in the models' ``Meta`` and installed by
pgtrigger after every ``migrate`` (``PGTRIGGER_INSTALL_ON_MIGRATE``), without migration
files (``PGTRIGGER_MIGRATIONS = False``). SQLite, the one-command local mode, has no such
triggers; there the hash chains (``python manage.py audit verify``) still reveal a
rewritten event. What neither covers, a database superuser who drops the trigger and
rewrites a whole chain, is why docs/security.md recommends anchoring the chains
elsewhere (``python manage.py audit anchor``).

Django's ``flush`` (the test runner empties the database with it between transactional
tests) truncates every table; ``operations/management/commands/flush.py`` runs it with
the TRUNCATE triggers ignored (``ignored``).
"""

import contextlib
from collections.abc import Iterator

import pgtrigger
from django.apps import apps
from django.db import DEFAULT_DB_ALIAS, connections

APPEND_ONLY_MODELS = (
    "operations.Event",
    "operations.Resolution",
    "operations.ResolutionReview",
    "approvals.Decision",
    "approvals.StandingGrantSignature",
    # The transparency log (docs/security.md): its leaves, subtree hashes and checkpoints.
    "operations.LogLeaf",
    "operations.LogNode",
    "operations.Checkpoint",
)
TRIGGER_NAME = "append_only"
TRUNCATE_TRIGGER_NAME = "no_truncate"


def append_only_trigger() -> pgtrigger.Protect:
    return pgtrigger.Protect(
        name=TRIGGER_NAME,
        operation=pgtrigger.Update | pgtrigger.Delete,
    )


def no_truncate_trigger() -> pgtrigger.Trigger:
    # pgtrigger.Protect cannot express this: at statement level it needs transition
    # tables, which TRUNCATE has none of. A BEFORE ... FOR EACH STATEMENT trigger that
    # raises stops the statement before any table is emptied.
    return pgtrigger.Trigger(
        name=TRUNCATE_TRIGGER_NAME,
        level=pgtrigger.Statement,
        when=pgtrigger.Before,
        operation=pgtrigger.Truncate,
        func="RAISE EXCEPTION 'pgtrigger: Cannot truncate % table (an append-only audit "
        "table)', TG_TABLE_NAME; RETURN NULL;",
    )


def trigger_uris() -> list[str]:
    """pgtrigger URIs of the append-only triggers, e.g. for ``pgtrigger.ignore`` in tests."""
    return [f"{label}:{TRIGGER_NAME}" for label in APPEND_ONLY_MODELS]


def truncate_trigger_uris() -> list[str]:
    """pgtrigger URIs of the TRUNCATE triggers (``flush`` ignores them)."""
    return [f"{label}:{TRUNCATE_TRIGGER_NAME}" for label in APPEND_ONLY_MODELS]


def register() -> None:
    """Register the triggers with pgtrigger (called once, from ``OperationsConfig.ready``)."""
    for label in APPEND_ONLY_MODELS:
        model = apps.get_model(label)
        pgtrigger.register(append_only_trigger())(model)
        pgtrigger.register(no_truncate_trigger())(model)


@contextlib.contextmanager
def ignored(*uris: str, database: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """The triggers ``uris`` names do nothing on this connection until the block ends.

    What ``pgtrigger.ignore`` does, set once for the session instead of before every
    statement: pgtrigger prefixes each statement with a ``set_config``, two commands
    in one, which PostgreSQL refuses with server-side parameter binding (a prepared
    statement holds one command). The triggers read the same setting. Reset at the end,
    so a pooled connection goes back without it.
    """
    connection = connections[database]
    if connection.vendor != "postgresql":
        yield
        return
    names = set()
    for model, trigger in pgtrigger.registered(*uris):
        pgid = trigger.get_pgid(model)
        names |= {pgid, f"{model._meta.db_table}:{pgid}"}
    with connection.cursor() as cursor:
        value = "{" + ",".join(sorted(names)) + "}"
        cursor.execute("SELECT set_config('pgtrigger.ignore', %s, false)", [value])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('pgtrigger.ignore', '{}', false)")
