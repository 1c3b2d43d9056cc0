"""Percentiles, latency summaries and thread fan-out shared by the bench's parts."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by the nearest-rank method, in the values' unit."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def latency_ms(seconds: list[float]) -> dict[str, float]:
    millis = [value * 1000 for value in seconds]
    return {
        "p50_ms": round(percentile(millis, 50), 2),
        "p99_ms": round(percentile(millis, 99), 2),
        "n": len(millis),
    }


def on_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
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
