"""The soak: Effectgate as it runs in production, with processes killed at random.

``python -m bench.soak --minutes 5`` (``make soak MINUTES=5``) starts, on a fresh
database (PostgreSQL when ``DATABASE_URL`` is set) and Redis:

- three gunicorn processes on three ports, two Celery workers and two beats (one leads
  through the beat lock, one stands by);
- runner threads spread over the three ports doing the chaos workload (bench/harness.py:
  refunds through a fake provider that times out, fails and is slow at random), with a
  webhook endpoint subscribed to every operation event;
- a killer that, at random moments, SIGKILLs one process of each kind (web, worker,
  beat) and restarts it a second later.

Then it waits for the time-driven work to settle and checks: no duplicate effect, no
lost operation, each lease expiry done once per attempt, each probe answer applied once
per operation, and each webhook message delivered to the endpoint (no duplicate after
deduplication by ``webhook-id``). It prints the figures and the throughput beside a
one-process run (one gunicorn, one worker, one beat, no kills) of the same workload.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from effectgate_client import (
    EffectgateClient,
    EffectgateError,
    OutcomeNotRecorded,
    PollingWaiter,
    Runner,
)

from .fake_provider import FakeProvider
from .faults import FaultSchedule
from .harness import (
    KEY_PREFIX,
    TOOL,
    account_effectgate,
    amount_cents,
    effectgate_ledger,
    provider_refund,
    refund_contract,
    run_jobs,
    settle,
)
from .harness import RunReport as _Report
from .stack import ROOT, VAR, free_port, fresh_database, is_postgres

REDIS_URL = os.environ.get("SOAK_REDIS_URL", "redis://127.0.0.1:6379/13")


class Webhooks:
    """The runner's webhook endpoint: records each delivery's ``webhook-id``."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                hooks.ids.append(self.headers.get("webhook-id", ""))
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hooks"

    def close(self) -> None:
        self.httpd.shutdown()


@dataclass
class Fleet:
    """Every process of one Effectgate installation on this machine."""

    database_url: str
    web: int = 3
    workers: int = 2
    beats: int = 2
    log_dir: Path = VAR / "soak"
    ports: list[int] = field(default_factory=list)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    kills: Counter[str] = field(default_factory=Counter)
    token: str = ""

    def __post_init__(self) -> None:
        self.queue = f"eg-soak-{uuid.uuid4().hex[:10]}"
        self.env = {
            **os.environ,
            "DATABASE_URL": self.database_url,
            "DJANGO_SETTINGS_MODULE": "console.settings",
            "CELERY_BROKER_URL": REDIS_URL,
            "CELERY_TASK_DEFAULT_QUEUE": self.queue,
            "WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
            "RECONCILE_ALLOWED_HOSTS": "127.0.0.1",
            "RECONCILE_FIRST_PROBE_DELAY_S": "2",
            "LOG_LEVEL": "WARNING",
            "DEBUG": "0",
            "SECURE_SSL_REDIRECT": "0",
            "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50),
        }
        self.ports = [free_port() for _ in range(self.web)]
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def manage(self, *args: str) -> str:
        done = subprocess.run(  # noqa: S603 (our own manage.py)
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout

    def _command(self, name: str) -> list[str]:
        kind, index = name.rsplit("-", 1)
        if kind == "web":
            port = self.ports[int(index)]
            return [
                sys.executable, "-m", "gunicorn", "console.wsgi",
                "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "4",
                "--worker-class", "gthread", "--timeout", "60", "--log-level", "warning",
            ]  # fmt: skip
        if kind == "worker":
            return [
                sys.executable, "-m", "celery", "-A", "console", "worker", "-Q", self.queue,
                "-n", f"{name}-{self.queue}@%h", "--concurrency=2", "--without-gossip",
                "--without-mingle", "--loglevel=WARNING",
            ]  # fmt: skip
        schedule = self.log_dir / f"{name}-{self.queue}-schedule"
        return [
            sys.executable, "-m", "celery", "-A", "console", "beat", "-s", str(schedule),
            "--loglevel=WARNING",
        ]  # fmt: skip

    def start(self, name: str) -> None:
        log = open(self.log_dir / f"{name}.log", "a")  # noqa: SIM115 (the process owns it)
        self.processes[name] = subprocess.Popen(  # noqa: S603 (commands built here)
            self._command(name),
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a kill takes its children too
        )

    def names(self, kind: str) -> list[str]:
        count = {"web": self.web, "worker": self.workers, "beat": self.beats}[kind]
        return [f"{kind}-{index}" for index in range(count)]

    def up(self) -> Fleet:
        self.manage("migrate", "--noinput")
        self.token = self.manage("runner", "create", "soak").strip().splitlines()[-1]
        for kind in ("web", "worker", "beat"):
            for name in self.names(kind):
                self.start(name)
        for port in self.ports:
            self._wait_ready(port)
        return self

    def _wait_ready(self, port: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=3).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"gunicorn on port {port} did not become ready")

    def kill_and_restart(self, name: str, down_s: float = 1.0) -> None:
        process = self.processes[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        self.kills[name.rsplit("-", 1)[0]] += 1
        time.sleep(down_s)
        self.start(name)

    def down(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]


def _killer(fleet: Fleet, *, during_s: float, seed: int) -> None:
    """SIGKILL one process of each kind at a random moment of the run, then restart it."""
    rng = random.Random(seed)  # noqa: S311 (a test schedule, not a secret)
    plan = sorted(
        (rng.uniform(0.15, 0.75) * during_s, rng.choice(fleet.names(kind)))
        for kind in ("web", "worker", "beat")
    )
    started = time.monotonic()
    for at, name in plan:
        time.sleep(max(0.0, at - (time.monotonic() - started)))
        fleet.kill_and_restart(name)


def _workload(
    urls: list[str],
    token: str,
    provider: FakeProvider,
    items: list[str],
    *,
    threads: int,
    lease_s: int,
    runs: list[str],
) -> _Report:
    """The chaos harness's Effectgate runner, its threads spread over ``urls``."""
    spread = itertools.cycle(urls)
    lock = threading.Lock()
    # What the clients repeated (a 429 would be throttling refusing the workload).
    repeats: Counter[str] = Counter()

    def make_worker() -> tuple[Callable[[str], str], Callable[[], None]]:
        with lock:
            base_url = next(spread)
        client = EffectgateClient(base_url, token, timeout=30)
        runner = Runner(
            client,
            lease_s=lease_s,
            wait_s=max(10.0, 4 * lease_s),
            waiter=PollingWaiter(initial_s=0.2, max_s=1.0),
        )
        http = httpx.Client(timeout=1.0)
        refund = provider_refund(http, provider)

        def job(ref: str) -> str:
            index = int(ref.rsplit("_", 1)[1])
            for _ in range(3):  # a killed web process: the same call again, elsewhere
                try:
                    return runner.execute(
                        run=runs[index % len(runs)],
                        tool=TOOL,
                        operation_key=KEY_PREFIX + ref,
                        arguments={"payment_id": ref, "amount_cents": amount_cents(ref)},
                        call=refund,
                    ).status
                except OutcomeNotRecorded:
                    return "outcome_not_recorded"
                except EffectgateError as exc:
                    last = f"error:{type(exc).__name__}"
                    time.sleep(1.0)
            return last

        def close() -> None:
            with lock:
                repeats.update(client.stats)
            client.close()
            http.close()

        return job, close

    started = time.monotonic()
    answers, crashes = run_jobs(items, make_worker, workers=threads)
    return _Report(
        "effectgate",
        answers,
        crashes,
        time.monotonic() - started,
        run_ids=runs,
        extra={"api_repeats": repeats},
    )


def _wait_webhooks(timeout_s: float) -> bool:
    from operations.models import OutboxMessage

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not OutboxMessage.objects.filter(status="pending").exists():
            return True
        time.sleep(1.0)
    return False


def _checks(report: _Report, provider: FakeProvider, items: list[str], hooks: Webhooks) -> dict:
    from django.db.models import Count

    from operations.models import Event, OutboxMessage

    row = account_effectgate(report, provider, items, effectgate_ledger(report.run_ids))
    expiries = (
        Event.objects.filter(kind="lease_expired")
        .values("stream", "data__attempt")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
    )
    probe_answers = (
        Event.objects.filter(kind="reconciled", actor="system:probe")
        .values("stream")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
    )
    delivered = set(OutboxMessage.objects.filter(status="delivered").values_list("pk", flat=True))
    received = Counter(hooks.ids)
    row.update(
        lease_expiries_twice=expiries,
        probe_answers_twice=probe_answers,
        webhook_messages=OutboxMessage.objects.count(),
        webhooks_delivered=len(delivered),
        webhooks_undelivered=OutboxMessage.objects.exclude(status="delivered").count(),
        webhooks_missing=len(delivered - set(received)),
        webhooks_unknown=len(set(received) - delivered),
        webhook_redeliveries=sum(n - 1 for n in received.values() if n > 1),
    )
    return row


def soak(
    *,
    n: int,
    threads: int,
    seed: int,
    fault_rate: float,
    lease_s: int,
    web: int = 3,
    workers: int = 2,
    beats: int = 2,
    kills: bool = True,
    name: str = "effectgate_soak",
) -> dict[str, Any]:
    """One soak run; returns its figures (and ``ok``)."""
    database_url = fresh_database(name, base_url=os.environ.get("DATABASE_URL"))
    fleet = Fleet(database_url, web=web, workers=workers, beats=beats, log_dir=VAR / name)
    hooks = Webhooks()
    schedule = FaultSchedule(seed=seed, rate=fault_rate, lookup_fault_rate=0.0)
    items = [f"pay_{index:06d}" for index in range(n)]
    try:
        fleet.up()
        with EffectgateClient(fleet.urls[0], fleet.token) as setup:
            setup.request(
                "POST", "/webhook-endpoints", json={"url": hooks.url, "events": ["operation.*"]}
            )
            with FakeProvider(schedule, client_timeout_s=1.0, slow_s=0.6) as provider:
                setup.put_tool(TOOL, refund_contract(provider.lookup_template))
                runs = [
                    setup.create_run(principal="user:soak", external_id=f"soak-{i}")["id"]
                    for i in range(16)
                ]
                expected_s = max(10.0, n / 15)
                killer = threading.Thread(
                    target=_killer, kwargs={"fleet": fleet, "during_s": expected_s, "seed": seed}
                )
                if kills:
                    killer.start()
                try:
                    report = _workload(
                        fleet.urls, fleet.token, provider, items,
                        threads=threads, lease_s=lease_s, runs=runs,
                    )  # fmt: skip
                finally:
                    if kills:
                        # Every planned kill happens, during the workload or while its
                        # time-driven work (sweeps, probes, webhooks) goes on after it.
                        killer.join()
                settled = settle(
                    fleet.urls[0], fleet.token, timeout_s=180, repeats=report.extra["api_repeats"]
                )
                os.environ["DATABASE_URL"] = database_url
                os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
                import django

                django.setup()
                logging.getLogger("httpx").setLevel(logging.WARNING)
                webhooks_settled = _wait_webhooks(120)
                row = _checks(report, provider, items, hooks)
    finally:
        fleet.down()
        hooks.close()
    row.update(
        settled=settled and webhooks_settled,
        processes={"web": web, "worker": workers, "beat": beats},
        kills=dict(fleet.kills),
        throughput_ops_s=round(n / report.wall_s, 2),
        database="PostgreSQL" if is_postgres(database_url) else "SQLite",
    )
    row["ok"] = (
        row["duplicates"] == 0
        and row["lost"] == 0
        and row["lease_expiries_twice"] == 0
        and row["probe_answers_twice"] == 0
        and row["webhooks_missing"] == 0
        and row["webhooks_unknown"] == 0
        and row["webhooks_undelivered"] == 0
        and row["settled"]
        # Request throttling at its defaults must leave the workload alone.
        and "status:429" not in row["api_repeats"]
    )
    return row


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.ERROR)  # the progress of many threads, not their noise
    logging.getLogger("httpx").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=2.0, help="length of the soak")
    parser.add_argument("--n", type=int, help="refunds (instead of --minutes)")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the one-process run (CI's short soak)"
    )
    parser.add_argument("--one-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=12, help="runner threads")
    parser.add_argument("--seed", type=int, default=20261130)
    parser.add_argument("--fault-rate", type=float, default=0.2)
    parser.add_argument("--lease-s", type=int, default=3)
    parser.add_argument("--json", type=Path, default=VAR / "soak.json")
    args = parser.parse_args(argv)
    # About 15 refunds a second on this workload: the soak's n fills the minutes asked.
    args.json.parent.mkdir(parents=True, exist_ok=True)
    n = args.n or max(60, int(args.minutes * 60 * 15))
    common = {"threads": args.threads, "seed": args.seed, "fault_rate": args.fault_rate,
              "lease_s": args.lease_s}  # fmt: skip
    if args.one_process:  # the baseline, run as its own process by the soak below
        row = soak(
            n=n, web=1, workers=1, beats=1, kills=False, name="effectgate_soak_baseline",
            **common,
        )  # fmt: skip
        args.json.write_text(json.dumps(row, default=str))
        return 0
    baseline: dict[str, Any] = {}
    if not args.no_baseline:
        # Its own process: a process reads one database with Django's ORM.
        baseline_json = args.json.with_name("soak-baseline.json")
        subprocess.run(  # noqa: S603 (this module, fixed arguments)
            [sys.executable, "-m", "bench.soak", "--one-process", "--n", str(max(60, n // 5)),
             "--threads", str(args.threads), "--seed", str(args.seed),
             "--fault-rate", str(args.fault_rate), "--lease-s", str(args.lease_s),
             "--json", str(baseline_json)],
            cwd=ROOT,
            check=True,
        )  # fmt: skip
        baseline = json.loads(baseline_json.read_text())
    row = soak(n=n, **common)
    row["baseline_throughput_ops_s"] = baseline.get("throughput_ops_s")
    args.json.write_text(json.dumps({"soak": row, "baseline": baseline}, indent=2, default=str))
    for key in (
        "processes", "kills", "logical_operations", "provider_effects", "duplicates", "lost",
        "succeeded", "failed_no_effect", "in_reconciliation", "lease_expiries_twice",
        "probe_answers_twice", "webhook_messages", "webhooks_delivered", "webhooks_missing",
        "webhook_redeliveries", "api_repeats", "throughput_ops_s", "baseline_throughput_ops_s",
        "settled", "database",
    ):  # fmt: skip
        print(f"{key:28} {row.get(key)}")
    print(f"{'ok':28} {row['ok']}")
    return 0 if row["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
