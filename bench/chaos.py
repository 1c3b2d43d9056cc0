"""``make chaos``: the same faults against a naive runner and against Effectgate.

    python -m bench.chaos [--n 2000] [--seed 20261129] [--fault-rate 0.3] [--workers 16]
                          [--database effectgate_chaos] [--json var/chaos.json]
                          [--ts | --no-ts]

1. Start Effectgate from nothing: a fresh database (PostgreSQL ``--database`` on
   ``DATABASE_URL``'s server when it is set, else SQLite under ``var/bench/``),
   migrations, a runner token, gunicorn on a free port, ``manage.py sweep --loop 1``
   and ``manage.py reconcile --loop 1`` with ``RECONCILE_ALLOWED_HOSTS=127.0.0.1``.
2. Send N logical refunds through a naive runner (retries on any exception) to a fake
   provider that ignores idempotency keys, under the seeded fault schedule.
3. Send the same N refunds through the Effectgate client to a fresh provider with the
   same schedule, then let the sweep and the probes finish what is due.
4. The TypeScript phase (``bench.chaos_ts``), by default when node and
   ``clients/typescript/node_modules`` are there (``--ts`` requires it, ``--no-ts``
   skips it): steps 2 and 3 again with node processes as the runner workers, a naive
   TypeScript loop, then ``@effectgate/client``'s ``Runner``, each with a fresh provider
   and the same schedule; the Runner with a tool, runs and keys of its own.
5. Count each refund's effects in the provider's records, compare them with what each
   runner (or Effectgate's ledger) says, print the table, what the client had to repeat
   (a ``status:429`` there is request throttling refusing the workload) and write
   ``var/chaos.json``.

Exit status 1 when Effectgate shows a duplicate or a lost operation, for either runner.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from . import chaos_ts
from .fake_provider import FakeProvider
from .faults import FaultSchedule
from .harness import (
    Progress,
    account_effectgate,
    account_naive,
    effectgate_ledger,
    refs,
    run_effectgate,
    run_naive,
    settle,
    table,
)
from .stack import VAR, Stack, fresh_database, is_postgres


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--n", type=int, default=int(os.environ.get("N") or 2000))
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--fault-rate", type=float, default=0.30)
    parser.add_argument(
        "--lookup-fault-rate",
        type=float,
        default=0.0,
        help="share of reconciliation lookups answered 503 (those wait for a later probe)",
    )
    parser.add_argument("--workers", type=int, default=12, help="runner threads")
    parser.add_argument("--lease-s", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=1.0, help="runner -> provider")
    parser.add_argument("--slow-s", type=float, default=0.6)
    parser.add_argument("--gunicorn-workers", type=int, default=4)
    parser.add_argument("--gunicorn-threads", type=int, default=4)
    parser.add_argument(
        "--database",
        default="effectgate_chaos",
        help="with PostgreSQL, the database to drop and create on DATABASE_URL's server",
    )
    parser.add_argument("--json", type=Path, default=VAR / "chaos.json")
    parser.add_argument(
        "--ts",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the TypeScript phase (default: when node and clients/typescript/node_modules "
        "are there)",
    )
    return parser.parse_args(argv)


def _with_typescript(wanted: bool | None) -> bool:
    reason = chaos_ts.unavailable()
    if wanted and reason:
        raise SystemExit(f"chaos: --ts, but {reason}")
    if wanted is None and reason:
        print(f"chaos: no TypeScript phase: {reason}", file=sys.stderr)
    return wanted is not False and reason is None


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    # The client warns when a heartbeat finds its lease gone; the table counts what
    # matters, so keep the progress bar readable.
    logging.basicConfig(level=logging.ERROR)
    schedule = FaultSchedule(
        seed=args.seed, rate=args.fault_rate, lookup_fault_rate=args.lookup_fault_rate
    )
    items = refs(args.n)
    typescript = _with_typescript(args.ts)
    base_url = os.environ.get("DATABASE_URL")
    database_url = fresh_database(args.database, base_url=base_url)
    backend = "PostgreSQL" if is_postgres(database_url) else "SQLite"
    print(
        f"chaos: {args.n} refunds, seed {args.seed}, {args.fault_rate:.0%} faults, "
        f"{args.workers} runner threads; Effectgate on gunicorn "
        f"({args.gunicorn_workers}x{args.gunicorn_threads}) + {backend}",
        file=sys.stderr,
    )
    provider_options = {"client_timeout_s": args.timeout_s, "slow_s": args.slow_s}
    rows = []
    with Stack(
        database_url,
        workers=args.gunicorn_workers,
        threads=args.gunicorn_threads,
        runner_name="chaos",
        log_dir=VAR / "bench" / "chaos",
    ) as stack:
        with FakeProvider(schedule, **provider_options) as provider:
            naive = run_naive(
                provider,
                items,
                workers=args.workers,
                timeout_s=args.timeout_s,
                progress=Progress("naive", len(items)),
            )
            rows.append(account_naive(naive, provider, items))
        with FakeProvider(schedule, **provider_options) as provider:
            report = run_effectgate(
                stack.base_url,
                stack.token,
                provider,
                items,
                workers=args.workers,
                timeout_s=args.timeout_s,
                lease_s=args.lease_s,
                progress=Progress("effectgate", len(items)),
            )
            settle_started = time.monotonic()
            settled = settle(stack.base_url, stack.token, repeats=report.extra["api_repeats"])
            report.extra["settle_s"] = round(time.monotonic() - settle_started, 2)
            # The ledger is read from Effectgate's database with its own models.
            os.environ["DATABASE_URL"] = database_url
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
            import django

            django.setup()
            # Django's LOGGING logs each request of the clients (httpx, INFO): not here.
            logging.getLogger("httpx").setLevel(logging.WARNING)
            row = account_effectgate(report, provider, items, effectgate_ledger(report.run_ids))
            row["settled"] = settled
            row["settle_s"] = report.extra["settle_s"]
            rows.append(row)
        if typescript:
            rows.extend(_typescript_phase(args, stack, schedule, items, provider_options))
    for row in rows:
        row["database"] = backend

    print()
    print(table(rows))
    print()
    print(f"faults injected (same schedule for each runner): {json.dumps(rows[1]['faults'])}")
    for row in rows:
        print(_summary(row))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"written to {args.json}")
    failed = [
        row["runner"] for row in rows if _effectgate(row) and (row["duplicates"] or row["lost"])
    ]
    if failed:
        print(
            f"FAIL: duplicates or lost operations through Effectgate ({', '.join(failed)})",
            file=sys.stderr,
        )
        return 1
    return 0


def _effectgate(row: dict) -> bool:
    return row["runner"].startswith("effectgate")


def _summary(row: dict) -> str:
    if not _effectgate(row):
        return (
            f"{row['runner']}: {row['refunds_with_duplicates']} refunds paid more than once, "
            f"{row['crashes']} runner crashes"
        )
    return (
        f"{row['runner']}: {row['crashes']} runner crashes, probe answers "
        f"{json.dumps(row['auto_reconciled_by_result'])}, "
        f"{row['awaiting_approval_after_not_found']} waiting for a person to approve a "
        f"retry after the probe found nothing; runner answers "
        f"{json.dumps(row['runner_answers'])}; answers the client repeated "
        f"{json.dumps(row['api_repeats'])}"
    )


def _typescript_phase(
    args: argparse.Namespace,
    stack: Stack,
    schedule: FaultSchedule,
    items: list[str],
    provider_options: dict,
) -> list[dict]:
    """Steps 2 and 3 with node processes as the runner workers (bench/chaos_ts.py)."""
    logs = VAR / "bench" / "chaos"
    rows = []
    with FakeProvider(schedule, **provider_options) as provider:
        naive = chaos_ts.run_naive_ts(
            provider,
            items,
            workers=args.workers,
            timeout_s=args.timeout_s,
            log_path=logs / "naive-ts.log",
            progress=Progress("naive-ts", len(items)),
        )
        rows.append(account_naive(naive, provider, items))
    with FakeProvider(schedule, **provider_options) as provider:
        report = chaos_ts.run_effectgate_ts(
            stack.base_url,
            stack.token,
            provider,
            items,
            workers=args.workers,
            timeout_s=args.timeout_s,
            lease_s=args.lease_s,
            log_path=logs / "effectgate-ts.log",
            progress=Progress("eg-ts", len(items)),
        )
        settle_started = time.monotonic()
        settled = settle(
            stack.base_url,
            stack.token,
            tool=chaos_ts.TS_TOOL,
            repeats=report.extra["api_repeats"],
        )
        report.extra["settle_s"] = round(time.monotonic() - settle_started, 2)
        ledger = effectgate_ledger(report.run_ids, key_prefix=chaos_ts.TS_KEY_PREFIX)
        row = account_effectgate(report, provider, items, ledger)
        row["settled"] = settled
        row["settle_s"] = report.extra["settle_s"]
        rows.append(row)
    return rows


if __name__ == "__main__":
    sys.exit(main())
