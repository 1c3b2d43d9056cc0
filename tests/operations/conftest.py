"""Fixtures of the operations tests."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from operations.dbroles import as_owner, roles_apply, runtime_role
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
    """Migrate the test database to ``targets`` (migration tests; they are transactional),
    as the owner, then give the runtime role its privileges on the tables as they are
    now, as ``migrate`` does (the suite's runtime-role mode; otherwise both are no-ops)."""
    runtime = runtime_role()
    with as_owner():
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(targets)
        if runtime is not None:
            roles_apply(runtime=runtime)
