"""Where the app's CPU goes in one lifecycle: cProfile over N lifecycles, in process.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python -m bench.profile --lifecycles 300 [--top 40]

Migrates a database of its own (``effectgate_profile``) on the server ``DATABASE_URL``
names, makes one runner, tool and run, warms up, then runs register+claim and outcome
through Django's full stack (middleware, DRF, services; ``django.test.Client``, no
network, no gunicorn) under cProfile. Prints statements per lifecycle, app CPU per
lifecycle (``time.process_time``, this process only: PostgreSQL's share is not in it)
and the functions with the most time, inclusive and own (CPU time: the profiler's timer
is ``time.process_time``). ``--batch N`` makes each lifecycle a batch of N effects (one
registration batch, one outcome batch) and gives the figures per effect.
docs/benchmarks.md quotes it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

from .bench import SCHEMA
from .stack import is_postgres, recreate_postgres, with_database

# The lifecycle bench's tool (bench/bench.py), without approval.
CONTRACT = {"effect_class": "irreversible", "input_schema": SCHEMA, "approval": {"mode": "never"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lifecycles", type=int, default=300)
    parser.add_argument("--top", type=int, default=35)
    parser.add_argument("--database", default="effectgate_profile")
    parser.add_argument("--save", help="write the raw profile here (pstats format)")
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="effects per lifecycle: N > 1 registers N in one batch request and posts "
        "their outcomes in one (api.md, Batches); figures are then per effect",
    )
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="only the app CPU per lifecycle, without cProfile's own overhead",
    )
    args = parser.parse_args()

    base = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
    if not is_postgres(base):
        sys.exit("bench.profile needs PostgreSQL (DATABASE_URL).")
    url = with_database(base, args.database)
    recreate_postgres(url)
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    os.environ.setdefault("SECRET_KEY", "bench-profile")

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from operations import services

    call_command("migrate", verbosity=0)
    _runner, token = services.runner_create(name="profile", actor=services.Actor.system("bench"))
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_HOST="127.0.0.1")
    put = client.put("/api/v1/tools/profile_refund", CONTRACT, content_type="application/json")
    assert put.status_code in (200, 201), put.content
    run = client.post(
        "/api/v1/runs", {"principal": "user:profile"}, content_type="application/json"
    ).json()

    def lifecycle(n: int) -> int:
        response = client.post(
            "/api/v1/operations",
            {
                "run": run["id"],
                "tool": "profile_refund",
                "operation_key": f"op-{n}",
                "arguments": {"payment_id": f"pay_{n}", "amount_cents": 500},
                "claim": {"lease_s": 30},
            },
            content_type="application/json",
        )
        assert response.status_code == 201, response.content
        body = response.json()
        number = body["attempt"]["attempt"]
        done = client.post(
            f"/api/v1/operations/{body['id']}/attempts/{number}/outcome",
            {"kind": "succeeded", "downstream_id": f"re_{n}"},
            content_type="application/json",
        )
        assert done.status_code == 200, done.content
        return n

    def batch_lifecycle(n: int) -> int:
        size = args.batch
        response = client.post(
            "/api/v1/operations",
            [
                {
                    "run": run["id"],
                    "tool": "profile_refund",
                    "operation_key": f"op-{n}-{i}",
                    "arguments": {"payment_id": f"pay_{n}_{i}", "amount_cents": 500},
                    "claim": {"lease_s": 30},
                }
                for i in range(size)
            ],
            content_type="application/json",
        )
        assert response.status_code == 200, response.content
        ops = [item["operation"] for item in response.json()["results"]]
        assert all(op["status"] == "executing" for op in ops), ops
        done = client.post(
            f"/api/v1/runs/{run['id']}/outcomes",
            [
                {
                    "operation": op["id"],
                    "attempt": op["attempt"]["attempt"],
                    "kind": "succeeded",
                    "downstream_id": f"re_{op['id']}",
                }
                for op in ops
            ],
            content_type="application/json",
        )
        assert done.status_code == 200, done.content
        assert {item["status"] for item in done.json()["results"]} == {200}, done.content
        return n

    if args.batch > 1:
        lifecycle = batch_lifecycle
        args.lifecycles = max(1, args.lifecycles // args.batch)
    per = "effect" if args.batch > 1 else "lifecycle"
    scale = args.lifecycles * args.batch

    for n in range(20):
        lifecycle(-1 - n)
    with CaptureQueriesContext(connection) as queries:
        lifecycle(-100)
    statements = [q["sql"] for q in queries.captured_queries]

    if args.no_profile:
        each = []
        cpu = time.process_time()
        for n in range(args.lifecycles):
            started = time.process_time()
            lifecycle(n)
            each.append(time.process_time() - started)
        cpu_ms = (time.process_time() - cpu) * 1000 / scale
        each.sort()
        median_ms = each[len(each) // 2] * 1000 / args.batch
        print(
            f"statements per {per} (ORM-visible, with BEGIN/COMMIT): "
            f"{len(statements) / args.batch:.2f}"
        )
        print(
            f"app CPU per {per} (in process, no profiler): {cpu_ms:.2f} ms "
            f"(median {median_ms:.2f} ms)"
        )
        return
    # CPU time, not wall time: waiting for PostgreSQL's answers is not the app's work.
    profiler = cProfile.Profile(time.process_time)
    cpu = time.process_time()
    profiler.enable()
    for n in range(args.lifecycles):
        lifecycle(n)
    profiler.disable()
    cpu_ms = (time.process_time() - cpu) * 1000 / scale
    if args.save:
        profiler.dump_stats(args.save)

    print(
        f"statements per {per} (ORM-visible, with BEGIN/COMMIT): {len(statements) / args.batch:.2f}"
    )
    for sql in statements:
        print("   ", sql[:150])
    print(f"app CPU per {per} under cProfile: {cpu_ms:.2f} ms")
    for order in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(args.top)
        print(out.getvalue())


if __name__ == "__main__":
    main()
