"""(a) The lifecycle against its essential statements.

One lifecycle is what a runner does for every side effect: register the operation
and claim its first attempt in the same request, then post the attempt's outcome. Five
paths do it, K client threads each; those of Effectgate's tables on the same database,
every thread with a runner, a tool and a run of its own (the runner made with
``services.runner_create``, the tool and the run through the API):

- ``essential``: the twelve statements that must reach PostgreSQL
  (``bench.essential``), over raw psycopg;
- ``replica``: the statements the service sends, replayed over raw psycopg
  (``bench.lifecycle_sql``): the database's share of the API's cost;
- ``unprepared``: the same replica without server-side prepared statements, so that
  PostgreSQL parses and plans every statement, as it does for Django (which binds
  parameters on the client): what preparing would save;
- ``dbos``: the durable-execution peer (``bench.dbos_anchor``): one DBOS workflow with
  one step per effect, in this process, on a system database of its own on the same
  server;
- ``api``: the REST API under gunicorn, whose workers count the statements each request
  sends (``bench.gunicorn_conf``).

Then per effect, for batches of several effects (the parallel tool calls of one model
turn): ``essential_x5`` is the essential statements of 5 effects in two transactions,
``dbos_x5`` one workflow with 5 steps, ``api_x5`` the API's batch requests (the hook
``api_batch_phase``; "n/a" while the API has none); and the same for 20.

Each path (the batches too) runs twice, in the order listed and then in reverse, half
the lifecycles each time, so that a change in the machine's load during the run weighs
on all alike. For each: throughput, latency per step, statements per lifecycle, and the
CPU time per lifecycle of the app (gunicorn's processes), of PostgreSQL (the backends of
the bench database) and of the client (this process), from ``/proc``
(``bench.procstat``). DBOS runs in the client's process, so its app is this process and
its client nothing apart; its PostgreSQL is the backends of its own database. One
traced lifecycle of each path gives the statements by name, and the API's beyond the
essential ones.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg

from . import procstat
from .dbos_anchor import DbosPeer
from .essential import EssentialRunner
from .gunicorn_conf import CPU_HEADER, STATEMENTS_HEADER
from .lifecycle_report import per_effect
from .lifecycle_seats import (
    BATCH_SIZES,
    LEASE_S,
    ORDER,
    PEERS,
    WARM_PER_THREAD,
    Seat,
    batch_path,
    batch_size,
    make_seats,
    seat_arguments,
)
from .lifecycle_sql import SqlRunner
from .lifecycle_trace import (
    dbos_labels,
    trace_api,
    trace_essential,
    trace_essential_batch,
    trace_replica,
)
from .statements import beyond, labels
from .timing import latency_ms, on_threads

# --- CPU -----------------------------------------------------------------------------------


class CpuMeter:
    """CPU ticks of the app, PostgreSQL and the client, read before and after a phase.

    PostgreSQL's share is that of every client backend connected to the bench database
    (gunicorn's, the raw-psycopg runners'; idle ones add nothing), not of the server's
    shared processes (WAL writer, checkpointer), which also work for other databases.
    """

    def __init__(self, url: str, gunicorn_pid: int, peer_database: str = "") -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.gunicorn_pid = gunicorn_pid
        self.database = self.conn.info.dbname
        self.peer_database = peer_database

    def close(self) -> None:
        self.conn.close()

    def _backends(self, database: str) -> list[int]:
        rows = self.conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s "
            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
            (database,),
        ).fetchall()
        return [pid for (pid,) in rows]

    def read(self, *, in_process: bool = False) -> dict[str, dict[int, int]]:
        """The three groups' ticks. ``in_process``: the app is a library in this process
        (DBOS) on the peer's database, so the app is this process and the client no
        process apart."""
        if in_process:
            return {
                "app": procstat.cpu_ticks([os.getpid()]),
                "postgres": procstat.cpu_ticks(self._backends(self.peer_database)),
                "client": {},
            }
        app = [self.gunicorn_pid, *procstat.children(self.gunicorn_pid)]
        return {
            "app": procstat.cpu_ticks(app),
            "postgres": procstat.cpu_ticks(self._backends(self.database)),
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
    # Effects per batch (1: single calls); ``lifecycles`` counts effects, and
    # ``per_lifecycle_statements`` is then per batch.
    batch: int = 1
    # The app runs in the client's process (DBOS): its CPU is the app's.
    in_process: bool = False

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
        self.batch = other.batch
        self.in_process = other.in_process

    def report(self) -> dict[str, Any]:
        per = {group: round(ms / self.lifecycles, 2) for group, ms in self.cpu_ms.items()}
        per["total"] = round(sum(self.cpu_ms.values()) / self.lifecycles, 2)
        return {
            "lifecycles": self.lifecycles,
            "wall_s": round(self.wall_s, 2),
            "lifecycles_s": round(self.lifecycles / self.wall_s, 1),
            "steps": {step: latency_ms(values) for step, values in self.steps.items()},
            "statements_per_lifecycle": round(self.statements / self.lifecycles, 2),
            f"statements_per_{'lifecycle' if self.batch == 1 else 'batch'}_seen": {
                str(count): times for count, times in sorted(self.per_lifecycle_statements.items())
            },
            **({"batch": self.batch} if self.batch > 1 else {}),
            **({"in_process": True} if self.in_process else {}),
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


def _collect(
    per_thread: list[tuple[dict[str, list[float]], list[int]]], wall: float, batch: int = 1
) -> Phase:
    """A phase from its threads' step latencies and statement counts (one count per
    lifecycle, or per batch of ``batch`` effects)."""
    phase = Phase(wall_s=wall, batch=batch)
    for steps, counts in per_thread:
        for step, values in steps.items():
            phase.steps.setdefault(step, []).extend(values)
        phase.lifecycles += len(counts) * batch
        phase.statements += sum(counts)
        for count in counts:
            phase.per_lifecycle_statements[count] = phase.per_lifecycle_statements.get(count, 0) + 1
    return phase


def _counted(response: httpx.Response, header: str) -> int:
    """A figure the bench's gunicorn configuration adds to each response; 0 from a server
    without it (``bench.servers`` serves the API plain)."""
    return int(response.headers.get(header, 0))


def _django_cpu_ms(per_thread: list[Counter[str]]) -> dict[str, float]:
    """CPU ms inside the Django application per step; none when no response said."""
    total = sum(per_thread, Counter())
    return {step: us / 1000 for step, us in total.items()} if any(total.values()) else {}


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
                    "arguments": seat_arguments(index, n),
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
            counts.append(sum(_counted(r, STATEMENTS_HEADER) for r in (registered, done)))
            for step, response in (("register_claim", registered), ("outcome", done)):
                django_us[step] += _counted(response, CPU_HEADER)
        django_cpu_us.append(django_us)
        return steps, counts

    django_cpu_us: list[Counter[str]] = []
    started = time.perf_counter()
    per_thread_results = on_threads(len(seats), thread)
    phase = _collect(per_thread_results, time.perf_counter() - started)
    phase.django_cpu_ms = _django_cpu_ms(django_cpu_us)
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
                arguments=seat_arguments(index, n),
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
                arguments=seat_arguments(index, n),
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


def dbos_phase(peer: DbosPeer, threads: int, per_thread: int, tag: str) -> Phase:
    """Each effect one DBOS workflow of one step, its workflow id the operation key."""

    def thread(index: int) -> tuple[dict[str, list[float]], list[int]]:
        steps: dict[str, list[float]] = {"workflow": []}
        counts = []
        for n in range(per_thread):
            before = peer.statements
            t0 = time.perf_counter()
            downstream = peer.one(f"{tag}-{index}-{n}", seat_arguments(index, n))
            t1 = time.perf_counter()
            assert downstream == f"re_{index}_{n}", downstream
            steps["workflow"].append(t1 - t0)
            counts.append(peer.statements - before)
        return steps, counts

    started = time.perf_counter()
    per_thread_results = on_threads(threads, thread)
    phase = _collect(per_thread_results, time.perf_counter() - started)
    phase.in_process = True
    return phase


# --- batches of effects ----------------------------------------------------------------------


def _batch_arguments(index: int, n: int, size: int) -> list[dict[str, Any]]:
    return [seat_arguments(index, n * size + i) for i in range(size)]


def essential_batch_phase(
    runners: list[EssentialRunner], seats: list[Seat], per_thread: int, tag: str, size: int
) -> Phase:
    """Batches of ``size`` effects in the essential statements: register and claim all in
    one transaction, the outcomes of all in another (``EssentialRunner.*_batch``)."""

    def thread(index: int) -> tuple[dict[str, list[float]], list[int]]:
        seat, sql = seats[index], runners[index]
        steps: dict[str, list[float]] = {"register_claim": [], "outcome": []}
        counts = []
        for n in range(per_thread):
            arguments = _batch_arguments(index, n, size)
            before = sql.statements
            t0 = time.perf_counter()
            claimed = sql.register_claim_batch(
                run_id=seat.run_id,
                principal=seat.principal,
                items=[(f"{tag}-{index}-{n}-{i}", args) for i, args in enumerate(arguments)],
                lease_s=LEASE_S,
            )
            t1 = time.perf_counter()
            assert len(claimed) == size, claimed
            done = sql.outcome_batch(
                run_id=seat.run_id,
                outcomes=[
                    (op_id, number, {"kind": "succeeded", "downstream_id": f"re_{index}_{n}_{i}"})
                    for i, (op_id, number) in enumerate(claimed)
                ],
            )
            t2 = time.perf_counter()
            assert len(done) == size, done
            steps["register_claim"].append(t1 - t0)
            steps["outcome"].append(t2 - t1)
            counts.append(sql.statements - before)
        return steps, counts

    started = time.perf_counter()
    per_thread_results = on_threads(len(seats), thread)
    return _collect(per_thread_results, time.perf_counter() - started, batch=size)


def dbos_batch_phase(peer: DbosPeer, threads: int, per_thread: int, tag: str, size: int) -> Phase:
    """Batches of ``size`` effects as DBOS writes them: one workflow with ``size`` steps."""

    def thread(index: int) -> tuple[dict[str, list[float]], list[int]]:
        steps: dict[str, list[float]] = {"workflow": []}
        counts = []
        for n in range(per_thread):
            arguments = _batch_arguments(index, n, size)
            before = peer.statements
            t0 = time.perf_counter()
            downstream = peer.batch(f"{tag}-{index}-{n}", arguments)
            t1 = time.perf_counter()
            assert len(downstream) == size, downstream
            steps["workflow"].append(t1 - t0)
            counts.append(peer.statements - before)
        return steps, counts

    started = time.perf_counter()
    per_thread_results = on_threads(threads, thread)
    phase = _collect(per_thread_results, time.perf_counter() - started, batch=size)
    phase.in_process = True
    return phase


def api_batch_phase(
    clients: list[httpx.Client], seats: list[Seat], per_thread: int, tag: str, size: int
) -> Phase | None:
    """Batches of ``size`` effects through the API's batch endpoints: per batch, one
    ``POST /operations`` with ``size`` registrations of the seat's run, each with its own
    operation key and an inline claim, then one ``POST /runs/{run}/outcomes`` with the
    ``size`` outcomes. The essential counterpart is ``essential_batch_phase``."""

    def thread(index: int) -> tuple[dict[str, list[float]], list[int]]:
        seat, http = seats[index], clients[index]
        steps: dict[str, list[float]] = {"register_claim": [], "outcome": []}
        counts = []
        django_us: Counter[str] = Counter()
        for n in range(per_thread):
            arguments = _batch_arguments(index, n, size)
            t0 = time.perf_counter()
            registered = http.post(
                "/operations",
                json=[
                    {
                        "run": seat.run_id,
                        "tool": seat.tool,
                        "operation_key": f"{tag}-{index}-{n}-{i}",
                        "arguments": args,
                        "claim": {"lease_s": LEASE_S},
                    }
                    for i, args in enumerate(arguments)
                ],
            )
            t1 = time.perf_counter()
            assert registered.status_code == 200, registered.text
            items = registered.json()["results"]
            assert len(items) == size, items
            outcomes = []
            for i, item in enumerate(items):
                assert item["status"] == 201, item
                op = item["operation"]
                assert op["attempt"] is not None, op
                outcomes.append(
                    {
                        "operation": op["id"],
                        "attempt": op["attempt"]["attempt"],
                        "kind": "succeeded",
                        "downstream_id": f"re_{index}_{n}_{i}",
                    }
                )
            done = http.post(f"/runs/{seat.run_id}/outcomes", json=outcomes)
            t2 = time.perf_counter()
            assert done.status_code == 200, done.text
            assert [item["status"] for item in done.json()["results"]] == [200] * size, done.text
            steps["register_claim"].append(t1 - t0)
            steps["outcome"].append(t2 - t1)
            counts.append(sum(_counted(r, STATEMENTS_HEADER) for r in (registered, done)))
            for step, response in (("register_claim", registered), ("outcome", done)):
                django_us[step] += _counted(response, CPU_HEADER)
        django_cpu_us.append(django_us)
        return steps, counts

    django_cpu_us: list[Counter[str]] = []
    started = time.perf_counter()
    per_thread_results = on_threads(len(seats), thread)
    phase = _collect(per_thread_results, time.perf_counter() - started, batch=size)
    phase.django_cpu_ms = _django_cpu_ms(django_cpu_us)
    return phase


# --- (a) ---------------------------------------------------------------------------------------


def lifecycle(
    *,
    base_url: str,
    database_url: str,
    peer_database_url: str,
    gunicorn_pid: int,
    trace_dir: Path,
    threads: int,
    lifecycles: int,
    contract: dict[str, Any],
    batch_sizes: tuple[int, ...] = BATCH_SIZES,
    batch_effects: int | None = None,
) -> dict[str, Any]:
    """Part (a). ``peer_database_url``: DBOS's system database, made afresh;
    ``batch_effects``: effects per batch path (default twice ``lifecycles``)."""
    per_thread = max(2, lifecycles // threads)
    halves = (per_thread // 2, per_thread - per_thread // 2)
    batch_effects = batch_effects or 2 * lifecycles
    batches = {size: max(2, round(batch_effects / (threads * size))) for size in batch_sizes}
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
    print("(a) lifecycle: DBOS on its own system database", file=sys.stderr)
    peer = DbosPeer(peer_database_url)
    # DBOS's background threads (its notifier wakes every 10 ms) run in this process
    # through every phase: what they cost idle is in every path's client figure.
    idle_started = time.process_time()
    time.sleep(1)
    dbos_idle_ms = (time.process_time() - idle_started) * 1000
    meter = CpuMeter(database_url, gunicorn_pid, peer_database=peer_database_url.rsplit("/", 1)[1])
    run: dict[str, Any] = {
        "essential": lambda n, tag: essential_phase(essential, seats["essential"], n, tag),
        "replica": lambda n, tag: replica_phase(replicas["replica"], seats["replica"], n, tag),
        "unprepared": lambda n, tag: replica_phase(
            replicas["unprepared"], seats["unprepared"], n, tag
        ),
        "dbos": lambda n, tag: dbos_phase(peer, threads, n, tag),
        "api": lambda n, tag: api_phase(clients, seats["api"], n, tag),
    }
    for size in batch_sizes:
        run[batch_path("essential", size)] = lambda n, tag, size=size: essential_batch_phase(
            essential, seats["essential"], n, tag, size
        )
        run[batch_path("dbos", size)] = lambda n, tag, size=size: dbos_batch_phase(
            peer, threads, n, tag, size
        )
        run[batch_path("api", size)] = lambda n, tag, size=size: api_batch_phase(
            clients, seats["api"], n, tag, size
        )
    order = [*ORDER, *(batch_path(kind, size) for size in batch_sizes for kind in PEERS)]
    try:
        # Warm every path up (gunicorn's threads and connections, prepared statements,
        # DBOS's pool), then trace one lifecycle of each. A batch path that answers None
        # (the API without batch endpoints) is left out.
        for name in order:
            size = batch_size(name)
            warm = run[name](2 if size else WARM_PER_THREAD, f"warm-{name}")
            if warm is None:
                run.pop(name)
        order = [name for name in order if name in run]
        traces = {
            "essential": trace_essential(essential[0], seats["essential"][0]),
            "replica": trace_replica(replicas["replica"][0], seats["replica"][0]),
            "api": trace_api(clients[0], seats["api"][0], trace_dir),
        }
        batch_traces = {
            batch_path("essential", size): trace_essential_batch(
                essential[0], seats["essential"][0], size
            )
            for size in batch_sizes
        }
        dbos_trace = peer.traced("traced", seat_arguments(0, 0))
        print(
            f"(a) lifecycle: {per_thread * threads} per path, {threads} threads; batches of "
            + ", ".join(f"{size} ({batches[size] * threads * size} effects)" for size in batches),
            file=sys.stderr,
        )
        paths = {name: Phase() for name in order}
        for half, sequence in enumerate((order, list(reversed(order)))):
            for name in sequence:
                size = batch_size(name)
                count = (
                    halves[half] if not size else batches[size] // 2 + half * (batches[size] % 2)
                )
                in_process = name.startswith("dbos")
                before = meter.read(in_process=in_process)
                phase = run[name](count, f"{name}-{half}")
                after = meter.read(in_process=in_process)
                phase.cpu_ms, phase.backends_lost = meter.spent(before, after)
                paths[name].add(phase)
    finally:
        meter.close()
        peer.close()
        for http in clients:
            http.close()
        for sql in (*essential, *replicas["replica"], *replicas["unprepared"]):
            sql.close()

    named = {
        name: {step: labels(statements) for step, statements in trace.items()}
        for name, trace in traces.items()
    }
    named["dbos"] = {"workflow": dbos_labels(dbos_trace)}
    for name, trace in batch_traces.items():
        named[name] = {step: labels(statements) for step, statements in trace.items()}
    flat = {name: [label for step in named[name].values() for label in step] for name in named}
    usual = {
        name: Counter(paths[name].per_lifecycle_statements).most_common(1)[0][0] for name in ORDER
    }
    reports = {name: paths[name].report() for name in order}
    return {
        "threads": threads,
        "lifecycles_per_path": per_thread * threads,
        "order": ", ".join(order) + ", then in reverse (half the lifecycles each)",
        "paths": reports,
        "statements": named,
        "api_beyond_essential": beyond(flat["api"], flat["essential"]),
        "essential_beyond_api": beyond(flat["essential"], flat["api"]),
        # The count most lifecycles sent: the traced one may have met a cold cache.
        "usual_statements": usual,
        "traced_statements": {name: len(labels) for name, labels in flat.items()},
        "replica_matches_api": usual["replica"] == usual["api"],
        "peer": per_effect(reports, batch_sizes),
        "dbos_idle_cpu_ms_per_s": round(dbos_idle_ms, 1),
    }
