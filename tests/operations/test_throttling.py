"""Request throttling per runner token (operations/http/throttling.py; api.md, Rate limits).

The count lives in the shared cache; the tests run each behaviour on the database cache
(the default without Redis) and on Redis (production's), and freeze the throttle's
clock half-way through a minute so that no window ends during a test.
"""

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from django.conf import settings as django_settings
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from operations import services
from operations.http import throttling
from operations.http.throttling import (
    CACHE_TABLE,
    COUNTER_TABLE,
    DatabaseCache,
    WindowRateThrottle,
    redis_window_count,
)
from operations.models import Attempt, Event, Operation, Run, RunnerToken
from tests.conftest import REDIS_URL, make_runner, throttle_count
from tests.support.net import free_port
from tests.support.runtime_role import database_env

REPO = Path(__file__).resolve().parents[2]
MINUTE = 1_800_000_000  # a multiple of 60: the start of a minute window
POSTGRES = connection.vendor == "postgresql"


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    """The throttle's clock, half-way through a minute; move it with ``clock[0] += s``."""
    now = [MINUTE + 30.0]
    monkeypatch.setattr(WindowRateThrottle, "timer", staticmethod(lambda: now[0]))
    return now


@pytest.fixture(params=["database", "redis"])
def shared_cache(request) -> str:
    request.getfixturevalue(f"{request.param}_cache")
    return request.param


def _problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert (body["status"], body["code"]) == (status, code)
    assert body["type"].endswith(f"/problems/{code}")
    return body


def test_a_burst_over_the_rate_answers_a_429_problem_with_retry_after(
    api, settings, clock, shared_cache
):
    settings.THROTTLE_RUNNER_RATE = "3/min"
    for index in range(3):
        created = api.post("/api/v1/runs", {"principal": "user:alice", "external_id": f"r{index}"})
        assert created.status_code == 201, created.json()
    refused = api.post("/api/v1/runs", {"principal": "user:alice", "external_id": "fourth"})
    body = _problem(refused, 429, "rate_limited")
    # The rest of the minute: 30 s, in the body and in the header.
    assert body["retry_after_ms"] == 30_000
    assert refused["Retry-After"] == "30"
    assert "try again in 30 s" in body["detail"]
    # Refused before the view: nothing was written, and reads are refused alike.
    assert list(Run.objects.filter(runner=api.runner).values_list("external_id", flat=True)) == [
        "r0",
        "r1",
        "r2",
    ]
    _problem(api.get("/api/v1/tools"), 429, "rate_limited")


def test_the_hot_paths_register_and_outcome_are_throttled_and_write_nothing(
    api, settings, clock, shared_cache
):
    """Registration with an inline claim and the outcome (the lean path) are DRF views
    like every other: the same count refuses them before the service runs."""
    settings.THROTTLE_RUNNER_RATE = "3/min"
    api.tool("t")
    run = api.run()
    op = api.register(run, "t", claim={"lease_s": 30})
    assert op["status"] == "executing"
    events = Event.objects.filter(stream=op["id"]).count()

    second = api.post(
        "/api/v1/operations",
        {
            "run": run,
            "tool": "t",
            "operation_key": "second",
            "arguments": {"payment_id": "pay_2", "amount_cents": 5},
            "claim": {"lease_s": 30},
        },
    )
    _problem(second, 429, "rate_limited")
    outcome = api.post(f"/api/v1/operations/{op['id']}/attempts/1/outcome", {"kind": "succeeded"})
    _problem(outcome, 429, "rate_limited")

    assert list(Operation.objects.filter(run_id=run).values_list("id", flat=True)) == [op["id"]]
    assert Operation.objects.get(pk=op["id"]).status == "executing"
    assert Attempt.objects.get(operation_id=op["id"]).status == "executing"
    assert Event.objects.filter(stream=op["id"]).count() == events
    assert Run.objects.get(pk=run).tool_calls == 1


def test_each_token_has_its_own_count(api, other_api, settings, clock, shared_cache):
    settings.THROTTLE_RUNNER_RATE = "1/min"
    second_token = services.token_create(runner=api.runner, actor=services.Actor.system("test"))
    assert api.get("/api/v1/tools").status_code == 200
    _problem(api.get("/api/v1/tools"), 429, "rate_limited")
    assert other_api.get("/api/v1/tools").status_code == 200
    same_runner = APIClient()
    same_runner.credentials(HTTP_AUTHORIZATION=f"Bearer {second_token}")
    assert same_runner.get("/api/v1/tools").status_code == 200


def test_the_count_starts_again_when_the_period_ends(api, settings, clock, shared_cache):
    settings.THROTTLE_RUNNER_RATE = "2/min"
    assert [api.get("/api/v1/tools").status_code for _ in range(3)] == [200, 200, 429]
    clock[0] += 29.5
    assert _problem(api.get("/api/v1/tools"), 429, "rate_limited")["retry_after_ms"] == 1000
    clock[0] += 0.5  # the next minute
    assert [api.get("/api/v1/tools").status_code for _ in range(3)] == [200, 200, 429]


def test_the_rate_is_read_from_the_settings_at_each_request(api, settings, clock, database_cache):
    settings.THROTTLE_RUNNER_RATE = "1/min"
    assert [api.get("/api/v1/tools").status_code for _ in range(2)] == [200, 429]
    settings.THROTTLE_RUNNER_RATE = "5/min"
    assert [api.get("/api/v1/tools").status_code for _ in range(4)] == [200, 200, 200, 429]
    settings.THROTTLE_RUNNER_RATE = ""  # off
    assert {api.get("/api/v1/tools").status_code for _ in range(5)} == {200}


def test_a_cache_that_does_not_answer_lets_requests_through_and_says_so(api, settings, caplog):
    settings.THROTTLE_RUNNER_RATE = "1/min"
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens there
            "OPTIONS": {"socket_connect_timeout": 0.5, "socket_timeout": 0.5},
        }
    }
    assert [api.get("/api/v1/tools").status_code for _ in range(2)] == [200, 200]
    assert "request throttling skipped: the cache did not answer" in caplog.text


def _throttle_statements(queries: CaptureQueriesContext) -> list[str]:
    return [query["sql"] for query in queries.captured_queries if COUNTER_TABLE in query["sql"]]


def test_on_the_database_cache_a_count_is_one_statement(api, settings, clock, database_cache):
    """One upsert per request, the window's first request too, and nothing of the
    throttle in Django's cache table."""
    settings.THROTTLE_RUNNER_RATE = "3/min"
    token = RunnerToken.objects.get(runner=api.runner)
    assert api.get("/api/v1/tools").status_code == 200  # also deletes old counters (below)
    for expected in (200, 200, 429):
        with CaptureQueriesContext(connection) as queries:
            assert api.get("/api/v1/tools").status_code == expected
        [statement] = _throttle_statements(queries)
        assert statement.startswith(f"INSERT INTO {COUNTER_TABLE} (key, count, expires)")
        assert "ON CONFLICT (key) DO UPDATE" in statement
        assert not any(CACHE_TABLE in query["sql"] for query in queries.captured_queries)
    assert throttle_count(f"throttle:runner:{token.pk}:{MINUTE // 60}") == 4
    clock[0] += 30  # the next window: its row is created by the same statement
    with CaptureQueriesContext(connection) as queries:
        assert api.get("/api/v1/tools").status_code == 200
    assert len(_throttle_statements(queries)) == 1
    assert throttle_count(f"throttle:runner:{token.pk}:{MINUTE // 60 + 1}") == 1


def _counters(*prefixes: str) -> dict[str, int]:
    """The counters' rows whose keys start with one of ``prefixes``, and their expiry
    (other tests' committed rows may be there too)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT key, expires FROM {COUNTER_TABLE}")  # noqa: S608
        return {key: expires for key, expires in cursor.fetchall() if key.startswith(prefixes)}


def test_counters_of_windows_past_are_deleted_once_a_minute(api, settings, clock, database_cache):
    """A row outlives its window by one period; each cache instance deletes the rows
    past that once every SWEEP_EVERY_S, on its first count after it, and no other count
    sends more than its one statement."""
    settings.THROTTLE_RUNNER_RATE = "100/min"
    token = RunnerToken.objects.get(runner=api.runner)
    window = MINUTE // 60
    key = f"throttle:runner:{token.pk}"
    old = f"throttle:test-sweep:{token.pk}"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {COUNTER_TABLE} (key, count, expires) VALUES (%s, 7, %s), (%s, 7, %s)",  # noqa: S608
            [f"{old}:1", MINUTE, f"{old}:2", MINUTE + 31],
        )

    def count() -> int:
        """The request's statements on the counters' table."""
        with CaptureQueriesContext(connection) as queries:
            assert api.get("/api/v1/tools").status_code == 200
        return len(_throttle_statements(queries))

    assert count() == 2  # this cache's first count: the upsert and the deletion
    assert _counters(key, old) == {f"{old}:2": MINUTE + 31, f"{key}:{window}": MINUTE + 120}
    clock[0] += 30  # MINUTE + 60: a new window, 30 s after the deletion
    assert count() == 1
    clock[0] += 29.5
    assert count() == 1
    assert set(_counters(key, old)) == {f"{old}:2", f"{key}:{window}", f"{key}:{window + 1}"}
    clock[0] += 0.5  # MINUTE + 90: a minute after the last deletion
    assert count() == 2
    assert set(_counters(key, old)) == {f"{key}:{window}", f"{key}:{window + 1}"}
    clock[0] += 30  # MINUTE + 120: the first window's row expires now
    assert count() == 1
    clock[0] += 30
    assert count() == 2
    assert set(_counters(key, old)) == {f"{key}:{window + 1}", f"{key}:{window + 2}"}


@pytest.mark.skipif(not POSTGRES, reason="UNLOGGED is PostgreSQL's")
def test_on_postgresql_the_counters_table_is_unlogged(db):
    with connection.cursor() as cursor:
        cursor.execute("SELECT relpersistence FROM pg_class WHERE relname = %s", [COUNTER_TABLE])
        assert cursor.fetchall() == [("u",)]


@pytest.mark.django_db(transaction=True)
def test_a_counters_table_that_fails_lets_requests_through_and_says_so(
    api, settings, caplog, monkeypatch, database_cache
):
    settings.THROTTLE_RUNNER_RATE = "1/min"
    monkeypatch.setattr(
        throttling, "COUNT_SQL", throttling.COUNT_SQL.replace(COUNTER_TABLE, "no_such_table")
    )
    assert [api.get("/api/v1/tools").status_code for _ in range(2)] == [200, 200]
    assert "request throttling skipped: the cache did not answer" in caplog.text


def _settings_in_a_process(**env: str) -> subprocess.CompletedProcess:
    """console/settings.py as a fresh process reads it from ``env``."""
    base = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("THROTTLE_") and key not in ("CACHE_URL", "CELERY_BROKER_URL")
    }
    code = (
        "import json; from django.conf import settings; cache = settings.CACHES['default']; "
        "print(json.dumps([settings.THROTTLE_RUNNER_RATE, settings.THROTTLE_SESSION_RATE, "
        "cache['BACKEND'], cache['LOCATION']]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**base, "DJANGO_SETTINGS_MODULE": "console.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_rates_and_the_cache_are_read_from_the_environment():
    def read(**env: str) -> list[str]:
        done = _settings_in_a_process(**env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    database = "operations.http.throttling.DatabaseCache"
    redis = "django.core.cache.backends.redis.RedisCache"
    assert read() == ["60000/min", "600/min", database, "effectgate_cache"]
    assert read(
        THROTTLE_RUNNER_RATE="5/s",
        THROTTLE_SESSION_RATE="off",
        CELERY_BROKER_URL="redis://broker.internal:6379/2",
    ) == ["5/s", "", redis, "redis://broker.internal:6379/2"]
    # CACHE_URL wins; a broker that is not Redis is no cache.
    assert read(CACHE_URL="redis://cache.internal/3", CELERY_BROKER_URL="amqp://mq//")[2:] == [
        redis,
        "redis://cache.internal/3",
    ]
    assert read(CELERY_BROKER_URL="amqp://mq//")[2] == database

    refused = _settings_in_a_process(THROTTLE_RUNNER_RATE="lots")
    assert refused.returncode != 0
    assert "THROTTLE_RUNNER_RATE: 'lots' is not a rate such as 600/min, or off" in refused.stderr


def _count_at_once(count, *, threads: int, each: int) -> list[int]:
    """``count()`` called ``each`` times by each of ``threads`` threads started at once,
    each closing its database connection at the end; every value returned, sorted.
    Raises what a thread met."""
    seen: list[list[int]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run(index: int) -> None:
        try:
            start.wait()
            for _ in range(each):
                seen[index].append(count())
        except BaseException as exc:  # the test reports what each thread met
            errors.append(exc)
        finally:
            connection.close()

    workers = [threading.Thread(target=run, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert errors == []
    return sorted(value for values in seen for value in values)


@pytest.mark.django_db(transaction=True)
def test_concurrent_increments_on_the_database_cache_lose_no_count(database_cache):
    """Threads with their own connections increment one counter at once: every
    increment lands and each returns a different count (Django's own ``incr``, a get
    and a set, hands out the same count twice and loses increments)."""
    threads, each = 6, 20
    key = "throttle:test:concurrent"
    cache.add(key, 0, timeout=600)
    counts = _count_at_once(lambda: cache.incr(key), threads=threads, each=each)
    assert counts == list(range(1, threads * each + 1))
    assert cache.get(key) == threads * each


@pytest.mark.django_db(transaction=True)
def test_concurrent_counts_on_the_counters_table_lose_none(database_cache):
    """Eight threads, each on its own connection (and its own cache instance, whose
    first count also deletes old rows), count 50 times each in one window at once:
    every count lands, and each returns a different number."""
    threads, each = 8, 50
    key = f"throttle:test:concurrent:{time.time_ns()}"
    expires = int(time.time()) + 600

    def count() -> int:
        store = caches["default"]
        assert isinstance(store, DatabaseCache)
        return store.window_count(key, delta=1, expires=expires, now=time.time())

    counts = _count_at_once(count, threads=threads, each=each)
    assert counts == list(range(1, threads * each + 1))
    assert throttle_count(key) == threads * each


def test_an_expired_or_missing_counter_is_not_incremented(db, database_cache):
    with pytest.raises(ValueError, match="not found"):
        cache.incr("throttle:test:missing")
    cache.set("throttle:test:old", 5, timeout=-1)
    with pytest.raises(ValueError, match="not found"):
        cache.incr("throttle:test:old")
    cache.set("throttle:test:live", 5, timeout=60)
    assert cache.incr("throttle:test:live", 2) == 7
    assert cache.get("throttle:test:live") == 7


# --- two server processes, one count ---------------------------------------------------


class TwoServers:
    """Two gunicorn servers on the test database, each its own process, sharing only
    the cache named by ``cache_url`` (Redis) or, without it, the database's."""

    def __init__(self, tmp: Path, *, cache_url: str, rate: str) -> None:
        self.env = {
            **os.environ,
            **database_env(),
            "SECRET_KEY": django_settings.SECRET_KEY,
            "DEBUG": "0",
            "CELERY_BROKER_URL": "",
            "CACHE_URL": cache_url,
            "THROTTLE_RUNNER_RATE": rate,
            "EFFECTGATE_VAR_DIR": str(tmp),
        }
        self.processes: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.clients: list[httpx.Client] = []
        for index in range(2):
            port = free_port()
            log = tmp / f"gunicorn-{index}.log"
            with log.open("w") as out:
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "gunicorn", "console.wsgi",
                         "--bind", f"127.0.0.1:{port}", "--workers", "1", "--threads", "2"],
                        cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                    )
                )  # fmt: skip
            self.logs.append(log)
            self.clients.append(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30))

    def wait_until_up(self) -> None:
        deadline = time.monotonic() + 90
        for client, process, log in zip(self.clients, self.processes, self.logs, strict=True):
            while True:
                assert process.poll() is None, log.read_text()[-3000:]
                try:
                    if client.get("/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        for log in self.logs:
            assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


@pytest.fixture(scope="module", params=["database", "redis"])
def two_servers(request, django_db_setup, tmp_path_factory) -> Iterator[tuple[str, TwoServers]]:
    cache_url = REDIS_URL if request.param == "redis" else ""
    servers = TwoServers(tmp_path_factory.mktemp("throttle"), cache_url=cache_url, rate="6/hour")
    try:
        servers.wait_until_up()
        yield request.param, servers
    finally:
        servers.stop()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_server_processes_share_one_count_per_token(two_servers):
    """Three requests to each process: six, the rate. The seventh and eighth are refused
    by whichever process answers, although each has seen only three before: the count
    is the token's, in the shared cache, not the process's."""
    kind, servers = two_servers
    api = make_runner()
    token = RunnerToken.objects.get(runner=api.runner)
    headers = {"Authorization": f"Bearer {api.token}"}
    # Every request must fall into one hour's window.
    if 3600 - time.time() % 3600 < 15:
        time.sleep(3600 - time.time() % 3600 + 0.5)
    key = f"throttle:runner:{token.pk}:{int(time.time() // 3600)}"
    store = redis.Redis.from_url(REDIS_URL)
    try:
        first, second = servers.clients
        answers = [client.get("/api/v1/tools", headers=headers) for client in (first, second) * 3]
        assert [answer.status_code for answer in answers] == [200] * 6
        refused = [client.get("/api/v1/runs/run_x", headers=headers) for client in (first, second)]
        assert [answer.status_code for answer in refused] == [429, 429]
        for answer in refused:
            assert answer.json()["code"] == "rate_limited"
            assert int(answer.headers["Retry-After"]) >= 1
        # Another token has its own count, on both processes.
        other = {"Authorization": f"Bearer {make_runner().token}"}
        assert [
            client.get("/api/v1/tools", headers=other).status_code for client in servers.clients
        ] == [200, 200]
        # The one count, where the processes keep it.
        if kind == "redis":
            assert int(store.get(f"effectgate:1:{key}")) == 8
        else:
            assert throttle_count(key) == 8
    finally:
        for found in store.scan_iter(f"effectgate:1:throttle:runner:{token.pk}:*"):
            store.delete(found)
        store.close()


@pytest.mark.slow
def test_migrate_creates_the_cache_and_counters_tables_on_a_fresh_database(tmp_path):
    """``make run`` on a fresh machine: migrate alone makes the database cache usable,
    also when Redis is the configured cache (switching it off later needs nothing)."""
    database = tmp_path / "fresh.sqlite3"
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=REPO,
        env={
            **os.environ,
            "DATABASE_URL": f"sqlite:///{database}",
            "CACHE_URL": REDIS_URL,
            "EFFECTGATE_VAR_DIR": str(tmp_path),
            "SECRET_KEY": django_settings.SECRET_KEY,
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with sqlite3.connect(database) as db:
        columns = [row[1] for row in db.execute(f"PRAGMA table_info({CACHE_TABLE})")]
        counters = [row[1] for row in db.execute(f"PRAGMA table_info({COUNTER_TABLE})")]
    assert columns == ["cache_key", "value", "expires"]
    assert counters == ["key", "count", "expires"]


# --- Redis: one round trip per count --------------------------------------------------------


def test_on_redis_a_count_is_one_round_trip_and_sets_its_expiry(
    api, settings, clock, redis_cache, monkeypatch
):
    """Each throttled request sends Redis one command (the script's EVALSHA), the
    window's first one too; the window's key expires two periods after it was made."""
    settings.THROTTLE_RUNNER_RATE = "100/min"
    assert api.get("/api/v1/tools").status_code == 200  # the script loaded, once
    commands: list[str] = []
    send = redis.Redis.execute_command

    def counted(self, *args, **options):
        commands.append(str(args[0]))
        return send(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", counted)
    clock[0] += 60  # the next window: its first request
    for _ in range(3):
        assert api.get("/api/v1/tools").status_code == 200
    assert commands == ["EVALSHA"] * 3
    token = RunnerToken.objects.get(runner=api.runner)
    key = f"{redis_cache}:1:throttle:runner:{token.pk}:{int(clock[0] // 60)}"
    store = redis.Redis.from_url(REDIS_URL)
    try:
        assert int(store.get(key)) == 3
        assert 60 < store.ttl(key) <= 120
    finally:
        store.close()


def test_on_redis_a_count_loads_a_script_redis_does_not_hold(
    api, settings, clock, redis_cache, monkeypatch
):
    """Redis forgets its scripts when it restarts: the count then loads the script again
    and goes on from the same counter. (A script of its own, one comment apart, stands
    for the forgotten one: SCRIPT FLUSH would reach every other test on this Redis.)"""
    settings.THROTTLE_RUNNER_RATE = "2/min"
    assert api.get("/api/v1/tools").status_code == 200
    fresh = f"{throttling.REDIS_COUNT_LUA}-- {uuid.uuid4().hex}\n"
    sha = hashlib.sha1(fresh.encode(), usedforsecurity=False).hexdigest()  # Redis' name
    store = redis.Redis.from_url(REDIS_URL)
    try:
        assert store.script_exists(sha) == [False]
        monkeypatch.setattr(throttling, "REDIS_COUNT_LUA", fresh)
        assert api.get("/api/v1/tools").status_code == 200
        assert api.get("/api/v1/tools").status_code == 429
        assert store.script_exists(sha) == [True]
    finally:
        store.close()


def test_concurrent_counts_on_redis_lose_none(redis_cache):
    """Eight threads count 50 times each on one key at once: every count lands, each
    returns a different number, and the key has its expiry."""
    threads, each = 8, 50
    key = f"throttle:test:concurrent:{time.time_ns()}"

    def count() -> int:
        store = caches["default"]
        assert isinstance(store, RedisCache)
        return redis_window_count(store, key, delta=1, timeout=120)

    counts = _count_at_once(count, threads=threads, each=each)
    assert counts == list(range(1, threads * each + 1))
    assert caches["default"].get(key) == threads * each
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert 0 < client.ttl(f"{redis_cache}:1:{key}") <= 120
    finally:
        client.close()


def test_a_batch_first_in_its_window_counts_its_items_and_the_window_expires(
    api, settings, clock, shared_cache
):
    """A batch of three is a window's first request: the counter starts at 3 (Redis: and
    gets its expiry then, although the count is not 1), two more requests pass, the
    next is refused."""
    settings.THROTTLE_RUNNER_RATE = "5/min"
    three = api.post("/api/v1/operations", [{}, {}, {}])
    assert three.status_code == 200, three.content
    assert [api.get("/api/v1/tools").status_code for _ in range(3)] == [200, 200, 429]
    token = RunnerToken.objects.get(runner=api.runner)
    key = f"throttle:runner:{token.pk}:{MINUTE // 60}"
    if shared_cache == "database":
        assert throttle_count(key) == 6
        return
    store = redis.Redis.from_url(REDIS_URL)
    try:
        full = caches["default"].make_and_validate_key(key)
        assert int(store.get(full)) == 6
        assert 60 < store.ttl(full) <= 120
    finally:
        store.close()
