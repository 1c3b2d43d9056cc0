"""``make bench``: what Effectgate costs, measured on this machine in one run.

    python -m bench.bench [--only lifecycle] [--threads 8] [--lifecycles 320]
                          [--batch-sizes 5,20] [--batch-effects 640]
                          [--sizes 10000,1000000] [--database effectgate_bench]
                          [--review-requests 10] [--review-unknowns 5]
                          [--seal-events 100000] [--seal-batch 10000]

a. The lifecycle a runner goes through for every side effect (register with an inline
   claim, then post the outcome) three ways on the same database, K client threads
   each: the twelve essential statements over raw psycopg (``bench.essential``), the
   service's own statements replayed over raw psycopg (``bench.lifecycle_sql``), and
   the REST API under gunicorn, which counts the statements it sends
   (``bench.gunicorn_conf``). Throughput, latency per step, statements and CPU time
   per lifecycle (app, PostgreSQL, client), and which statements the API sends beyond
   the essential ones (``bench.lifecycle``). Beside them the durable-execution peer,
   DBOS (``bench.dbos_anchor``: a workflow with one step per effect, in this process, on
   a system database of its own, ``--database`` with ``_dbos``), and per effect the API's
   throughput over DBOS's and the essential anchor's, single and in batches
   (``--batch-sizes``).
e. 16 registrations with an inline claim at the same instant, in one run against one
   run each.
b. Claim contention: K runners claim the same few hot operations at the same instant
   (one wins each, the rest get ``attempt_in_progress``), and K operations that share one
   concurrency-key value (one wins, the rest get ``concurrency_conflict``); latencies and
   a check that no operation got two attempts.
c. Intent hashing (``operations.canonical.intent_hash``) per call, small and large.
d. The inbox, reconciliation and dashboard pages and the sweeps at each ledger size:
   time, query count, and sequential scans of big tables in their plans
   (``bench.scale``).

f, g. People's policies: a simulation of 100,000 operations for a Cedar policy and for a
   contract version, and the CPU a registration costs with 100 active policies against
   none (``bench.policies``).

h. A person's time in the console: a reviewer deciding 10 approval requests one by one
   and 10 in bulk, support resolving 5 unknown outcomes, in keystrokes, clicks and
   seconds, through Debian's chromium (``bench.review_speed``, on a database of its own:
   ``--database`` with ``_review``).

i. The transparency log's sealer: ``--seal-events`` events written, then appended to the
   log ``--seal-batch`` at a time with a checkpoint signed after each pass, in wall and
   CPU time per 10,000 events; and the proofs read at that size (``bench.seal``).

``--only lifecycle`` runs a and e alone (two to three minutes); ``--only`` repeats. PostgreSQL
only (the raw-psycopg paths need it): a fresh database (``--database``, default
``effectgate_bench``) on the server of ``DATABASE_URL``, or on
postgres://postgres@127.0.0.1:5432 without it. Figures go to stdout and
``var/bench.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
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

from . import lifecycle as lifecycle_part
from . import lifecycle_report
from . import parallel as parallel_part
from . import policies as policies_part
from . import review_speed as review_part
from . import seal as seal_part
from .stack import VAR, Stack, fresh_database, is_postgres, with_database
from .timing import latency_ms

DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/postgres"
TOOL = "bench_refund"
HOT_TOOL = "bench_hot_resource"
PARTS = ("lifecycle", "contention", "hashing", "policies", "scale", "review", "seal")
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


# The amount is a money field, so that the dashboard adds up what the seeded ledger has
# at stake (section d).
DISPLAY = {
    "summary": "Refund {/amount_cents} to {/payment_id}",
    "fields": {"/amount_cents": {"format": "money", "currency": "EUR", "minor_units": True}},
}


def contract(**overrides: Any) -> dict[str, Any]:
    """The bench's refund tool's contract (``bench.servers`` registers it too)."""
    return {
        "effect_class": "irreversible",
        "input_schema": SCHEMA,
        "approval": {"mode": "never"},
        "display": DISPLAY,
        **overrides,
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
        "hot_claims": latency_ms(hot_claims),
        "same_key_claims": latency_ms(key_claims),
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


def _runner_of(token: str) -> Any:
    from operations.models import RunnerToken

    return RunnerToken.objects.get(token_hash=hashlib.sha256(token.encode()).hexdigest()).runner


# --- d. pages and sweeps at scale -----------------------------------------------------------------


def scale(sizes: list[int], token: str) -> list[dict[str, Any]]:
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.test.utils import override_settings
    from guardian.shortcuts import assign_perm

    from approvals.models import ApprovalRequest
    from operations import services
    from operations.dispatch import probes
    from operations.models import Tool

    from .scale import CommittedLookup, Ledger

    # Pages are rendered without collectstatic, as in the test suite: the hashed-name
    # manifest is a dictionary lookup per asset, not something the table size changes.
    override_settings(
        STORAGES={
            **settings.STORAGES,
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
        }
    ).enable()
    runner = _runner_of(token)
    lookup = CommittedLookup()
    services.tool_register(
        name=LOOKUP_TOOL,
        body=contract(reconcile={"mode": "lookup", "url": lookup.url, "max_probes": 5}),
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
            # The approval page reads the run's other operations, the principal's first
            # operation and the tool's last 200 amounts (selectors.review): the newest
            # pending request of the working set, whatever the ledger's size.
            newest = ApprovalRequest.objects.filter(status="pending").order_by("-created_at")
            rows = [
                ledger.measure("inbox /", page("/")),
                ledger.measure("approval page", page(f"/approvals/{newest.first().pk}/")),
                ledger.measure("reconciliation /reconciliation/", page("/reconciliation/")),
                ledger.measure("dashboard /dashboard/", page("/dashboard/")),
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
    parser.add_argument(
        "--only",
        action="append",
        choices=PARTS,
        help="run only this part (repeatable): lifecycle is a and e",
    )
    parser.add_argument(
        "--threads", type=int, default=8, help="K client threads per lifecycle path"
    )
    parser.add_argument("--lifecycles", type=int, default=320, help="per lifecycle path")
    parser.add_argument(
        "--batch-sizes",
        default="5,20",
        help="effects per batch for the per-effect comparison, comma-separated",
    )
    parser.add_argument("--batch-effects", type=int, default=640, help="effects per batch path (a)")
    parser.add_argument("--parallel-threads", type=int, default=16)
    parser.add_argument("--parallel-rounds", type=int, default=8)
    parser.add_argument("--hot-threads", type=int, default=16)
    parser.add_argument("--hot-ops", type=int, default=2)
    parser.add_argument("--hot-rounds", type=int, default=25)
    parser.add_argument(
        "--sizes",
        default=os.environ.get("SIZES") or "10000,1000000",
        help="ledger sizes for the pages and sweeps, comma-separated",
    )
    parser.add_argument(
        "--policy-operations", type=int, default=100_000, help="operations to simulate over"
    )
    parser.add_argument(
        "--policy-registrations", type=int, default=1000, help="per case, for the CPU cost"
    )
    parser.add_argument(
        "--review-requests", type=int, default=10, help="approval requests per way (h)"
    )
    parser.add_argument(
        "--review-unknowns", type=int, default=5, help="unknown outcomes to resolve (h)"
    )
    parser.add_argument(
        "--seal-events", type=int, default=100_000, help="events the sealer appends (i)"
    )
    parser.add_argument("--seal-batch", type=int, default=10_000, help="events per pass (i)")
    parser.add_argument("--gunicorn-workers", type=int, default=2)
    parser.add_argument("--gunicorn-threads", type=int, default=4)
    parser.add_argument(
        "--database",
        default="effectgate_bench",
        help="the database to drop and create on DATABASE_URL's server",
    )
    parser.add_argument("--json", type=Path, default=VAR / "bench.json")
    return parser.parse_args(argv)


def _served_parts(args: argparse.Namespace, parts: set[str], url: str, report: dict) -> str:
    """Parts a, e and b against gunicorn on the bench's database; the runner token the
    later parts use."""
    trace_dir = VAR / "bench" / "trace"
    trace_dir.mkdir(parents=True, exist_ok=True)
    with Stack(
        url,
        workers=args.gunicorn_workers,
        threads=args.gunicorn_threads,
        loops=False,
        runner_name="bench",
        log_dir=VAR / "bench" / "bench",
        gunicorn_config="python:bench.gunicorn_conf",
        env={
            "EFFECTGATE_BENCH_TRACE_DIR": str(trace_dir),
            # Connections live through the run, so that no PostgreSQL backend (and its
            # CPU time) goes away in the middle of a measure; the default is 60 s.
            "DB_CONN_MAX_AGE": "600",
        },
    ) as stack:
        with EffectgateClient(stack.base_url, stack.token) as client:
            client.put_tool(TOOL, contract())
            client.put_tool(HOT_TOOL, contract(concurrency_key="/payment_id"))
            if "lifecycle" in parts:
                report["lifecycle"] = lifecycle_part.lifecycle(
                    base_url=stack.base_url,
                    database_url=url,
                    peer_database_url=with_database(url, f"{args.database}_dbos"[:63]),
                    gunicorn_pid=stack.gunicorn_pid,
                    trace_dir=trace_dir,
                    threads=args.threads,
                    lifecycles=args.lifecycles,
                    contract=contract(),
                    batch_sizes=tuple(int(size) for size in args.batch_sizes.split(",") if size),
                    batch_effects=args.batch_effects,
                )
                print("(e) parallel registrations", file=sys.stderr)
                report["parallel_registrations"] = parallel_part.parallel_registrations(
                    stack.base_url,
                    stack.token,
                    TOOL,
                    threads=args.parallel_threads,
                    rounds=args.parallel_rounds,
                )
            if "contention" in parts:
                print("(b) claim contention", file=sys.stderr)
                report["contention"] = contention(stack, args, client)
        return stack.token


def machine() -> dict[str, Any]:
    """What a report says of the machine at its start."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        # Other work on the machine skews every figure; the load says how much.
        "load_average_at_start": [round(load, 2) for load in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    parts = set(args.only or PARTS)
    # WhiteNoise looks for collected static files, which the in-process pages do not use.
    warnings.filterwarnings("ignore", message="No directory at")
    base = os.environ.get("DATABASE_URL") or DEFAULT_SERVER
    if not is_postgres(base):
        print("make bench needs PostgreSQL: set DATABASE_URL to a postgres:// URL", file=sys.stderr)
        return 2
    url = fresh_database(args.database, base_url=base)
    sizes = [int(size) for size in args.sizes.split(",") if size]
    report: dict[str, Any] = {
        "machine": machine(),
        "database": url.rsplit("@", 1)[-1],
        "gunicorn": {"workers": args.gunicorn_workers, "threads": args.gunicorn_threads},
        "parts": sorted(parts),
    }
    # Django in this process, on the bench's database: the lifecycle makes its runners
    # with the service, and the pages and sweeps run in-process.
    os.environ["DATABASE_URL"] = url
    os.environ["RECONCILE_ALLOWED_HOSTS"] = "127.0.0.1"
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    # Every part but hashing, review and seal uses the bench's database served or in-process
    # (the sealer's runs in-process on it, after the others).
    in_process = {"hashing", "review", "seal"}
    token = _served_parts(args, parts, url, report) if parts - in_process else ""
    if "hashing" in parts:
        print("(c) intent hashing", file=sys.stderr)
        report["intent_hash"] = hashing()
    if "policies" in parts:
        # Before the scale part: its seed would fall in the simulated window.
        print("(f, g) policies: simulation and CPU per registration", file=sys.stderr)
        report["policies"] = policies_part.policies(
            runner=_runner_of(token),
            contract=contract(),
            operations=args.policy_operations,
            registrations=args.policy_registrations,
        )
    if "scale" in parts:
        report["scale"] = scale(sizes, token)
    if "review" in parts:
        print("(h) a person's time in the console", file=sys.stderr)
        report["review"] = review_part.measure(
            database_url=fresh_database(f"{args.database}_review"[:63], base_url=base),
            requests=args.review_requests,
            unknowns=args.review_unknowns,
        )

    if "seal" in parts:
        print("(i) the transparency log's sealer", file=sys.stderr)
        report["seal"] = seal_part.measure(events=args.seal_events, batch=args.seal_batch)
        report["sealer_ms_per_10000_events"] = report["seal"]["ms_per_10000_events"]

    report["machine"]["load_average_at_end"] = [round(load, 2) for load in os.getloadavg()]
    if "lifecycle" in parts:
        report.update(headline(report["lifecycle"], report["parallel_registrations"]))
    print(summary(report))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {args.json}")
    ok = report.get("contention", {}).get("violations", 0) == 0
    return 0 if ok and report.get("review", {}).get("ok", True) else 1


def headline(life: dict[str, Any], parallel: dict[str, Any]) -> dict[str, Any]:
    """The figures to compare between runs, at the top of ``var/bench.json``."""
    paths = life["paths"]
    rate = {name: path["lifecycles_s"] for name, path in paths.items()}
    return {
        # How many times the essential statements' throughput the API's is short of.
        "lifecycle_api_vs_essential": round(rate["essential"] / rate["api"], 2),
        "lifecycle_api_vs_replica": round(rate["replica"] / rate["api"], 2),
        "lifecycle_ops_s": rate,
        "cpu_ms_per_lifecycle": {
            name: path["cpu_ms_per_lifecycle"] for name, path in paths.items()
        },
        "statements_per_lifecycle": {
            name: path["statements_per_lifecycle"] for name, path in paths.items()
        },
        "parallel_in_one_run_vs_spread": parallel["ratio"],
        # Per effect, the API's throughput over DBOS's and the essential anchor's
        # ("single", "batch_5", ...; null where the API has no batch endpoint).
        "api_over_dbos": life["peer"]["api_over_dbos"],
        "api_over_essential": life["peer"]["api_over_essential"],
    }


def summary(report: dict[str, Any]) -> str:
    lines = [""]
    if "lifecycle" in report:
        lines += lifecycle_report.table(report["lifecycle"])
        lines += parallel_part.table(report["parallel_registrations"])
    if "contention" in report:
        hot = report["contention"]
        lines += [
            f"(b) contention, {hot['threads']} runners at once, {hot['rounds']} rounds each:",
            f"    {hot['hot_operations']} hot operations   claim p50"
            f" {hot['hot_claims']['p50_ms']} ms  p99 {hot['hot_claims']['p99_ms']} ms",
            f"    one concurrency key claim p50 {hot['same_key_claims']['p50_ms']} ms"
            f"  p99 {hot['same_key_claims']['p99_ms']} ms",
            f"    answers {hot['answers']}; violations {hot['violations']}",
        ]
    if "intent_hash" in report:
        lines.append(
            "(c) intent hash: "
            + ", ".join(
                f"{name} ({f['bytes']} B) {f['us_per_call']} us/call"
                for name, f in report["intent_hash"].items()
            )
        )
    if "policies" in report:
        lines += policies_part.table(report["policies"])
    if "scale" in report:
        lines.append(
            "(d) pages and sweeps by ledger size: median ms (database ms, best run) / queries"
        )
        lines += scale_table(report["scale"])
    if "review" in report:
        lines.append("(h) a person's time in the console, one run:")
        lines += ["    " + line for line in review_part.summary(report["review"])]
    if "seal" in report:
        lines += seal_part.table(report["seal"])
    return "\n".join(lines)


def scale_table(sizes: list[dict[str, Any]]) -> list[str]:
    if not sizes:
        return []
    names = [row["name"] for row in sizes[0]["measures"]]
    lines = ["    " + " " * 32 + "".join(f"{s['operations']:>26,}" for s in sizes)]
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
    return lines


if __name__ == "__main__":
    sys.exit(main())
