"""(e) Registrations in one run against registrations spread over runs.

16 registrations, each with an inline claim, released at the same instant by a barrier:
all in one run, then each in a run of its own, alternating for a number of rounds. A
registration holds its run's row lock until it commits, so registrations in one run
queue behind each other; spread over runs they only share the machine. The ratio of the
two round times says what that lock costs when a runner fans out.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import httpx

from effectgate_client import EffectgateClient

from .lifecycle_seats import LEASE_S, PRINCIPAL
from .timing import latency_ms


def parallel_registrations(
    base_url: str, token: str, tool: str, *, threads: int = 16, rounds: int = 8
) -> dict[str, Any]:
    """``threads`` registrations (with an inline claim) released at once by a barrier,
    ``rounds`` times all in one fresh run and ``rounds`` times each in a fresh run of its
    own, alternating. A round's time runs from the first request's start to the last
    answer."""
    go = threading.Barrier(threads + 1, timeout=120)
    done = threading.Barrier(threads + 1, timeout=120)
    targets = [""] * threads
    results: list[list[tuple[float, float, bool]]] = [[] for _ in range(threads)]

    def client(index: int) -> None:
        try:
            with httpx.Client(
                base_url=f"{base_url}/api/v1",
                headers={"Authorization": f"Bearer {token}"},
                timeout=60,
            ) as http:
                http.get("/tools").raise_for_status()  # connected before the race
                for round_number in range(rounds * 2):
                    go.wait()
                    t0 = time.perf_counter()
                    response = http.post(
                        "/operations",
                        json={
                            "run": targets[index],
                            "tool": tool,
                            "operation_key": f"parallel-{round_number}-{index}",
                            "arguments": {"payment_id": f"pay_{index}", "amount_cents": 500},
                            "claim": {"lease_s": LEASE_S},
                        },
                    )
                    t1 = time.perf_counter()
                    claimed = response.status_code == 201 and response.json()["attempt"] is not None
                    results[index].append((t0, t1, claimed))
                    done.wait()
        except BaseException:
            go.abort()
            done.abort()
            raise

    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    walls: dict[str, list[float]] = {"one_run": [], "spread": []}
    latencies: dict[str, list[float]] = {"one_run": [], "spread": []}
    refused = 0
    try:
        with EffectgateClient(base_url, token) as api:
            for round_number in range(rounds * 2):
                mode = "one_run" if round_number % 2 == 0 else "spread"
                if mode == "one_run":
                    shared = api.create_run(principal=PRINCIPAL)["id"]
                    targets[:] = [shared] * threads
                else:
                    targets[:] = [api.create_run(principal=PRINCIPAL)["id"] for _ in range(threads)]
                go.wait()
                done.wait()
                answers = [results[i][-1] for i in range(threads)]
                walls[mode].append(max(a[1] for a in answers) - min(a[0] for a in answers))
                latencies[mode].extend(a[1] - a[0] for a in answers)
                refused += sum(not a[2] for a in answers)
    finally:
        for worker in workers:
            worker.join()
    one, spread = statistics.median(walls["one_run"]), statistics.median(walls["spread"])
    return {
        "threads": threads,
        "rounds_each": rounds,
        "one_run": {
            "round_ms_median": round(one * 1000, 1),
            "round_ms": [round(w * 1000, 1) for w in walls["one_run"]],
            "request": latency_ms(latencies["one_run"]),
        },
        "spread": {
            "round_ms_median": round(spread * 1000, 1),
            "round_ms": [round(w * 1000, 1) for w in walls["spread"]],
            "request": latency_ms(latencies["spread"]),
        },
        "ratio": round(one / spread, 2),
        "not_claimed": refused,
    }


def table(parallel: dict[str, Any]) -> list[str]:
    threads = parallel["threads"]
    rows = [("in one run", parallel["one_run"]), (f"in {threads} runs", parallel["spread"])]
    return [
        f"(e) {threads} registrations with inline claim at once, median of"
        f" {parallel['rounds_each']} rounds:",
        *(
            f"    {label:<12}{row['round_ms_median']:>9.1f} ms"
            f"   (request p50 {row['request']['p50_ms']} ms)"
            for label, row in rows
        ),
        f"    parallel_in_one_run_vs_spread {parallel['ratio']}",
    ]
