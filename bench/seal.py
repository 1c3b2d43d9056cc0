"""What the transparency log's sealer costs (docs/benchmarks.md, The sealer).

    python -m bench.seal [--events 100000] [--batch 10000] [--database effectgate_seal]

On a fresh database of its own (PostgreSQL, on the server ``DATABASE_URL`` names):
``--events`` events are written in transactions of 1,000 (raw INSERTs, as the ledger
holds them), then the sealer (``services.log_seal``) appends them ``--batch`` at a time
and signs a checkpoint after each pass, as the beat does. Per pass: wall time, this
process's CPU time, statements sent and rows written; then what reading the log costs
at its final size: an inclusion proof, a consistency proof and the latest checkpoint.
``make bench`` runs it as its part (i).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SEED_TRANSACTION = 1000

_SEED = """
INSERT INTO operations_event
    (stream, seq, kind, tool_name, from_status, to_status, actor, at, data, prev_hash, hash,
     mac)
SELECT 'bench:' || (n / 100), n %% 100 + 1, 'runner_created', '', '', '', 'system:bench',
       now(), '{}'::jsonb, repeat('0', 64), md5(n::text) || md5((n + 1)::text), ''
FROM generate_series(%s::bigint, %s::bigint) AS n
"""


def seed(events: int, *, start: int = 0) -> None:
    """``events`` events, each stream a hundred of them, in transactions of 1,000."""
    from django.db import connection, transaction

    for first in range(start, start + events, SEED_TRANSACTION):
        last = min(first + SEED_TRANSACTION, start + events) - 1
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_SEED, [first, last])


def _timed(call: Any, repeat: int = 20) -> float:
    """The best of ``repeat`` calls, in milliseconds."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 3)


def measure(*, events: int, batch: int) -> dict[str, Any]:
    """Seed, seal in passes of ``batch``, read; the figures. Requires ``django.setup()``."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext, override_settings

    from operations import selectors, services
    from operations.models import Event, LogLeaf, LogNode

    call_command("migrate", verbosity=0)
    already = Event.objects.count()
    started = time.perf_counter()
    seed(events, start=already)
    seed_s = time.perf_counter() - started
    key = Ed25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    passes = []
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "audit.pem"
        path.write_bytes(key)
        with override_settings(AUDIT_SIGNING_KEY_FILE=str(path), AUDIT_SIGNING_KEY=""):
            while True:
                rows_before = LogLeaf.objects.count() + LogNode.objects.count()
                cpu, wall = time.process_time(), time.perf_counter()
                with CaptureQueriesContext(connection) as queries:
                    report = services.log_seal(limit=batch)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if not report.appended:
                    break
                passes.append(
                    {
                        "events": report.appended,
                        "ms": round(wall * 1000, 1),
                        "cpu_ms": round(cpu * 1000, 1),
                        "statements": len(queries),
                        "rows": LogLeaf.objects.count() + LogNode.objects.count() - rows_before,
                        "signed": report.checkpoint is not None,
                    }
                )
                print(
                    f"(i) sealed {report.appended:,} events in {wall * 1000:.0f} ms "
                    f"({cpu * 1000:.0f} ms CPU here), log size {report.size:,}",
                    file=sys.stderr,
                )
    size = selectors.log_size()
    full = [p for p in passes if p["events"] == batch] or passes
    per = 10_000 / batch
    event = Event.objects.order_by("pk").values_list("pk", flat=True)[size // 3]
    found = Event.objects.get(pk=event)
    return {
        "events": size,
        "batch": batch,
        "seed_s": round(seed_s, 1),
        "passes": passes,
        "ms_per_10000_events": round(statistics.median(p["ms"] for p in full) * per, 1),
        "cpu_ms_per_10000_events": round(statistics.median(p["cpu_ms"] for p in full) * per, 1),
        "statements_per_pass": statistics.median(p["statements"] for p in full),
        "rows_per_10000_events": round(statistics.median(p["rows"] for p in full) * per),
        "reads_ms": {
            "inclusion proof": _timed(lambda: selectors.inclusion_proof(event=found)),
            "consistency proof": _timed(
                lambda: selectors.consistency_proof(first=size // 2 + 1, second=size)
            ),
            "latest checkpoint": _timed(selectors.checkpoint_latest),
            "root": _timed(lambda: selectors.log_root(size)),
        },
    }


def table(report: dict[str, Any]) -> list[str]:
    reads = ", ".join(f"{name} {ms} ms" for name, ms in report["reads_ms"].items())
    return [
        f"(i) the sealer, {report['events']:,} events in passes of {report['batch']:,}, a "
        "checkpoint signed after each:",
        f"    {report['ms_per_10000_events']} ms per 10,000 events "
        f"({report['cpu_ms_per_10000_events']} ms of it CPU in the sealer's process), "
        f"{report['statements_per_pass']:.0f} statements and "
        f"{report['rows_per_10000_events']:,} rows per 10,000",
        f"    reads at that size: {reads}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.seal", description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--database", default="effectgate_seal")
    args = parser.parse_args(argv)
    from .stack import fresh_database, is_postgres

    base = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
    if not is_postgres(base):
        print("bench.seal needs PostgreSQL: set DATABASE_URL to a postgres:// URL", file=sys.stderr)
        return 2
    os.environ["DATABASE_URL"] = fresh_database(args.database, base_url=base)
    os.environ["LOG_LEVEL"] = "WARNING"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    report = measure(events=args.events, batch=args.batch)
    print("\n".join(table(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
