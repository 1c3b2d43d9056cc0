"""Which database the suite runs on, for tests that only mean something on PostgreSQL."""

import os

import pytest
from django.conf import settings

ON_POSTGRESQL = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def skip_unless_postgresql(why: str) -> pytest.MarkDecorator:
    """Skip unless the suite runs on PostgreSQL (CI does), saying why not elsewhere."""
    return pytest.mark.skipif(not ON_POSTGRESQL, reason=why)


# The database DATABASE_URL names, read when the suite is collected: pytest-django renames
# settings' NAME to the test database's when a test first needs one.
CONFIGURED_NAME = settings.DATABASES["default"]["NAME"]


def own_database_name(kind: str) -> str:
    """The name of a database a test makes for itself (``bench.stack.fresh_database``).

    On PostgreSQL it names the database ``DATABASE_URL`` names and the xdist worker, as
    pytest-django's test databases do, so that neither two workers nor two checkouts
    sharing a server drop each other's; on SQLite the file is under this checkout's
    var/bench/, by ``kind``.
    """
    if not ON_POSTGRESQL:
        return f"effectgate_{kind}"
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return "_".join(part for part in ("test", CONFIGURED_NAME, worker, kind) if part)[:63]
