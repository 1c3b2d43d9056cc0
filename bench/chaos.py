"""``make chaos``: the same faults against a naive runner and against Effectgate.

    python -m bench.chaos [--n 2000] [--seed 20261129] [--fault-rate 0.3] [--workers 16]
                          [--database effectgate_chaos] [--json var/chaos.json]

1. Start Effectgate from nothing: a fresh database (PostgreSQL ``--database`` on
   ``DATABASE_URL``'s server when it is set, else SQLite under ``var/bench/``),
   migrations, a runner token, gunicorn on a free port, ``manage.py sweep --loop 1``
   and ``manage.py reconcile --loop 1`` with ``RECONCILE_ALLOWED_HOSTS=127.0.0.1``.
2. Send N logical refunds through a naive runner (retries on any exception) to a fake
   provider that ignores idempotency keys, under the seeded fault schedule.
3. Send the same N refunds through the Effectgate client to a fresh provider with the
   same schedule, then let the sweep and the probes finish what is due.
4. Count each refund's effects in the provider's records, compare them with what each
   runner (or Effectgate's ledger) says, print the table, what the client had to repeat
   (a ``status:429`` there is request throttling refusing the workload) and write
   ``var/chaos.json``.

Exit status 1 when Effectgate shows a duplicate or a lost operation.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    # The client warns when a heartbeat finds its lease gone; the table counts what
    # matters, so keep the progress bar readable.
    logging.basicConfig(level=logging.ERROR)
    schedule = FaultSchedule(
        seed=args.seed, rate=args.fault_rate, lookup_fault_rate=args.lookup_fault_rate
    )
    items = refs(args.n)
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
            row = account_effectgate(report, provider, items, effectgate_ledger(report.run_ids))
            row["settled"] = settled
            row["settle_s"] = report.extra["settle_s"]
            row["database"] = backend
            rows.append(row)

    print()
    print(table(rows))
    naive_row, eg_row = rows
    print()
    print(
        f"faults injected (same schedule for both): {json.dumps(eg_row['faults'])}\n"
        f"naive: {naive_row['refunds_with_duplicates']} refunds paid more than once, "
        f"{naive_row['crashes']} runner crashes\n"
        f"effectgate: {eg_row['crashes']} runner crashes, probe answers "
        f"{json.dumps(eg_row['auto_reconciled_by_result'])}, "
        f"{eg_row['awaiting_approval_after_not_found']} waiting for a person to approve a "
        f"retry after the probe found nothing; runner answers "
        f"{json.dumps(eg_row['runner_answers'])}; answers the client repeated "
        f"{json.dumps(eg_row['api_repeats'])}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(rows, indent=2) + "\n")
    print(f"written to {args.json}")
    if eg_row["duplicates"] or eg_row["lost"]:
        print("FAIL: Effectgate shows duplicates or lost operations", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
