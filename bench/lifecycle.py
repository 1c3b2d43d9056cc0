"""(a) The lifecycle against its essential statements.

One lifecycle is what a runner does for every side effect: register the operation
and claim its first attempt in the same request, then post the attempt's outcome. Four
paths do it on the same database, K client threads each, every thread with a runner,
a tool and a run of its own (the runner made with ``services.runner_create``, the tool
and the run through the API):

- ``essential``: the twelve statements that must reach PostgreSQL
  (``bench.essential``), over raw psycopg;
- ``replica``: the statements the service sends, replayed over raw psycopg
  (``bench.lifecycle_sql``): the database's share of the API's cost;
- ``unprepared``: the same replica without server-side prepared statements, so that
  PostgreSQL parses and plans every statement, as it does for Django (which binds
  parameters on the client): what preparing would save;
- ``api``: the REST API under gunicorn, whose workers count the statements each request
  sends (``bench.gunicorn_conf``).

Each path runs twice, in the order listed and then in reverse, half the lifecycles each
time, so that a change in the machine's load during the run weighs on all alike. For
each: throughput, latency per step, statements per lifecycle, and the CPU time per
lifecycle of the app (gunicorn's processes), of PostgreSQL (the backends of the bench
database) and of the client (this process), from ``/proc`` (``bench.procstat``). One
traced lifecycle of each path gives the statements by name, and the API's beyond the
essential ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from effectgate_client import EffectgateClient

from . import procstat
from .essential import EssentialRunner
from .gunicorn_conf import CPU_HEADER, STATEMENTS_HEADER, TRACE_HEADER
from .lifecycle_sql import SqlRunner
from .statements import beyond, labels
from .timing import latency_ms, on_threads

PRINCIPAL = "user:bench"
LEASE_S = 30
WARM_PER_THREAD = 10
ORDER = ("essential", "replica", "unprepared", "api")
STEPS = {
    "essential": ("register", "claim", "outcome"),
    "replica": ("register_claim", "outcome"),
    "unprepared": ("register_claim", "outcome"),
    "api": ("register_claim", "outcome"),
}


@dataclass(frozen=True)
class Seat:
    """What one client thread works with: its runner, tool and run."""

    runner_id: str
    runner_name: str
    token: str
    tool: str
    run_id: str
    principal: str


def make_seats(base_url: str, *, count: int, tag: str, contract: dict) -> list[Seat]:
    """``count`` runners, each with a tool it owns and a run. Django must be set up on
    the bench's database: runners are made only by the service (``manage.py runner``)."""
    from django.db import connections

    from operations import services

    seats = []
    try:
        for index in range(count):
            name = f"bench-{tag}-{index}"
            runner, token = services.runner_create(name=name, actor=services.Actor.system("bench"))
            tool = f"bench_{tag}_{index}"
            with EffectgateClient(base_url, token) as client:
                client.put_tool(tool, contract)
                run = client.create_run(principal=PRINCIPAL, external_id=name)
            seats.append(Seat(runner.id, runner.name, token, tool, run["id"], run["principal"]))
    finally:
        # No idle backend of this process beside the measured ones.
        connections.close_all()
    return seats


def _arguments(index: int, n: int) -> dict[str, Any]:
    return {"payment_id": f"pay_{index}_{n}", "amount_cents": 500}


# --- CPU -----------------------------------------------------------------------------------


class CpuMeter:
    """CPU ticks of the app, PostgreSQL and the client, read before and after a phase.

    PostgreSQL's share is that of every client backend connected to the bench database
    (gunicorn's, the raw-psycopg runners'; idle ones add nothing), not of the server's
    shared processes (WAL writer, checkpointer), which also work for other databases.
    """

    def __init__(self, url: str, gunicorn_pid: int) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.gunicorn_pid = gunicorn_pid

    def close(self) -> None:
        self.conn.close()

    def _backends(self) -> list[int]:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchall()
        return [pid for (pid,) in rows]

    def read(self) -> dict[str, dict[int, int]]:
        app = [self.gunicorn_pid, *procstat.children(self.gunicorn_pid)]
        return {
            "app": procstat.cpu_ticks(app),
            "postgres": procstat.cpu_ticks(self._backends()),
            "client": procstat.cpu_ticks([os.getpid()]),
        }

    @staticmethod
    def spent(
        before: dict[str, dict[int, int]], after: dict[str, dict[int, int]]
    ) -> tuple[dict[str, float], int]:
        """Milliseconds per group, and PostgreSQL backends that ended in between."""
        spent = {}
        lost = 0
        for group in before:
            spent[group], gone = procstat.spent_ms(before[group], after[group])
            if group == "postgres":
                lost = gone
        return spent, lost


# --- one phase of one path -----------------------------------------------------------------


@dataclass
class Phase:
    wall_s: float = 0.0
    lifecycles: int = 0
    statements: int = 0
    steps: dict[str, list[float]] = field(default_factory=dict)
    cpu_ms: dict[str, float] = field(default_factory=dict)
    backends_lost: int = 0
    per_lifecycle_statements: dict[int, int] = field(default_factory=dict)
    # The API only: CPU ms its requests spent inside the Django application, per step.
    django_cpu_ms: dict[str, float] = field(default_factory=dict)

    def add(self, other: Phase) -> None:
        self.wall_s += other.wall_s
        self.lifecycles += other.lifecycles
        self.statements += other.statements
        for step, values in other.steps.items():
            self.steps.setdefault(step, []).extend(values)
        for group, ms in other.cpu_ms.items():
            self.cpu_ms[group] = self.cpu_ms.get(group, 0.0) + ms
        self.backends_lost += other.backends_lost
        for count, times in other.per_lifecycle_statements.items():
            self.per_lifecycle_statements[count] = (
                self.per_lifecycle_statements.get(count, 0) + times
            )
        for step, ms in other.django_cpu_ms.items():
            self.django_cpu_ms[step] = self.django_cpu_ms.get(step, 0.0) + ms

    def report(self) -> dict[str, Any]:
        per = {group: round(ms / self.lifecycles, 2) for group, ms in self.cpu_ms.items()}
        per["total"] = round(sum(self.cpu_ms.values()) / self.lifecycles, 2)
        return {
            "lifecycles": self.lifecycles,
            "wall_s": round(self.wall_s, 2),
            "lifecycles_s": round(self.lifecycles / self.wall_s, 1),
            "steps": {step: latency_ms(values) for step, values in self.steps.items()},
            "statements_per_lifecycle": round(self.statements / self.lifecycles, 2),
            "statements_per_lifecycle_seen": {
                str(count): times for count, times in sorted(self.per_lifecycle_statements.items())
            },
            "cpu_ms": {group: round(ms) for group, ms in self.cpu_ms.items()},
            "cpu_ms_per_lifecycle": per,
            "postgres_backends_lost": self.backends_lost,
            **(
                {
                    "django_cpu_ms_per_request": {
                        step: round(ms / self.lifecycles, 2)
                        for step, ms in self.django_cpu_ms.items()
                    }
                }
                if self.django_cpu_ms
                else {}
            ),
        }


def _collect(per_thread: list[tuple[dict[str, list[float]], list[int]]], wall: float) -> Phase:
    phase = Phase(wall_s=wall)
    for steps, counts in per_thread:
        for step, values in steps.items():
            phase.steps.setdefault(step, []).extend(values)
        phase.lifecycles += len(counts)
        phase.statements += sum(counts)
        for count in counts:
            phase.per_lifecycle_statements[count] = phase.per_lifecycle_statements.get(count, 0) + 1
    return phase


def api_client(base_url: str, seat: Seat) -> httpx.Client:
    """A seat's HTTP client, made once: a runner keeps its client (and its connection),
    and making one costs milliseconds of CPU (httpx builds an SSL context)."""
    return httpx.Client(
        base_url=f"{base_url}/api/v1",
        headers={"Authorization": f"Bearer {seat.token}"},
        timeout=60,
    )


def api_phase(clients: list[httpx.Client], seats: list[Seat], per_thread: int, tag: str) -> Phase:
    def thread(index: int) -> tuple[dict[str, list[float]], list[int]]:
        seat, http = seats[index], clients[index]
        steps: dict[str, list[float]] = {"register_claim": [], "outcome": []}
        counts = []
        django_us: Counter[str] = Counter()
        for n in range(per_thread):
            t0 = time.perf_counter()
            registered = http.post(
                "/operations",
                json={
                    "run": seat.run_id,
                    "tool": seat.tool,
                    "operation_key": f"{tag}-{index}-{n}",
                    "arguments": _arguments(index, n),
                    "claim": {"lease_s": LEASE_S},
                },
            )
            t1 = time.perf_counter()
            assert registered.status_code == 201, registered.text
            body = registered.json()
            assert body["attempt"] is not None, body
            done = http.post(
                f"/operations/{body['id']}/attempts/{body['attempt']['attempt']}/outcome",
                json={"kind": "succeeded", "downstream_id": f"re_{index}_{n}"},
            )
            t2 = time.perf_counter()
            assert done.status_code == 200, done.text
            steps["register_claim"].append(t1 - t0)
            steps["outcome"].append(t2 - t1)
            counts.append(sum(int(r.headers[STATEMENTS_HEADER]) for r in (registered, done)))
            for step, response in (("register_claim", registered), ("outcome", done)):
                django_us[step] += int(response.headers[CPU_HEADER])
        django_cpu_us.append(django_us)
        return steps, counts

    django_cpu_us: list[Counter[str]] = []
    started = time.perf_counter()
    per_thread_results = on_threads(len(seats), thread)
    phase = _collect(per_thread_results, time.perf_counter() - started)
    phase.django_cpu_ms = {step: us / 1000 for step, us in sum(django_cpu_us, Counter()).items()}
    return phase


def essential_phase(
    runners: list[EssentialRunner], seats: list[Seat], per_thread: int, tag: str
) -> Phase:
    def thread(index: int) -> tuple[dict[str, list[float]], list[int]]:
        seat, sql = seats[index], runners[index]
        steps: dict[str, list[float]] = {"register": [], "claim": [], "outcome": []}
        counts = []
        for n in range(per_thread):
            before = sql.statements
            t0 = time.perf_counter()
            op_id = sql.register(
                run_id=seat.run_id,
                principal=seat.principal,
                key=f"{tag}-{index}-{n}",
                arguments=_arguments(index, n),
            )
            t1 = time.perf_counter()
            number = sql.claim(op_id, run_id=seat.run_id, lease_s=LEASE_S)
            t2 = time.perf_counter()
            sql.outcome(
                op_id,
                number,
                run_id=seat.run_id,
                body={"kind": "succeeded", "downstream_id": f"re_{index}_{n}"},
            )
            t3 = time.perf_counter()
            steps["register"].append(t1 - t0)
            steps["claim"].append(t2 - t1)
            steps["outcome"].append(t3 - t2)
            counts.append(sql.statements - before)
        return steps, counts

    started = time.perf_counter()
    per_thread_results = on_threads(len(seats), thread)
    return _collect(per_thread_results, time.perf_counter() - started)


def replica_phase(runners: list[SqlRunner], seats: list[Seat], per_thread: int, tag: str) -> Phase:
    def thread(index: int) -> tuple[dict[str, list[float]], list[int]]:
        seat, sql = seats[index], runners[index]
        steps: dict[str, list[float]] = {"register_claim": [], "outcome": []}
        counts = []
        for n in range(per_thread):
            before = sql.statements
            t0 = time.perf_counter()
            op_id, number = sql.register_and_claim(
                run_id=seat.run_id,
                key=f"{tag}-{index}-{n}",
                arguments=_arguments(index, n),
                lease_s=LEASE_S,
            )
            t1 = time.perf_counter()
            sql.outcome(op_id, number, {"kind": "succeeded", "downstream_id": f"re_{index}_{n}"})
            t2 = time.perf_counter()
            steps["register_claim"].append(t1 - t0)
            steps["outcome"].append(t2 - t1)
            counts.append(sql.statements - before)
        return steps, counts

    started = time.perf_counter()
    per_thread_results = on_threads(len(seats), thread)
    return _collect(per_thread_results, time.perf_counter() - started)


# --- one traced lifecycle of each path -------------------------------------------------------


def trace_api(http: httpx.Client, seat: Seat, trace_dir: Path) -> dict[str, list[str]]:
    """The statements of one lifecycle through the API, as gunicorn's counter saw them."""
    for step in STEPS["api"]:
        (trace_dir / f"{step}.json").unlink(missing_ok=True)
    registered = http.post(
        "/operations",
        headers={TRACE_HEADER: "register_claim"},
        json={
            "run": seat.run_id,
            "tool": seat.tool,
            "operation_key": "traced",
            "arguments": _arguments(0, 0),
            "claim": {"lease_s": LEASE_S},
        },
    ).json()
    http.post(
        f"/operations/{registered['id']}/attempts/{registered['attempt']['attempt']}/outcome",
        headers={TRACE_HEADER: "outcome"},
        json={"kind": "succeeded", "downstream_id": "re_traced"},
    ).raise_for_status()
    return {step: json.loads((trace_dir / f"{step}.json").read_text()) for step in STEPS["api"]}


def _logged(sql: EssentialRunner | SqlRunner, call: Any) -> tuple[Any, list[str]]:
    sql.log = []
    try:
        result = call()
        return result, sql.log
    finally:
        sql.log = None


def trace_essential(sql: EssentialRunner, seat: Seat) -> dict[str, list[str]]:
    op_id, register = _logged(
        sql,
        lambda: sql.register(
            run_id=seat.run_id, principal=seat.principal, key="traced", arguments=_arguments(0, 0)
        ),
    )
    number, claim = _logged(sql, lambda: sql.claim(op_id, run_id=seat.run_id))
    _, outcome = _logged(
        sql,
        lambda: sql.outcome(
            op_id, number, run_id=seat.run_id, body={"kind": "succeeded", "downstream_id": "re"}
        ),
    )
    return {"register": register, "claim": claim, "outcome": outcome}


def trace_replica(sql: SqlRunner, seat: Seat) -> dict[str, list[str]]:
    (op_id, number), register = _logged(
        sql,
        lambda: sql.register_and_claim(
            run_id=seat.run_id, key="traced", arguments=_arguments(0, 0)
        ),
    )
    _, outcome = _logged(
        sql, lambda: sql.outcome(op_id, number, {"kind": "succeeded", "downstream_id": "re"})
    )
    return {"register_claim": register, "outcome": outcome}


# --- (a) ---------------------------------------------------------------------------------------


def lifecycle(
    *,
    base_url: str,
    database_url: str,
    gunicorn_pid: int,
    trace_dir: Path,
    threads: int,
    lifecycles: int,
    contract: dict[str, Any],
) -> dict[str, Any]:
    per_thread = max(2, lifecycles // threads)
    halves = (per_thread // 2, per_thread - per_thread // 2)
    print(f"(a) lifecycle: runners, tools and runs for {threads} threads per path", file=sys.stderr)
    seats = {
        name: make_seats(base_url, count=threads, tag=name, contract=contract)
        for name in ("essential", "replica", "api")
    }
    # Both replicas run as the same runners, one after the other.
    seats["unprepared"] = seats["replica"]
    essential = [
        EssentialRunner(
            database_url, runner_id=seat.runner_id, runner_name=seat.runner_name, tool=seat.tool
        )
        for seat in seats["essential"]
    ]
    replicas = {
        name: [
            SqlRunner(
                database_url,
                token_hash=hashlib.sha256(seat.token.encode()).hexdigest(),
                tool=seat.tool,
                prepared=name == "replica",
            )
            for seat in seats["replica"]
        ]
        for name in ("replica", "unprepared")
    }
    clients = [api_client(base_url, seat) for seat in seats["api"]]
    meter = CpuMeter(database_url, gunicorn_pid)
    run = {
        "essential": lambda n, tag: essential_phase(essential, seats["essential"], n, tag),
        "replica": lambda n, tag: replica_phase(replicas["replica"], seats["replica"], n, tag),
        "unprepared": lambda n, tag: replica_phase(
            replicas["unprepared"], seats["unprepared"], n, tag
        ),
        "api": lambda n, tag: api_phase(clients, seats["api"], n, tag),
    }
    try:
        # Warm every path up (gunicorn's threads and connections, prepared statements),
        # then trace one lifecycle of each.
        for name in ORDER:
            run[name](WARM_PER_THREAD, f"warm-{name}")
        traces = {
            "essential": trace_essential(essential[0], seats["essential"][0]),
            "replica": trace_replica(replicas["replica"][0], seats["replica"][0]),
            "api": trace_api(clients[0], seats["api"][0], trace_dir),
        }
        print(
            f"(a) lifecycle: {per_thread * threads} per path, {threads} threads",
            file=sys.stderr,
        )
        paths = {name: Phase() for name in ORDER}
        for half, order in enumerate((ORDER, tuple(reversed(ORDER)))):
            for name in order:
                before = meter.read()
                phase = run[name](halves[half], f"{name}-{half}")
                after = meter.read()
                phase.cpu_ms, phase.backends_lost = meter.spent(before, after)
                paths[name].add(phase)
    finally:
        meter.close()
        for http in clients:
            http.close()
        for sql in (*essential, *replicas["replica"], *replicas["unprepared"]):
            sql.close()

    named = {
        name: {step: labels(statements) for step, statements in trace.items()}
        for name, trace in traces.items()
    }
    flat = {name: [label for step in named[name].values() for label in step] for name in named}
    usual = {
        name: Counter(paths[name].per_lifecycle_statements).most_common(1)[0][0] for name in ORDER
    }
    return {
        "threads": threads,
        "lifecycles_per_path": per_thread * threads,
        "order": ", ".join(ORDER) + ", then in reverse (half the lifecycles each)",
        "paths": {name: paths[name].report() for name in ORDER},
        "statements": named,
        "api_beyond_essential": beyond(flat["api"], flat["essential"]),
        "essential_beyond_api": beyond(flat["essential"], flat["api"]),
        # The count most lifecycles sent: the traced one may have met a cold cache.
        "usual_statements": usual,
        "traced_statements": {name: len(labels) for name, labels in flat.items()},
        "replica_matches_api": usual["replica"] == usual["api"],
    }


# --- the table ---------------------------------------------------------------------------------


def table(life: dict[str, Any]) -> list[str]:
    paths = life["paths"]
    essential_rate = paths["essential"]["lifecycles_s"]
    lines = [
        f"(a) lifecycle (register with inline claim -> outcome), {life['lifecycles_per_path']}"
        f" per path, {life['threads']} client threads",
        f"    {'path':<12}{'lifecycles/s':>13}{'x essential':>13}{'statements':>12}"
        f"{'CPU ms per lifecycle: app':>27}{'postgres':>10}{'client':>8}{'total':>8}",
    ]
    for name in ORDER:
        path = paths[name]
        cpu = path["cpu_ms_per_lifecycle"]
        lines.append(
            f"    {name:<12}{path['lifecycles_s']:>13.1f}"
            f"{essential_rate / path['lifecycles_s']:>13.2f}"
            f"{path['statements_per_lifecycle']:>12.1f}"
            f"{cpu['app']:>27.2f}{cpu['postgres']:>10.2f}{cpu['client']:>8.2f}{cpu['total']:>8.2f}"
        )
    lines.append("    latency p50 / p99 ms per step:")
    for name in ORDER:
        steps = paths[name]["steps"]
        lines.append(
            f"      {name:<12}"
            + "   ".join(
                f"{step} {values['p50_ms']:.1f} / {values['p99_ms']:.1f}"
                for step, values in steps.items()
            )
        )
    django = paths["api"].get("django_cpu_ms_per_request")
    if django:
        lines += [
            "    API CPU ms per request inside the Django app: "
            + ", ".join(f"{step} {ms:.1f}" for step, ms in django.items()),
            f"      (gunicorn's processes: {paths['api']['cpu_ms_per_lifecycle']['app']:.1f}"
            " per lifecycle; the rest is HTTP, the worker's threads, the master)",
        ]
    if not life["replica_matches_api"]:
        lines.append(
            "    the replica's statement count differs from the API's:"
            " bench/lifecycle_sql.py needs an update"
        )
    traced, usual = life["traced_statements"]["api"], life["usual_statements"]["api"]
    lines.append(
        "    statements the API sends beyond the essential ones, in the traced lifecycle"
        + (f" ({traced} statements; most sent {usual}):" if traced != usual else ":")
    )
    for label, count in Counter(life["api_beyond_essential"]).most_common():
        lines.append(f"      {count} x {label}")
    if life["essential_beyond_api"]:
        lines.append(
            "    essential statements the API does not send: "
            + ", ".join(life["essential_beyond_api"])
        )
    return lines
