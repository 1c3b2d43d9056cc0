"""Append-only audit tables, enforced by PostgreSQL (django-pgtrigger).

Events, approval decisions, reconciliation resolutions and their reviews are the record
of who did what; the application only ever inserts them. A row-level trigger on each
table refuses UPDATE and DELETE, so a bug, a careless admin action or an injected query
through the application's connection cannot rewrite history in place.

The triggers are registered here rather than in the models' ``Meta`` and installed by
pgtrigger after every ``migrate`` (``PGTRIGGER_INSTALL_ON_MIGRATE``), without migration
files (``PGTRIGGER_MIGRATIONS = False``). SQLite, the one-command local mode, has no such
triggers; there the hash chains (``python manage.py audit verify``) still reveal a
rewritten event. What neither covers, a database superuser who drops the trigger and
rewrites a whole chain, is why docs/security.md recommends exporting chain heads.
"""

import pgtrigger
from django.apps import apps

APPEND_ONLY_MODELS = (
    "operations.Event",
    "operations.Resolution",
    "operations.ResolutionReview",
    "approvals.Decision",
)
TRIGGER_NAME = "append_only"


def append_only_trigger() -> pgtrigger.Protect:
    return pgtrigger.Protect(
        name=TRIGGER_NAME,
        operation=pgtrigger.Update | pgtrigger.Delete,
    )


def trigger_uris() -> list[str]:
    """pgtrigger URIs of the append-only triggers, e.g. for ``pgtrigger.ignore`` in tests."""
    return [f"{label}:{TRIGGER_NAME}" for label in APPEND_ONLY_MODELS]


def register() -> None:
    """Register the triggers with pgtrigger (called once, from ``OperationsConfig.ready``)."""
    for label in APPEND_ONLY_MODELS:
        pgtrigger.register(append_only_trigger())(apps.get_model(label))
