"""gunicorn or granian for the runner API: the same load on both, alternated.

    python -m bench.servers [--lifecycles 320] [--threads 8] [--rounds 2]
                            [--batch-size 20] [--batch-effects 320]
                            [--database effectgate_servers] [--json var/bench-servers.json]

Would a Rust HTTP server serve the runner API's hot path with less CPU than gunicorn's
gthread workers? Both serve ``console.wsgi`` on the same fresh PostgreSQL database
(``--database`` on ``DATABASE_URL``'s server), with the same production settings (the
environment of ``bench.stack.Stack``: ``DEBUG=0``, one ``SECRET_KEY`` for every server
of the run, connections kept through the run), 2 worker processes of 4 threads each:

- **gunicorn**: gthread workers, as docs/deployment.md runs it (without the bench's
  statement-counting configuration, which granian cannot load);
- **granian**: its WSGI interface, 2 workers of 4 blocking threads, HTTP/1 only, no
  websockets (``Stack(server="granian")``).

Each round starts each server afresh, gunicorn then granian in even rounds and the
other way round in odd ones (ABBA), so that a change in the machine's load weighs on
both alike. In each, ``--threads`` client threads, each a runner, a tool and a run of
its own (``bench.lifecycle_seats.make_seats``), warm the server up (10 lifecycles and one
batch per thread), then it measures

- **single**: register with an inline claim, then the outcome, two requests per
  lifecycle (``bench.lifecycle.api_phase``);
- **batch**: ``--batch-size`` registrations in one ``POST /api/v1/operations`` array,
  then their outcomes in one ``POST /api/v1/runs/{run}/outcomes``
  (``bench.lifecycle.api_batch_phase``), figures per effect;

with ``--lifecycles`` and ``--batch-effects`` per server over all rounds. CPU comes
from ``/proc`` (``bench.lifecycle.CpuMeter``): the server's main process and its
workers, the PostgreSQL backends of the database, the client (this process); and the
ratios granian / gunicorn for throughput and CPU, all measured in this one run.

Checks: every answer's status (the phases refuse any other), and at the end the
database holds, for each server's tools, as many operations as were sent, all
``succeeded``. Exit status 1 otherwise. Figures go to stdout and ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from .bench import DEFAULT_SERVER, contract, machine
from .lifecycle import CpuMeter, Phase, api_batch_phase, api_client, api_phase
from .lifecycle_seats import WARM_PER_THREAD, make_seats
from .stack import SERVERS, VAR, Stack, fresh_database, is_postgres
from .timing import latency_ms

WORKERS = 2
THREADS_PER_WORKER = 4
PATHS = ("single", "batch")
# CpuMeter's groups, by the names this report gives them.
GROUPS = {"app": "server", "postgres": "postgres", "client": "client"}


def order(rounds: int) -> list[str]:
    """The servers one after the other, ABBA: gunicorn first in even rounds."""
    return [
        name
        for index in range(rounds)
        for name in (SERVERS if index % 2 == 0 else tuple(reversed(SERVERS)))
    ]


def tool_prefix(server: str) -> str:
    """What the names of a server's tools start with (``make_seats``: bench_<tag>_<n>)."""
    return f"bench_{server}"


def serve(
    url: str,
    server: str,
    index: int,
    args: argparse.Namespace,
    env: dict[str, str],
) -> dict[str, Phase]:
    """One round of one server: started afresh, warmed up, both paths measured."""
    per_thread, batches = sizes(args)
    with Stack(
        url,
        server=server,
        workers=WORKERS,
        threads=THREADS_PER_WORKER,
        loops=False,
        runner_name=f"servers-{server}-{index}",
        log_dir=VAR / "bench" / "servers",
        env=env,
    ) as stack:
        seats = make_seats(
            stack.base_url, count=args.threads, tag=f"{server}{index}", contract=contract()
        )
        clients = [api_client(stack.base_url, seat) for seat in seats]
        meter = CpuMeter(url, stack.server_pid)
        try:
            api_phase(clients, seats, WARM_PER_THREAD, f"warm-{index}")
            api_batch_phase(clients, seats, 1, f"warm-batch-{index}", args.batch_size)
            run = {
                "single": lambda: api_phase(clients, seats, per_thread, f"single-{index}"),
                "batch": lambda: api_batch_phase(
                    clients, seats, batches, f"batch-{index}", args.batch_size
                ),
            }
            phases = {}
            for path in PATHS:
                before = meter.read()
                phase = run[path]()
                after = meter.read()
                phase.cpu_ms, phase.backends_lost = meter.spent(before, after)
                phases[path] = phase
            return phases
        finally:
            meter.close()
            for http in clients:
                http.close()


def sizes(args: argparse.Namespace) -> tuple[int, int]:
    """Lifecycles and batches per client thread in each round of each server."""
    per_round = args.rounds * args.threads
    return (
        max(1, args.lifecycles // per_round),
        max(1, round(args.batch_effects / (per_round * args.batch_size))),
    )


def sent(args: argparse.Namespace) -> int:
    """The operations each server's rounds register, warm-up included."""
    per_thread, batches = sizes(args)
    per_round = WARM_PER_THREAD + per_thread + (1 + batches) * args.batch_size
    return args.rounds * args.threads * per_round


def figures(phase: Phase) -> dict[str, Any]:
    """Throughput, CPU and latency of a server's path, per lifecycle (per effect for
    batches)."""
    cpu = {GROUPS[group]: ms / phase.lifecycles for group, ms in phase.cpu_ms.items()}
    return {
        "lifecycles": phase.lifecycles,
        "wall_s": round(phase.wall_s, 2),
        "lifecycles_s": round(phase.lifecycles / phase.wall_s, 1),
        "cpu_ms_per_lifecycle": {
            **{group: round(ms, 2) for group, ms in cpu.items()},
            "total": round(sum(cpu.values()), 2),
        },
        "steps": {step: latency_ms(values) for step, values in phase.steps.items()},
        "postgres_backends_lost": phase.backends_lost,
        **({"batch": phase.batch} if phase.batch > 1 else {}),
    }


def ratios(paths: dict[str, dict[str, Any]]) -> dict[str, float]:
    """granian's figures over gunicorn's, for one path."""
    granian, gunicorn = paths["granian"], paths["gunicorn"]
    cpu_g, cpu_u = granian["cpu_ms_per_lifecycle"], gunicorn["cpu_ms_per_lifecycle"]
    return {
        "throughput": round(granian["lifecycles_s"] / gunicorn["lifecycles_s"], 3),
        "server_cpu": round(cpu_g["server"] / cpu_u["server"], 3),
        "total_cpu": round(cpu_g["total"] / cpu_u["total"], 3),
    }


def count_operations() -> dict[str, dict[str, int]]:
    """Each server's operations in the database, all and ``succeeded``."""
    from django.db import connections

    from operations.models import Operation

    try:
        return {
            server: {
                "operations": Operation.objects.filter(
                    tool__name__startswith=tool_prefix(server)
                ).count(),
                "succeeded": Operation.objects.filter(
                    tool__name__startswith=tool_prefix(server), status="succeeded"
                ).count(),
            }
            for server in SERVERS
        }
    finally:
        connections.close_all()


# --- main ------------------------------------------------------------------------------------


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.servers", description=__doc__)
    parser.add_argument(
        "--lifecycles", type=int, default=320, help="single lifecycles per server, all rounds"
    )
    parser.add_argument("--threads", type=int, default=8, help="client threads")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of both servers (ABBA)")
    parser.add_argument("--batch-size", type=int, default=20, help="effects per batch")
    parser.add_argument(
        "--batch-effects", type=int, help="effects in batches per server (default: --lifecycles)"
    )
    parser.add_argument(
        "--database",
        default="effectgate_servers",
        help="the database to drop and create on DATABASE_URL's server",
    )
    parser.add_argument("--json", type=Path, default=VAR / "bench-servers.json")
    args = parser.parse_args(argv)
    if args.batch_effects is None:
        args.batch_effects = args.lifecycles
    if min(args.lifecycles, args.threads, args.rounds, args.batch_size) < 1:
        parser.error("sizes must be at least 1")
    if args.batch_size > 50:
        parser.error("--batch-size: the API takes at most 50 items per batch")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    base = os.environ.get("DATABASE_URL") or DEFAULT_SERVER
    if not is_postgres(base):
        print("bench.servers needs PostgreSQL: DATABASE_URL a postgres:// URL", file=sys.stderr)
        return 2
    url = fresh_database(args.database, base_url=base)
    # Django in this process, on the bench's database: the seats' runners are made by
    # the service, and the end's count reads the ledger.
    os.environ["DATABASE_URL"] = url
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    # The same settings for every server of the run (Stack adds the rest of its own).
    env = {
        "SECRET_KEY": os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50),
        # Connections live through the run, so that no PostgreSQL backend (and its CPU
        # time) goes away in the middle of a measure; the default is 60 s.
        "DB_CONN_MAX_AGE": "600",
    }
    sequence = order(args.rounds)
    per_thread, batches = sizes(args)
    report: dict[str, Any] = {
        "machine": machine(),
        "database": url.rsplit("@", 1)[-1],
        "servers": {
            "gunicorn": f"gthread, {WORKERS} workers x {THREADS_PER_WORKER} threads",
            "granian": f"WSGI, {WORKERS} workers x {THREADS_PER_WORKER} blocking threads",
        },
        "threads": args.threads,
        "rounds": args.rounds,
        "order": sequence,
        "batch_size": args.batch_size,
    }
    totals = {path: {server: Phase() for server in SERVERS} for path in PATHS}
    per_round: dict[str, dict[str, list[dict[str, Any]]]] = {
        path: {server: [] for server in SERVERS} for path in PATHS
    }
    failures: list[str] = []
    print(
        f"servers: {per_thread * args.threads} lifecycles and {batches * args.threads} batches"
        f" of {args.batch_size} per round, {args.threads} client threads, order "
        + ", ".join(sequence),
        file=sys.stderr,
    )
    for position, server in enumerate(sequence):
        index = position // 2
        print(f"servers: round {index + 1}, {server}", file=sys.stderr)
        try:
            phases = serve(url, server, index, args, env)
        except AssertionError as refused:
            # A phase met an answer it did not expect: the run says so and stops.
            failures.append(f"{server}, round {index + 1}: {str(refused)[:500]}")
            break
        for path, phase in phases.items():
            totals[path][server].add(phase)
            per_round[path][server].append(figures(phase))
    report["machine"]["load_average_at_end"] = [round(load, 2) for load in os.getloadavg()]
    if not failures:
        paths = {
            path: {server: figures(totals[path][server]) for server in SERVERS} for path in PATHS
        }
        report["paths"] = paths
        report["rounds_figures"] = per_round
        report["granian_over_gunicorn"] = {path: ratios(paths[path]) for path in PATHS}
    expected = sent(args)
    counted = count_operations()
    report["checks"] = {server: {"expected": expected, **counted[server]} for server in SERVERS}
    for server, check in report["checks"].items():
        if not failures and not check["operations"] == check["succeeded"] == expected:
            failures.append(
                f"{server}: {check['succeeded']} succeeded of {check['operations']} operations,"
                f" {expected} sent"
            )
    report["failures"] = failures
    report["ok"] = not failures
    print(summary(report))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.json}")
    return 0 if report["ok"] else 1


def summary(report: dict[str, Any]) -> str:
    lines = [
        "",
        "servers: the runner API under gunicorn (gthread) and granian (WSGI), "
        f"{WORKERS} workers x {THREADS_PER_WORKER} threads, {report['threads']} client"
        f" threads, {report['rounds']} round{'s' if report['rounds'] != 1 else ''}"
        f" ({', '.join(report['order'])})",
    ]
    titles = {
        "single": "single lifecycle (register with inline claim -> outcome), per lifecycle",
        "batch": f"batch of {report['batch_size']} (one POST /operations array, one"
        " POST /runs/{run}/outcomes), per effect",
    }
    for path in PATHS if "paths" in report else ():
        rows = report["paths"][path]
        rate = "lifecycles/s" if path == "single" else "effects/s"
        lines += [
            f"  {titles[path]}, {rows['gunicorn']['lifecycles']} per server",
            f"    {'server':<10}{rate:>13}{'CPU ms: server':>16}{'postgres':>10}"
            f"{'client':>8}{'total':>8}   p50 / p99 ms per request",
        ]
        for server in SERVERS:
            row = rows[server]
            cpu = row["cpu_ms_per_lifecycle"]
            steps = "   ".join(
                f"{step} {values['p50_ms']:.1f} / {values['p99_ms']:.1f}"
                for step, values in row["steps"].items()
            )
            lines.append(
                f"    {server:<10}{row['lifecycles_s']:>13.1f}{cpu['server']:>16.2f}"
                f"{cpu['postgres']:>10.2f}{cpu['client']:>8.2f}{cpu['total']:>8.2f}   {steps}"
            )
        ratio = report["granian_over_gunicorn"][path]
        lines.append(
            f"    granian / gunicorn: throughput {ratio['throughput']:.2f}, server CPU"
            f" {ratio['server_cpu']:.2f}, total CPU {ratio['total_cpu']:.2f}"
        )
        for server in SERVERS:
            lines.append(
                f"      {server} by round: "
                + ", ".join(
                    f"{one['lifecycles_s']:.1f}/s {one['cpu_ms_per_lifecycle']['server']:.2f} ms"
                    for one in report["rounds_figures"][path][server]
                )
            )
    checks = report["checks"]
    lines.append(
        "  the ledger: "
        + ", ".join(
            f"{server} {check['succeeded']} succeeded of {check['operations']}"
            f" ({check['expected']} sent)"
            for server, check in checks.items()
        )
    )
    load = report["machine"]
    lines.append(
        f"  load average {load['load_average_at_start'][0]:.2f} at the start,"
        f" {load['load_average_at_end'][0]:.2f} at the end"
    )
    lines += [f"  FAILED: {failure}" for failure in report["failures"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
