"""Prometheus metrics the processes count as they work (``prometheus_client``).

Counters and histograms live here; the gauges that describe the ledger are read from
the database when ``/metrics`` is scraped (``operations.selectors.metrics``). Under
gunicorn or with Celery workers, set ``PROMETHEUS_MULTIPROC_DIR`` to a directory the
processes of one machine share (emptied at start): each process writes its own file,
and ``/metrics`` adds them up (prometheus_client's multiprocess mode).
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any, TypeVar

from prometheus_client import Counter, Histogram

T = TypeVar("T")

HTTP_REQUEST_DURATION = Histogram(
    "effectgate_http_request_duration_seconds",
    "Time to answer an HTTP request, by route pattern, method and status.",
    ["route", "method", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
SWEEP_DURATION = Histogram(
    "effectgate_sweep_duration_seconds",
    "Time one pass of a time-driven sweep took, by kind.",
    ["kind"],
    buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0),
)
PROBE_FAILURES = Counter(
    "effectgate_probe_failures",
    "Reconciliation lookups that got no answer Effectgate could use, by tool.",
    ["tool"],
)
POLICY_SHADOW = Counter(
    "effectgate_policy_shadow",
    "What policies watched in shadow would have done to live registrations, by policy "
    "and would-have (forbid, require, permit; none: no longer forbid or ask).",
    ["policy", "would"],
)


@contextmanager
def sweep_timer(kind: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        SWEEP_DURATION.labels(kind=kind).observe(time.perf_counter() - started)


def timed_sweep(kind: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate a sweep step so that each pass is observed in SWEEP_DURATION."""

    def decorate(function: Callable[..., T]) -> Callable[..., T]:
        @wraps(function)
        def timed(*args: Any, **kwargs: Any) -> T:
            with sweep_timer(kind):
                return function(*args, **kwargs)

        return timed

    return decorate
