"""Fixtures of the operations tests."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.support.lookup_server import LookupServer


@pytest.fixture
def lookup_server(settings):
    server = LookupServer()
    settings.RECONCILE_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.RECONCILE_PROBE_TIMEOUT_S = 0.5
    settings.RECONCILE_FIRST_PROBE_DELAY_S = 0
    yield server
    server.close()


def migrate_to(targets) -> None:
    """Migrate the test database to ``targets`` (migration tests; they are transactional)."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
