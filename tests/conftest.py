"""Shared fixtures: runner accounts with tokens, an API client, tool contracts."""

import itertools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import connection
from rest_framework.test import APIClient

from operations import services
from operations.http.throttling import COUNTER_TABLE
from tests.support import runtime_role
from tests.support.audit_log import write_signing_key
from tests.support.collection import deselected_whole
from tests.support.fake_slack import FakeSlack

_counter = itertools.count(1)

REFUND_SCHEMA = {
    "type": "object",
    "required": ["payment_id", "amount_cents"],
    "properties": {
        "payment_id": {"type": "string"},
        "amount_cents": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": False,
}


# The display field of an amount in euro cents, as the demo's refunds declare it.
EUR_CENTS = {"label": "Amount", "format": "money", "currency": "EUR", "minor_units": True}


def next_operation_key() -> str:
    """An operation key no other registration of this test process has used."""
    return f"key-{next(_counter)}"


def contract(effect_class: str = "idempotent", **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "effect_class": effect_class,
        "input_schema": REFUND_SCHEMA,
        "retry": {
            "max_attempts": 3,
            "retryable_codes": ["rate_limited"],
            "base_delay_ms": 0,
            "max_delay_ms": 0,
        },
        "approval": {"mode": "never"},
    }
    body.update(overrides)
    return body


class Api:
    """A runner's view of the API: a DRF test client with its bearer token."""

    def __init__(self, runner, token: str) -> None:
        self.runner = runner
        self.token = token
        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    def get(self, path: str, params: dict[str, Any] | None = None, **kwargs):
        return self.client.get(path, params, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs):
        return self.client.post(path, body if body is not None else {}, format="json", **kwargs)

    def put(self, path: str, body: Any, **kwargs):
        return self.client.put(path, body, format="json", **kwargs)

    # Shortcuts for the common path; each asserts the status it expects.

    def tool(self, name: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.put(f"/api/v1/tools/{name}", body or contract())
        assert response.status_code in (200, 201), response.json()
        return response.json()

    def run(self, principal: str = "user:alice", **budgets: Any) -> str:
        response = self.post("/api/v1/runs", {"principal": principal, "budgets": budgets})
        assert response.status_code == 201, response.json()
        return response.json()["id"]

    def register(
        self,
        run: str,
        tool: str,
        arguments: dict[str, Any] | None = None,
        expect: int = 201,
        **extra: Any,
    ) -> dict[str, Any]:
        body = {
            "run": run,
            "tool": tool,
            "operation_key": extra.pop("operation_key", next_operation_key()),
            "arguments": arguments or {"payment_id": "pay_1", "amount_cents": 500},
            **extra,
        }
        response = self.post("/api/v1/operations", body)
        assert response.status_code == expect, response.json()
        return response.json()

    def claim(self, op_id: str, expect: int = 201, **body: Any) -> dict[str, Any]:
        response = self.post(f"/api/v1/operations/{op_id}/attempts", body)
        assert response.status_code == expect, response.json()
        return response.json()

    def outcome(self, op_id: str, attempt: int, body: dict[str, Any], expect: int = 200):
        response = self.post(f"/api/v1/operations/{op_id}/attempts/{attempt}/outcome", body)
        assert response.status_code == expect, response.json()
        return response.json()

    def operation(self, op_id: str) -> dict[str, Any]:
        response = self.get(f"/api/v1/operations/{op_id}")
        assert response.status_code == 200, response.json()
        return response.json()


def make_runner(name: str | None = None, owner=None) -> Api:
    runner, token = services.runner_create(
        name=name or f"runner-{next(_counter)}", owner=owner, actor=services.Actor.system("test")
    )
    return Api(runner, token)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A module whose ``pytestmark`` the ``-m`` expression never selects is not imported
    (tests/support/collection.py): ``make check`` does not pay for what it deselects."""
    if deselected_whole(
        collection_path,
        expression=config.option.markexpr,
        patterns=config.getini("python_files"),
    ):
        return True
    return None


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker) -> Iterator[None]:
    """pytest-django's test database; with ``EFFECTGATE_TEST_RUNTIME_ROLE=1`` (CI), the
    application then runs on it as the runtime role (tests/support/runtime_role.py)."""
    from django.db import connection

    if not runtime_role.ENABLED or connection.vendor != "postgresql":
        yield
        return
    with django_db_blocker.unblock():
        runtime_role.enter()
    try:
        yield
    finally:
        with django_db_blocker.unblock():
            runtime_role.leave()


@pytest.fixture
def api(db) -> Api:
    return make_runner()


@pytest.fixture
def other_api(db) -> Api:
    return make_runner()


@pytest.fixture
def audit_key(settings, tmp_path):
    """An Ed25519 signing key for the transparency log, in a file the settings name
    (AUDIT_SIGNING_KEY_FILE); yields the private key."""
    path, key = write_signing_key(tmp_path)
    settings.AUDIT_SIGNING_KEY_FILE = str(path)
    settings.AUDIT_SIGNING_KEY = ""
    return key


@pytest.fixture
def fake_slack() -> Iterator[FakeSlack]:
    """Slack on loopback (tests/support/fake_slack.py); ``fake_slack.settings()`` points
    Effectgate at it."""
    with FakeSlack() as fake:
        yield fake


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    # The production hasher is slow on purpose; the suite creates many people. Tests of
    # the hasher itself would set their own.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _static_without_manifest(settings):
    # Production serves hashed, collected files; the suite renders templates without
    # running collectstatic first.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


# The Redis the Celery tests use too (CI starts it); each test keeps to its own prefix.
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
DATABASE_CACHE = {
    "BACKEND": "operations.http.throttling.DatabaseCache",
    "LOCATION": "effectgate_cache",
}


@pytest.fixture
def redis_cache(settings) -> Iterator[str]:
    """The shared cache on Redis, as production has it; yields this test's key prefix.
    Only this test's keys are deleted afterwards: other runs may share the Redis."""
    prefix = f"eg-test-{uuid.uuid4().hex[:12]}"
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": prefix,
        }
    }
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    try:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
    finally:
        client.close()


@pytest.fixture
def database_cache(settings) -> None:
    """The shared cache in the database, as without Redis (whatever the environment)."""
    settings.CACHES = {"default": DATABASE_CACHE}


def throttle_count(key: str) -> int | None:
    """A throttle's window counter on the database cache (``throttling.COUNTER_TABLE``)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count FROM {COUNTER_TABLE} WHERE key = %s", [key])  # noqa: S608
        row = cursor.fetchone()
    return None if row is None else row[0]
