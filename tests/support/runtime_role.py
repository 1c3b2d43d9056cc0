"""The suite with the application on the runtime role (``EFFECTGATE_TEST_RUNTIME_ROLE=1``,
set by ``.ci/run``).

pytest-django creates and migrates each test database as ``DATABASE_URL``'s user (the
owner: CI's is ``postgres``). Then, once per test process:

1. the runtime role is created if the server lacks it (``EFFECTGATE_TEST_RUNTIME_USER``,
   default ``effectgate_test_runtime``; one per server, shared by every worker), and
   given its privileges on this test database by ``dbroles.roles_apply``, exactly as
   ``effectgate db roles --apply`` gives them in production;
2. the ``default`` connection keeps the owner's login but takes the runtime role when it
   connects (libpq's ``options="-c role=..."``, which the pool's connections get too;
   Django's ``assume_role`` would have the pool wait for itself), so every statement
   the application sends is checked against the runtime role's privileges;
3. ``DATABASE_OWNER`` names the owner's login on the test database, so whatever runs as
   the owner in production does here too, through ``dbroles.as_owner``: ``flush``
   between transactional tests (the runtime role may not TRUNCATE), ``migrate`` and
   the migration tests, ``archive``, and the tests that play a forger holding the
   owner's rights. Inside a test's transaction ``as_owner`` drops the assumed role for
   its block (a new login would not see the transaction's rows).

Subprocesses (workers, servers) get the same two URLs (``database_env``). At the end
the connection goes back to the owner, which drops the test database.
"""

import os
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection

from operations.dbroles import assumed_role, roles_apply

ENABLED = os.environ.get("EFFECTGATE_TEST_RUNTIME_ROLE", "").strip().lower() in {"1", "true", "yes"}
ROLE = os.environ.get("EFFECTGATE_TEST_RUNTIME_USER", "").strip() or "effectgate_test_runtime"


# The connection's own libpq options before ``enter``, given back by ``leave``.
_saved: dict[str, Any] = {}


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _role_create(role: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
        if cursor.fetchone():
            return
        try:
            # No login: the suite reaches it by SET ROLE only.
            cursor.execute(f"CREATE ROLE {_ident(role)} NOLOGIN")
        except DatabaseError:
            # Another worker created it first (roles belong to the server).
            cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role])
            if not cursor.fetchone():
                raise


def _reconnect() -> None:
    connection.close()
    if connection.pool:
        connection.close_pool()


def enter() -> None:
    """From here on the application runs as the runtime role (the module's steps)."""
    _role_create(ROLE)
    roles_apply(runtime=ROLE)
    current = connection.settings_dict
    owner_options = {key: value for key, value in current["OPTIONS"].items() if key != "pool"}
    settings.DATABASE_OWNER = {**current, "OPTIONS": owner_options, "CONN_MAX_AGE": 0}
    _reconnect()
    _saved["options"] = current["OPTIONS"].get("options")
    current["OPTIONS"]["options"] = f"{_saved['options'] or ''} -c role={ROLE}".strip()


def leave() -> None:
    options = connection.settings_dict["OPTIONS"]
    if _saved.get("options") is None:
        options.pop("options", None)
    else:
        options["options"] = _saved["options"]
    settings.DATABASE_OWNER = None
    _reconnect()


def _url(db: dict[str, Any], *, role: str | None) -> str:
    auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    query = f"?options=-c%20role%3D{role}" if role else ""
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}{query}"


def database_env() -> dict[str, str]:
    """``DATABASE_URL`` of the test database for a subprocess, and in this mode
    ``DATABASE_OWNER_URL``: the subprocess's application runs as the runtime role too."""
    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        return {"DATABASE_URL": f"sqlite:///{db['NAME']}"}
    role = assumed_role(db["OPTIONS"])
    env = {"DATABASE_URL": _url(db, role=role)}
    if role:
        env["DATABASE_OWNER_URL"] = _url(db, role=None)
    return env
