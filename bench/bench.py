"""``make bench``: what Effectgate costs, measured on this machine in one run.

    python -m bench.bench [--runners 8] [--lifecycles 2000] [--sizes 10000,1000000]

a. The register -> claim -> outcome lifecycle through the REST API under gunicorn with
   K concurrent runners, then the same SQL transactions through raw psycopg on the same
   database with K connections (``bench.lifecycle_sql``): throughput of each, their
   ratio, p50/p99 of every step.
b. Claim contention: K runners claim the same few hot operations at the same instant
   (one wins each, the rest get ``attempt_in_progress``), and K operations that share one
   concurrency-key value (one wins, the rest get ``concurrency_conflict``); latencies and
   a check that no operation got two attempts.
c. Intent hashing (``operations.canonical.intent_hash``) per call, small and large.
d. The inbox and reconciliation pages and the sweeps at each ledger size: time, query
   count, and sequential scans of big tables in their plans (``bench.scale``).

PostgreSQL only (the raw-psycopg half needs it): a fresh ``effectgate_bench`` database on
the server of ``DATABASE_URL``, or on postgres://postgres@127.0.0.1:5432 without it.
Figures go to stdout and ``var/bench.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import threading
import time
import timeit
import warnings
from pathlib import Path
from typing import Any

import httpx

from effectgate_client import EffectgateClient

from .lifecycle_sql import SqlRunner
from .stack import VAR, Stack, fresh_database, is_postgres

DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/postgres"
TOOL = "bench_refund"
HOT_TOOL = "bench_hot_resource"
LOOKUP_TOOL = "bench_lookup"
SCHEMA = {
    "type": "object",
    "required": ["payment_id", "amount_cents"],
    "properties": {
        "payment_id": {"type": "string"},
        "amount_cents": {"type": "integer", "minimum": 1},
    },
    "additionalProperties": False,
}


def _contract(**overrides: Any) -> dict[str, Any]:
    return {
        "effect_class": "irreversible",
        "input_schema": SCHEMA,
        "approval": {"mode": "never"},
        **overrides,
    }


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by the nearest-rank method, in the values' unit."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def _ms(seconds: list[float]) -> dict[str, float]:
    millis = [value * 1000 for value in seconds]
    return {
        "p50_ms": round(percentile(millis, 50), 2),
        "p99_ms": round(percentile(millis, 99), 2),
        "n": len(millis),
    }


def _threads(count: int, target: Any) -> list[Any]:
    """Run ``target(index)`` on ``count`` threads; their results in index order."""
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def body(index: int) -> None:
        try:
            results[index] = target(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


# --- a. the lifecycle, API and SQL ------------------------------------------------------------


def api_lifecycles(
    base_url: str, token: str, run_ids: list[str], per_runner: int, tag: str
) -> tuple[float, dict[str, list[float]]]:
    def runner(index: int) -> dict[str, list[float]]:
        steps: dict[str, list[float]] = {"register": [], "claim": [], "outcome": []}
        with httpx.Client(
            base_url=f"{base_url}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        ) as http:
            for n in range(per_runner):
                t0 = time.perf_counter()
                op = http.post(
                    "/operations",
                    json={
                        "run": run_ids[index],
                        "tool": TOOL,
                        "operation_key": f"{tag}-{index}-{n}",
                        "arguments": {"payment_id": f"pay_{index}_{n}", "amount_cents": 500},
                    },
                )
                t1 = time.perf_counter()
                assert op.status_code == 201, op.text
                op_id = op.json()["id"]
                claim = http.post(f"/operations/{op_id}/attempts", json={"lease_s": 30})
                t2 = time.perf_counter()
                assert claim.status_code == 201, claim.text
                number = claim.json()["attempt"]
                done = http.post(
                    f"/operations/{op_id}/attempts/{number}/outcome",
                    json={"kind": "succeeded", "downstream_id": f"re_{index}_{n}"},
                )
                t3 = time.perf_counter()
                assert done.status_code == 200, done.text
                steps["register"].append(t1 - t0)
                steps["claim"].append(t2 - t1)
                steps["outcome"].append(t3 - t2)
        return steps

    started = time.perf_counter()
    per_thread = _threads(len(run_ids), runner)
    wall = time.perf_counter() - started
    return wall, {step: [v for steps in per_thread for v in steps[step]] for step in per_thread[0]}


def sql_lifecycles(
    url: str, token: str, run_ids: list[str], per_runner: int, tag: str
) -> tuple[float, dict[str, list[float]], dict[str, int]]:
    """The same lifecycles in hand-written SQL; also the statements each step issued."""
    token_hash = hashlib.sha256(token.encode()).hexdigest()
    runners = [SqlRunner(url, token_hash=token_hash, tool=TOOL) for _ in run_ids]
    statements: dict[str, int] = {}

    def runner(index: int) -> dict[str, list[float]]:
        steps: dict[str, list[float]] = {"register": [], "claim": [], "outcome": []}
        sql = runners[index]
        for n in range(per_runner):
            counted = [sql.statements]
            t0 = time.perf_counter()
            op_id = sql.register(
                run_id=run_ids[index],
                key=f"{tag}-{index}-{n}",
                arguments={"payment_id": f"pay_{index}_{n}", "amount_cents": 500},
            )
            t1 = time.perf_counter()
            counted.append(sql.statements)
            number = sql.claim(op_id, lease_s=30)
            t2 = time.perf_counter()
            counted.append(sql.statements)
            sql.outcome(op_id, number, {"kind": "succeeded", "downstream_id": f"re_{index}_{n}"})
            t3 = time.perf_counter()
            counted.append(sql.statements)
            statements.update(
                register=counted[1] - counted[0],
                claim=counted[2] - counted[1],
                outcome=counted[3] - counted[2],
            )
            steps["register"].append(t1 - t0)
            steps["claim"].append(t2 - t1)
            steps["outcome"].append(t3 - t2)
        return steps

    try:
        started = time.perf_counter()
        per_thread = _threads(len(run_ids), runner)
        wall = time.perf_counter() - started
    finally:
        for sql in runners:
            sql.close()
    steps = {step: [v for steps in per_thread for v in steps[step]] for step in per_thread[0]}
    return wall, steps, statements


def lifecycle(stack: Stack, args: argparse.Namespace, client: EffectgateClient) -> dict[str, Any]:
    k = args.runners
    per_runner = max(1, args.lifecycles // k)
    total = per_runner * k

    def runs(tag: str) -> list[str]:
        return [
            client.create_run(principal="user:bench", external_id=f"{tag}-{i}")["id"]
            for i in range(k)
        ]

    # Warm both paths up (gunicorn workers, connections, prepared statements).
    api_lifecycles(stack.base_url, stack.token, runs("warm-api"), 20, "warm-api")
    sql_lifecycles(stack.database_url, stack.token, runs("warm-sql"), 20, "warm-sql")
    print(f"(a) lifecycle: {total} x register -> claim -> outcome, {k} runners", file=sys.stderr)
    api_wall, api_steps = api_lifecycles(
        stack.base_url, stack.token, runs("api"), per_runner, "api"
    )
    sql_wall, sql_steps, statements = sql_lifecycles(
        stack.database_url, stack.token, runs("sql"), per_runner, "sql"
    )
    api_ops = total / api_wall
    sql_ops = total / sql_wall
    # One runner alone: what a request costs without waiting behind others.
    solo = max(20, total // 20)
    _, api_solo = api_lifecycles(stack.base_url, stack.token, runs("api-solo")[:1], solo, "api1")
    _, sql_solo, _ = sql_lifecycles(
        stack.database_url, stack.token, runs("sql-solo")[:1], solo, "sql1"
    )
    return {
        "runners": k,
        "lifecycles": total,
        "api_wall_s": round(api_wall, 2),
        "sql_wall_s": round(sql_wall, 2),
        "api_ops_s": round(api_ops, 1),
        "sql_ops_s": round(sql_ops, 1),
        "ratio_api_vs_sql": round(sql_ops / api_ops, 2),
        "sql_statements_per_step": statements,
        "api": {step: _ms(values) for step, values in api_steps.items()},
        "sql": {step: _ms(values) for step, values in sql_steps.items()},
        "one_runner": {
            "lifecycles": solo,
            "api": {step: _ms(values) for step, values in api_solo.items()},
            "sql": {step: _ms(values) for step, values in sql_solo.items()},
        },
    }


# --- b. contention ---------------------------------------------------------------------------


def contention(stack: Stack, args: argparse.Namespace, client: EffectgateClient) -> dict:
    k = args.hot_threads
    hot = args.hot_ops
    rounds = args.hot_rounds
    run_id = client.create_run(principal="user:bench", external_id="hot")["id"]
    go = threading.Barrier(k + 1)
    done = threading.Barrier(k + 1)
    targets: list[str] = []
    results: list[list[tuple[int, str, float]]] = [[] for _ in range(k)]

    def claimer(index: int) -> None:
        with httpx.Client(
            base_url=f"{stack.base_url}/api/v1",
            headers={"Authorization": f"Bearer {stack.token}"},
            timeout=60,
        ) as http:
            http.get(f"/runs/{run_id}")  # connect before the race
            for _ in range(rounds * 2):
                go.wait()
                started = time.perf_counter()
                response = http.post(f"/operations/{targets[index]}/attempts", json={"lease_s": 30})
                elapsed = time.perf_counter() - started
                code = "claimed" if response.status_code == 201 else response.json()["code"]
                results[index].append((response.status_code, code, elapsed))
                done.wait()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(k)]
    for thread in threads:
        thread.start()
    violations = 0
    hot_claims: list[float] = []
    key_claims: list[float] = []
    outcomes: dict[str, int] = {}
    for round_number in range(rounds * 2):
        same_key = round_number % 2 == 1
        if same_key:
            # K operations on one resource: the concurrency key admits one at a time.
            ops = [
                client.register(
                    run=run_id,
                    tool=HOT_TOOL,
                    operation_key=f"key-{round_number}-{i}",
                    arguments={"payment_id": "pay_hot", "amount_cents": 1 + i},
                )["id"]
                for i in range(k)
            ]
            targets[:] = ops
        else:
            ops = [
                client.register(
                    run=run_id,
                    tool=TOOL,
                    operation_key=f"hot-{round_number}-{i}",
                    arguments={"payment_id": f"pay_hot_{round_number}_{i}", "amount_cents": 5},
                )["id"]
                for i in range(hot)
            ]
            targets[:] = [ops[i % hot] for i in range(k)]
        go.wait()
        done.wait()
        answers = [results[i][-1] for i in range(k)]
        winners = [targets[i] for i in range(k) if answers[i][0] == 201]
        for _, code, elapsed in answers:
            outcomes[code] = outcomes.get(code, 0) + 1
            (key_claims if same_key else hot_claims).append(elapsed)
        expected = 1 if same_key else hot
        if len(winners) != expected or len(set(winners)) != len(winners):
            violations += 1
        for op_id in set(winners):
            op = client.get_operation(op_id)
            violations += op["attempts"] != 1
            client.post_outcome(op_id, 1, {"kind": "succeeded", "downstream_id": "re_hot"})
    for thread in threads:
        thread.join()
    return {
        "threads": k,
        "hot_operations": hot,
        "rounds": rounds,
        "hot_claims": _ms(hot_claims),
        "same_key_claims": _ms(key_claims),
        "answers": dict(sorted(outcomes.items())),
        "violations": violations,
    }


# --- c. intent hashing -------------------------------------------------------------------------


def hashing() -> dict[str, Any]:
    from operations.canonical import canonical_json, intent_hash

    small = {"payment_id": "pay_123", "amount_cents": 50_000, "reason": "duplicate charge"}
    large = {
        "order": {"id": "ord_1", "currency": "EUR", "customer": {"id": "cus_9", "tier": "gold"}},
        "lines": [
            {"sku": f"sku-{i:04d}", "quantity": i % 7 + 1, "price_cents": 199 * i, "note": "é" * 20}
            for i in range(100)
        ],
    }
    figures = {}
    for name, arguments in (("small", small), ("large", large)):
        size = len(canonical_json({"tool": "t", "arguments": arguments, "principal": "user:a"}))
        number = 20_000 if name == "small" else 500
        seconds = min(
            timeit.repeat(
                lambda arguments=arguments: intent_hash(
                    tool="refund", arguments=arguments, principal="user:alice"
                ),
                number=number,
                repeat=5,
            )
        )
        figures[name] = {"bytes": size, "us_per_call": round(seconds / number * 1e6, 1)}
    return figures


# --- queries per API step, in-process -------------------------------------------------------


def api_queries_per_step(token: str) -> dict[str, int]:
    """The queries one API request of each step makes (Django's query log)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_HOST="127.0.0.1")
    run = client.post(
        "/api/v1/runs", {"principal": "user:bench"}, content_type="application/json"
    ).json()["id"]
    counts = {}
    body = {
        "run": run,
        "tool": TOOL,
        "operation_key": "queries-1",
        "arguments": {"payment_id": "pay_q", "amount_cents": 5},
    }
    with CaptureQueriesContext(connection) as captured:
        op = client.post("/api/v1/operations", body, content_type="application/json").json()
    counts["register"] = len(captured.captured_queries)
    with CaptureQueriesContext(connection) as captured:
        client.post(f"/api/v1/operations/{op['id']}/attempts", {}, content_type="application/json")
    counts["claim"] = len(captured.captured_queries)
    with CaptureQueriesContext(connection) as captured:
        client.post(
            f"/api/v1/operations/{op['id']}/attempts/1/outcome",
            {"kind": "succeeded", "downstream_id": "re_q"},
            content_type="application/json",
        )
    counts["outcome"] = len(captured.captured_queries)
    return counts


# --- d. pages and sweeps at scale -----------------------------------------------------------------


def scale(sizes: list[int], token: str) -> list[dict[str, Any]]:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import override_settings
    from guardian.shortcuts import assign_perm

    from operations import probes, services
    from operations.models import RunnerToken, Tool

    from .scale import CommittedLookup, Ledger

    # Pages are rendered without collectstatic, as in the test suite: the hashed-name
    # manifest is a dictionary lookup per asset, not something the table size changes.
    override_settings(
        STORAGES={
            **settings.STORAGES,
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
        }
    ).enable()
    runner = RunnerToken.objects.get(token_hash=hashlib.sha256(token.encode()).hexdigest()).runner
    lookup = CommittedLookup()
    services.tool_register(
        name=LOOKUP_TOOL,
        body=_contract(reconcile={"mode": "lookup", "url": lookup.url, "max_probes": 5}),
        runner=runner,
    )
    # A console user who may decide and reconcile every tool; it never signs in with a
    # password (force_login), so it has none.
    user = get_user_model().objects.create_user("bench-person")
    for tool in Tool.objects.all():
        for perm in ("operations.decide_tool", "operations.reconcile_tool"):
            assign_perm(perm, user, tool)
    browser = Client(HTTP_HOST="127.0.0.1")
    browser.force_login(user)

    def page(path: str) -> Any:
        def get() -> None:
            response = browser.get(path)
            assert response.status_code == 200, (path, response.status_code)

        return get

    ledger = Ledger(
        runner=runner,
        tool=Tool.objects.get(pk=TOOL),
        lookup_tool=Tool.objects.get(pk=LOOKUP_TOOL),
    )
    figures = []
    try:
        for size in sizes:
            print(f"(d) seeding {size:,} operations", file=sys.stderr)
            seed_s = ledger.grow(size, log=lambda line: print(line, file=sys.stderr))
            rows = [
                ledger.measure("inbox /", page("/")),
                ledger.measure("reconciliation /reconciliation/", page("/reconciliation/")),
            ]
            rows.append(
                ledger.measure(
                    "sweep, 50 leases due",
                    services.sweep,
                    repeat=3,
                    prepare=ledger.add_due_leases,
                )
            )
            rows.append(ledger.measure("sweep, nothing due", services.sweep))
            rows.append(
                ledger.measure(
                    "probe_due, 50 lookups due",
                    probes.probe_due,
                    repeat=3,
                    prepare=ledger.add_due_probes,
                )
            )
            rows.append(ledger.measure("probe_due, nothing due", probes.probe_due))
            figures.append({"operations": size, "seed_s": round(seed_s, 1), "measures": rows})
            for row in rows:
                scans = ", ".join(scan["table"] for scan in row["seq_scans"])
                print(
                    f"    {row['name']:<32} {row['ms']:>8.1f} ms (database {row['db_ms']:>6.1f} ms"
                    f" best, {row['db_ms_median']:>6.1f} median)"
                    f" {row['queries']:>4} queries"
                    + (f"  sequential scan of {scans}" if scans else ""),
                    file=sys.stderr,
                )
    finally:
        lookup.close()
    return figures


# --- main -----------------------------------------------------------------------------------------


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.bench", description=__doc__)
    parser.add_argument("--runners", type=int, default=8, help="K concurrent runners")
    parser.add_argument("--lifecycles", type=int, default=2000)
    parser.add_argument("--hot-threads", type=int, default=16)
    parser.add_argument("--hot-ops", type=int, default=2)
    parser.add_argument("--hot-rounds", type=int, default=25)
    parser.add_argument(
        "--sizes",
        default=os.environ.get("SIZES") or "10000,1000000",
        help="ledger sizes for the pages and sweeps, comma-separated",
    )
    parser.add_argument("--gunicorn-workers", type=int, default=4)
    parser.add_argument("--gunicorn-threads", type=int, default=4)
    parser.add_argument("--json", type=Path, default=VAR / "bench.json")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    # WhiteNoise looks for collected static files, which the in-process pages do not use.
    warnings.filterwarnings("ignore", message="No directory at")
    base = os.environ.get("DATABASE_URL") or DEFAULT_SERVER
    if not is_postgres(base):
        print("make bench needs PostgreSQL: set DATABASE_URL to a postgres:// URL", file=sys.stderr)
        return 2
    url = fresh_database("effectgate_bench", base_url=base)
    sizes = [int(size) for size in args.sizes.split(",") if size]
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            # Other work on the machine skews every figure; the load says how much.
            "load_average_at_start": [round(load, 2) for load in os.getloadavg()],
        },
        "database": url.rsplit("@", 1)[-1],
    }
    with Stack(
        url,
        workers=args.gunicorn_workers,
        threads=args.gunicorn_threads,
        loops=False,
        runner_name="bench",
        log_dir=VAR / "bench" / "bench",
    ) as stack:
        with EffectgateClient(stack.base_url, stack.token) as client:
            client.put_tool(TOOL, _contract())
            client.put_tool(HOT_TOOL, _contract(concurrency_key="/payment_id"))
            report["lifecycle"] = lifecycle(stack, args, client)
            print("(b) claim contention", file=sys.stderr)
            report["contention"] = contention(stack, args, client)
        token = stack.token
    print("(c) intent hashing", file=sys.stderr)
    report["intent_hash"] = hashing()

    os.environ["DATABASE_URL"] = url
    os.environ["RECONCILE_ALLOWED_HOSTS"] = "127.0.0.1"
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    report["api_queries_per_step"] = api_queries_per_step(token)
    report["scale"] = scale(sizes, token)

    report["machine"]["load_average_at_end"] = [round(load, 2) for load in os.getloadavg()]
    life = report["lifecycle"]
    report.update(
        lifecycle_ratio_api_vs_sql=life["ratio_api_vs_sql"],
        lifecycle_api_ops_s=life["api_ops_s"],
        lifecycle_sql_ops_s=life["sql_ops_s"],
        claim_p50_ms=life["api"]["claim"]["p50_ms"],
        claim_p99_ms=life["api"]["claim"]["p99_ms"],
    )
    print(summary(report))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.json}")
    return 0 if report["contention"]["violations"] == 0 else 1


def summary(report: dict[str, Any]) -> str:
    life = report["lifecycle"]
    hot = report["contention"]
    lines = [
        "",
        f"(a) lifecycle, {life['lifecycles']} x register -> claim -> outcome, "
        f"{life['runners']} concurrent runners",
        f"    REST API (gunicorn)  {life['api_ops_s']:>8.1f} lifecycles/s",
        f"    raw SQL (psycopg)    {life['sql_ops_s']:>8.1f} lifecycles/s",
        f"    API costs {life['ratio_api_vs_sql']}x the raw SQL",
        "    step        API p50/p99 ms     SQL p50/p99 ms   queries API / SQL",
    ]
    queries = report.get("api_queries_per_step", {})
    sql_per_step = life["sql_statements_per_step"]
    for step in ("register", "claim", "outcome"):
        api, sql = life["api"][step], life["sql"][step]
        lines.append(
            f"    {step:<10} {api['p50_ms']:>7.1f} / {api['p99_ms']:<7.1f}"
            f"   {sql['p50_ms']:>6.1f} / {sql['p99_ms']:<7.1f}"
            f"   {queries.get(step, '?'):>5} / {sql_per_step[step]}"
        )
    solo = life["one_runner"]
    lines.append(
        "    one runner alone, p50 ms API / SQL: "
        + ", ".join(
            f"{step} {solo['api'][step]['p50_ms']} / {solo['sql'][step]['p50_ms']}"
            for step in ("register", "claim", "outcome")
        )
    )
    lines += [
        f"(b) contention, {hot['threads']} runners at once, {hot['rounds']} rounds each:",
        f"    {hot['hot_operations']} hot operations   claim p50 {hot['hot_claims']['p50_ms']} ms"
        f"  p99 {hot['hot_claims']['p99_ms']} ms",
        f"    one concurrency key claim p50 {hot['same_key_claims']['p50_ms']} ms"
        f"  p99 {hot['same_key_claims']['p99_ms']} ms",
        f"    answers {hot['answers']}; violations {hot['violations']}",
        "(c) intent hash: "
        + ", ".join(
            f"{name} ({f['bytes']} B) {f['us_per_call']} us/call"
            for name, f in report["intent_hash"].items()
        ),
        "(d) pages and sweeps by ledger size: median ms (database ms, best run) / queries",
    ]
    sizes = report["scale"]
    if sizes:
        names = [row["name"] for row in sizes[0]["measures"]]
        lines.append("    " + " " * 32 + "".join(f"{s['operations']:>26,}" for s in sizes))
        for index, name in enumerate(names):
            cells = "".join(
                "{ms:>11.1f} ({db_ms:>6.1f}) / {queries:<4}".format(**s["measures"][index])
                for s in sizes
            )
            lines.append(f"    {name:<32}{cells}")
        scans = [
            f"      {s['operations']:>9,}  {row['name']}: {scan['table']} ({scan['sql'][:60]}...)"
            for s in sizes
            for row in s["measures"]
            for scan in row["seq_scans"]
        ]
        lines.append(
            "    sequential scans of tables over 100,000 rows: "
            + ("none" if not scans else "(SQL in var/bench.json)")
        )
        lines.extend(scans)
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
