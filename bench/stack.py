"""A live Effectgate for benchmarks: a fresh database, gunicorn, the background loops.

``Stack`` migrates a database of its own, creates a runner token with
``manage.py runner create``, serves the API with gunicorn on a free loopback port (or
with granian's WSGI interface, ``server="granian"``, for ``bench.servers``) and, when
asked, runs ``manage.py sweep --loop`` and ``manage.py reconcile --loop`` beside it.
Everything it starts it stops, also on errors and Ctrl-C.

Databases: a benchmark never writes into the database ``DATABASE_URL`` names. With
PostgreSQL it drops and creates a database of its own name on the same server
(``effectgate_chaos``, ``effectgate_bench``); without ``DATABASE_URL`` it uses a
SQLite file under ``var/``.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

ROOT = Path(__file__).resolve().parents[1]
VAR = ROOT / "var"
SERVERS = ("gunicorn", "granian")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def is_postgres(url: str | None) -> bool:
    return bool(url) and urlsplit(url).scheme in {"postgres", "postgresql", "pgsql"}


def with_database(url: str, name: str) -> str:
    """``url`` pointing at database ``name`` on the same server."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def recreate_postgres(url: str) -> None:
    """Drop and create the database ``url`` names (connecting to ``postgres``)."""
    import psycopg
    from psycopg import sql

    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(with_database(url, "postgres"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def fresh_database(name: str, *, base_url: str | None) -> str:
    """A new, empty database for a benchmark; its URL."""
    if is_postgres(base_url):
        url = with_database(base_url, name)
        recreate_postgres(url)
        return url
    path = VAR / "bench" / f"{name}.sqlite3"
    path.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"


class Stack:
    """Effectgate under gunicorn on a fresh database. Use as a context manager.

    ``server="granian"`` serves ``console.wsgi`` with granian's WSGI interface instead:
    ``workers`` processes of ``threads`` blocking threads each (gunicorn's gthread
    workers' counterpart); ``gunicorn_config`` is gunicorn's alone."""

    def __init__(
        self,
        database_url: str,
        *,
        workers: int = 4,
        threads: int = 4,
        loops: bool = True,
        loop_every_s: float = 1.0,
        runner_name: str = "bench",
        log_dir: Path | None = None,
        gunicorn_config: str | None = None,
        env: dict[str, str] | None = None,
        server: str = "gunicorn",
    ) -> None:
        if server not in SERVERS:
            raise ValueError(f"server: one of {', '.join(SERVERS)}, not {server!r}")
        if gunicorn_config and server != "gunicorn":
            raise ValueError("gunicorn_config is for gunicorn")
        self.server = server
        self.database_url = database_url
        self.workers = workers
        self.threads = threads
        self.loops = loops
        self.loop_every_s = loop_every_s
        self.runner_name = runner_name
        self.gunicorn_config = gunicorn_config
        self.log_dir = log_dir or VAR / "bench"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.token = ""
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "RECONCILE_ALLOWED_HOSTS": "127.0.0.1",
            # The fake provider commits within its slow-response time, so a short grace
            # before the first lookup is enough here (production defaults to 15 s).
            "RECONCILE_FIRST_PROBE_DELAY_S": "2",
            "LOG_LEVEL": "WARNING",
            # Production mode over plain HTTP on loopback: no debug, no TLS redirect, and
            # one secret for every process of the stack (gunicorn, sweep, reconcile).
            "DEBUG": "0",
            "SECURE_SSL_REDIRECT": "0",
            "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50),
            **(env or {}),
        }
        self._processes: list[subprocess.Popen] = []
        self._logs: list = []

    def manage(self, *args: str) -> str:
        done = subprocess.run(  # noqa: S603 (our own manage.py, fixed arguments)
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "w")  # noqa: SIM115 (closed in stop)
        self._logs.append(log)
        process = subprocess.Popen(  # noqa: S603 (commands built here, not input)
            args, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self._processes.append(process)
        return process

    def start(self) -> Stack:
        self.manage("migrate", "--noinput")
        self.token = self.manage("runner", "create", self.runner_name).strip().splitlines()[-1]
        self._spawn(self.server, self._server_command())
        self._wait_ready()
        if self.loops:
            every = str(self.loop_every_s)
            self._spawn("sweep", [sys.executable, "manage.py", "sweep", "--loop", every])
            self._spawn("reconcile", [sys.executable, "manage.py", "reconcile", "--loop", every])
        return self

    def _server_command(self) -> list[str]:
        if self.server == "granian":
            return [
                sys.executable,
                "-m",
                "granian",
                "--interface",
                "wsgi",
                "console.wsgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(self.workers),
                "--blocking-threads",
                str(self.threads),
                "--http",
                "1",
                "--backlog",
                "2048",
                "--no-ws",
                "--log-level",
                "warning",
            ]
        return [
            sys.executable,
            "-m",
            "gunicorn",
            "console.wsgi",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(self.workers),
            "--threads",
            str(self.threads),
            "--worker-class",
            "gthread",
            "--timeout",
            "120",
            "--backlog",
            "2048",
            "--log-level",
            "warning",
            *(["--config", self.gunicorn_config] if self.gunicorn_config else []),
        ]

    @property
    def server_pid(self) -> int:
        """The server's main process id (gunicorn's master, granian's; the workers are
        its children)."""
        return self._processes[0].pid

    @property
    def gunicorn_pid(self) -> int:
        """The gunicorn master's process id (its workers are its children)."""
        return self.server_pid

    def _wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._processes[0].poll() is not None:
                log = self.log_dir / f"{self.server}.log"
                raise RuntimeError(f"{self.server} exited; see {log}")
            try:
                if httpx.get(f"{self.base_url}/api/v1/tools", timeout=2).status_code == 401:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.server} did not answer within a minute")

    def stop(self) -> None:
        for process in reversed(self._processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> Stack:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
