"""The chaos harness: refunds as jobs, two kinds of runner, and honest accounting.

Each logical refund is a job on an at-least-once queue, as in most agent runners: a
worker takes it, runs it, and when the worker dies (the fault ``runner_crash``) the job
is delivered again to another worker after a short delay. Workers are threads; a crash
is a ``RunnerCrash`` (a ``BaseException``, like ``SystemExit``) raised right after the
request left, and the crashed worker starts again with fresh clients, as a restarted
process would.

- The **naive runner** calls the provider and retries on any exception.
- The **Effectgate runner** calls ``effectgate_client.Runner.execute`` with the
  operation key ``chaos:<payment_id>``, passing the operation's idempotency key to the
  provider.

The accounting counts, per logical refund, the effects in the provider's own records,
and compares them with what each runner (or Effectgate's ledger) says happened.
"""

from __future__ import annotations

import heapq
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from effectgate_client import (
    EffectgateClient,
    EffectgateError,
    Failed,
    OutcomeNotRecorded,
    PollingWaiter,
    Runner,
    Succeeded,
    outcome_from_httpx_error,
)

from .fake_provider import FakeProvider
from .faults import RUNNER_CRASH

TOOL = "chaos_refund"
KEY_PREFIX = "chaos:"
FAILED_STATES = {"failed_permanent", "budget_exhausted", "rejected", "cancelled"}
UNRESOLVED_STATES = {"outcome_unknown", "compensating"}


class RunnerCrash(BaseException):
    """The runner process died right after sending its request (modelled in-thread)."""


def refs(n: int) -> list[str]:
    return [f"pay_{index:06d}" for index in range(n)]


def amount_cents(ref: str) -> int:
    return 100 + int(ref.rsplit("_", 1)[1]) * 37 % 90_000


def refund_contract(lookup_template: str, *, max_attempts: int = 5) -> dict[str, Any]:
    """An irreversible refund that runs without approval and is reconciled by lookup.

    Only ``provider_unavailable`` is retryable: the provider answers 503 before it
    processes anything, so that code means "not processed": a retryable code of an
    irreversible tool must mean that, since a retry repeats the effect otherwise.
    """
    return {
        "effect_class": "irreversible",
        "description": "Refund a payment at the fake provider (chaos bench).",
        "input_schema": {
            "type": "object",
            "required": ["payment_id", "amount_cents"],
            "properties": {
                "payment_id": {"type": "string"},
                "amount_cents": {"type": "integer", "minimum": 1},
            },
            "additionalProperties": False,
        },
        "retry": {
            "max_attempts": max_attempts,
            "retryable_codes": ["provider_unavailable"],
            "base_delay_ms": 50,
            "max_delay_ms": 500,
        },
        "approval": {"mode": "never"},
        "reconcile": {"mode": "lookup", "url": lookup_template, "max_probes": 5},
    }


# --- the job queue ------------------------------------------------------------------------


class Progress:
    """A plain-text progress bar on stderr (one line per tenth when not a terminal)."""

    def __init__(self, label: str, total: int, *, stream: Any = None, width: int = 30) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.width = width
        self.done = 0
        self.crashes = 0
        self.started = time.monotonic()
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._last_tenth = -1
        self._lock = threading.Lock()

    def advance(self, *, crashed: bool = False) -> None:
        with self._lock:
            if crashed:
                self.crashes += 1
            else:
                self.done += 1
            self._draw()

    def _draw(self, final: bool = False) -> None:
        filled = int(self.width * self.done / max(1, self.total))
        line = (
            f"{self.label:>10} [{'#' * filled}{'.' * (self.width - filled)}] "
            f"{self.done}/{self.total}  crashes {self.crashes}  "
            f"{time.monotonic() - self.started:6.1f} s"
        )
        if self._tty:
            self.stream.write("\r" + line + ("\n" if final else ""))
            self.stream.flush()
        else:
            tenth = 10 * self.done // max(1, self.total)
            if tenth != self._last_tenth or final:
                self._last_tenth = tenth
                self.stream.write(line + "\n")
                self.stream.flush()

    def finish(self) -> None:
        with self._lock:
            self._draw(final=True)


Job = Callable[[str], str]
WorkerFactory = Callable[[], tuple[Job, Callable[[], None]]]


def run_jobs(
    items: list[str],
    make_worker: WorkerFactory,
    *,
    workers: int,
    progress: Progress | None = None,
    redelivery_delay_s: float = 0.5,
) -> tuple[dict[str, str], int]:
    """Run every job to an answer on ``workers`` threads; redeliver crashed ones.

    Returns the last answer of each job and the number of crashes.
    """
    ready: list[tuple[float, int, str]] = [(0.0, index, ref) for index, ref in enumerate(items)]
    heapq.heapify(ready)
    answers: dict[str, str] = {}
    crashes = 0
    sequence = len(items)
    lock = threading.Condition()

    def take() -> str | None:
        with lock:
            while True:
                if len(answers) == len(items):
                    return None
                if ready:
                    due, _, ref = ready[0]
                    wait = due - time.monotonic()
                    if wait <= 0:
                        heapq.heappop(ready)
                        return ref
                    lock.wait(timeout=wait)
                else:
                    lock.wait(timeout=0.1)

    def worker() -> None:
        nonlocal crashes, sequence
        job, close = make_worker()
        try:
            while (ref := take()) is not None:
                try:
                    answer = job(ref)
                except RunnerCrash:
                    # The process died: its clients and memory are gone, the queue
                    # delivers the job again later, a new process starts.
                    close()
                    job, close = make_worker()
                    with lock:
                        crashes += 1
                        sequence += 1
                        heapq.heappush(
                            ready, (time.monotonic() + redelivery_delay_s, sequence, ref)
                        )
                        lock.notify_all()
                    if progress:
                        progress.advance(crashed=True)
                    continue
                with lock:
                    answers[ref] = answer
                    lock.notify_all()
                if progress:
                    progress.advance()
        finally:
            close()

    threads = [threading.Thread(target=worker, name=f"runner-{i}") for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if progress:
        progress.finish()
    return answers, crashes


def call_provider(
    http: httpx.Client, provider_url: str, ref: str, idempotency_key: str | None
) -> httpx.Response:
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
    response = http.post(
        f"{provider_url}/refunds",
        json={"payment_id": ref, "amount_cents": amount_cents(ref)},
        headers=headers,
    )
    if response.headers.get("X-Fault") == RUNNER_CRASH:
        raise RunnerCrash(ref)
    return response


@dataclass
class RunReport:
    runner: str
    answers: dict[str, str]
    crashes: int
    wall_s: float
    run_ids: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


# --- the naive runner -----------------------------------------------------------------


def run_naive(
    provider: FakeProvider,
    items: list[str],
    *,
    workers: int = 16,
    timeout_s: float = 1.0,
    max_tries: int = 10,
    progress: Progress | None = None,
) -> RunReport:
    """Call the provider; on any exception, wait a little and call again."""

    def make_worker() -> tuple[Job, Callable[[], None]]:
        http = httpx.Client(timeout=timeout_s)

        def job(ref: str) -> str:
            for tries in range(max_tries):
                try:
                    call_provider(http, provider.url, ref, None).raise_for_status()
                    return "succeeded"
                except Exception:
                    time.sleep(min(1.0, 0.05 * 2**tries))
            return "gave_up"

        return job, http.close

    started = time.monotonic()
    answers, crashes = run_jobs(items, make_worker, workers=workers, progress=progress)
    return RunReport("naive", answers, crashes, time.monotonic() - started)


# --- the Effectgate runner ----------------------------------------------------------------


def provider_refund(http: httpx.Client, provider: FakeProvider) -> Callable[[Any], Succeeded]:
    """The tool function of the Effectgate runner: one refund at the provider with the
    operation's idempotency key, its answer classified as an outcome."""

    def refund(ctx: Any) -> Succeeded:
        ref = ctx.arguments["payment_id"]
        try:
            response = call_provider(http, provider.url, ref, ctx.idempotency_key)
        except httpx.HTTPError as exc:
            raise outcome_from_httpx_error(exc) from exc
        if response.status_code == 503:
            raise Failed("provider_unavailable", "503: not processed")
        if response.status_code != 200:
            raise Failed(f"http_{response.status_code}", response.text[:200])
        refund_id = response.json()["id"]
        return Succeeded(result={"refund": refund_id}, downstream_id=refund_id)

    return refund


def effectgate_setup(
    base_url: str,
    token: str,
    provider: FakeProvider,
    *,
    tool: str = TOOL,
    runs: int = 64,
    external_prefix: str = "chaos-",
    repeats: Counter[str] | None = None,
) -> list[str]:
    """Register the refund tool for ``provider`` and open ``runs`` runs; their ids."""
    with EffectgateClient(base_url, token) as setup:
        setup.put_tool(tool, refund_contract(provider.lookup_template))
        run_ids = [
            setup.create_run(principal="user:chaos", external_id=f"{external_prefix}{index}")["id"]
            for index in range(runs)
        ]
        if repeats is not None:
            repeats.update(setup.stats)
    return run_ids


def run_of(ref: str, run_ids: list[str]) -> str:
    """The run refund ``ref`` belongs to: a redelivered job finds its run again."""
    return run_ids[int(ref.rsplit("_", 1)[1]) % len(run_ids)]


def run_effectgate(
    base_url: str,
    token: str,
    provider: FakeProvider,
    items: list[str],
    *,
    workers: int = 16,
    timeout_s: float = 1.0,
    lease_s: int = 3,
    runs: int = 64,
    progress: Progress | None = None,
) -> RunReport:
    """Register the tool, open ``runs`` runs (agent conversations; refund ``i`` belongs
    to run ``i % runs``, so a redelivered job finds its run again) and execute every
    refund through the client. One run would serialize every registration on the
    run's row lock, which is how run budgets are kept exact, not how agents work."""
    # Answers the clients repeated (``EffectgateClient.stats``: a 429 or 5xx status, a
    # lost connection), summed over every client of the run.
    repeats: Counter[str] = Counter()
    repeats_lock = threading.Lock()
    run_ids = effectgate_setup(base_url, token, provider, runs=runs, repeats=repeats)

    def make_worker() -> tuple[Job, Callable[[], None]]:
        client = EffectgateClient(base_url, token, timeout=30)
        runner = Runner(
            client,
            lease_s=lease_s,
            wait_s=max(10.0, 4 * lease_s),
            waiter=PollingWaiter(initial_s=0.2, max_s=1.0),
        )
        http = httpx.Client(timeout=timeout_s)
        refund = provider_refund(http, provider)

        def job(ref: str) -> str:
            try:
                result = runner.execute(
                    run=run_of(ref, run_ids),
                    tool=TOOL,
                    operation_key=KEY_PREFIX + ref,
                    arguments={"payment_id": ref, "amount_cents": amount_cents(ref)},
                    call=refund,
                )
            except OutcomeNotRecorded:
                return "outcome_not_recorded"
            except EffectgateError as exc:
                return f"error:{type(exc).__name__}"
            return result.status

        def close() -> None:
            with repeats_lock:
                repeats.update(client.stats)
            client.close()
            http.close()

        return job, close

    started = time.monotonic()
    answers, crashes = run_jobs(items, make_worker, workers=workers, progress=progress)
    return RunReport(
        "effectgate",
        answers,
        crashes,
        time.monotonic() - started,
        run_ids=run_ids,
        extra={"api_repeats": repeats},
    )


def _parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def settle(
    base_url: str,
    token: str,
    *,
    tool: str = TOOL,
    timeout_s: float = 120.0,
    slack_s: float = 2,
    repeats: Counter[str] | None = None,
) -> bool:
    """Wait for the time-driven work to finish what it can: no live lease left, no
    probe due soon. True when settled, False when ``timeout_s`` ran out first. The
    answers its client repeated are added to ``repeats``."""
    deadline = time.monotonic() + timeout_s
    with EffectgateClient(base_url, token) as client:
        try:
            return _settled(client, deadline, tool=tool, slack_s=slack_s)
        finally:
            if repeats is not None:
                repeats.update(client.stats)


def _settled(client: EffectgateClient, deadline: float, *, tool: str, slack_s: float) -> bool:
    quiet_checks = 0
    while time.monotonic() < deadline:
        executing = next(iter(client.list_operations(status="executing", tool=tool)), None)
        soon = datetime.now(UTC) + timedelta(seconds=slack_s)
        due = [
            op
            for op in client.list_operations(status="outcome_unknown", tool=tool)
            if op.get("next_probe_at") and _parse_time(op["next_probe_at"]) <= soon
        ]
        quiet_checks = quiet_checks + 1 if executing is None and not due else 0
        if quiet_checks >= 2:
            return True
        time.sleep(1.0)
    return False


# --- accounting ---------------------------------------------------------------------------


def effectgate_ledger(
    run_ids: list[str], *, key_prefix: str = KEY_PREFIX
) -> dict[str, dict[str, Any]]:
    """Effectgate's view of each logical refund, read from its database (Django ORM):
    ``{payment_id: {"status", "probe": "committed" | "not_found" | None}}``."""
    from operations.models import Event, Operation

    probes = {
        operation_id: result
        for operation_id, result in Event.objects.filter(
            operation__run_id__in=run_ids, kind="reconciled", actor="system:probe"
        ).values_list("operation_id", "data__result")
    }
    return {
        key.removeprefix(key_prefix): {"status": status, "probe": probes.get(op_id)}
        for op_id, key, status in Operation.objects.filter(run_id__in=run_ids).values_list(
            "id", "operation_key", "status"
        )
    }


def _row(runner: str, total: int, wall_s: float) -> dict[str, Any]:
    return {
        "runner": runner,
        "logical_operations": total,
        "provider_effects": 0,
        "duplicates": 0,
        "lost": 0,
        "succeeded": 0,
        "failed_no_effect": 0,
        "in_reconciliation": 0,
        "auto_reconciled": 0,
        "wall_s": round(wall_s, 2),
    }


def account_naive(report: RunReport, provider: FakeProvider, items: list[str]) -> dict[str, Any]:
    effects = provider.effects_by_ref()
    row = _row(report.runner, len(items), report.wall_s)
    for ref in items:
        count = effects[ref]
        row["provider_effects"] += count
        row["duplicates"] += max(0, count - 1)
        answer = report.answers.get(ref)
        if answer == "succeeded" and count >= 1:
            row["succeeded"] += 1
        elif answer == "gave_up" and count == 0:
            row["failed_no_effect"] += 1
        else:
            # Reported failed while money left, or no answer at all.
            row["lost"] += 1
    row["refunds_with_duplicates"] = sum(1 for ref in items if effects[ref] > 1)
    row["crashes"] = report.crashes
    row["faults"] = dict(sorted(provider.log.faults.items()))
    return row


def account_effectgate(
    report: RunReport,
    provider: FakeProvider,
    items: list[str],
    ledger: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Every logical refund must be in one of three honest places:

    - ``succeeded`` in Effectgate with exactly one refund at the provider;
    - ended without success (``failed_permanent``, ``budget_exhausted``...) or waiting
      for a person to approve a retry after a probe found nothing (``awaiting_approval``),
      with no refund at the provider: *failed with no effect*;
    - unresolved (``outcome_unknown``, ``compensating``) in the reconciliation queue,
      with at most one refund at the provider.

    A second refund for one logical refund is a duplicate; anything else (success
    without a refund, failure with one, an operation still executing or missing) is lost.
    """
    effects = provider.effects_by_ref()
    row = _row(report.runner, len(items), report.wall_s)
    awaiting = 0
    probe_results: Counter[str] = Counter()
    for ref in items:
        count = effects[ref]
        row["provider_effects"] += count
        row["duplicates"] += max(0, count - 1)
        entry = ledger.get(ref) or {"status": None, "probe": None}
        status = entry["status"]
        if entry["probe"]:
            row["auto_reconciled"] += 1
            probe_results[entry["probe"]] += 1
        if status == "succeeded" and count >= 1:
            row["succeeded"] += 1
        elif status in UNRESOLVED_STATES:
            row["in_reconciliation"] += 1
        elif (status in FAILED_STATES or status == "awaiting_approval") and count == 0:
            row["failed_no_effect"] += 1
            awaiting += status == "awaiting_approval"
        else:
            row["lost"] += 1
    row["awaiting_approval_after_not_found"] = awaiting
    row["auto_reconciled_by_result"] = dict(sorted(probe_results.items()))
    row["refunds_with_duplicates"] = sum(1 for ref in items if effects[ref] > 1)
    row["crashes"] = report.crashes
    row["faults"] = dict(sorted(provider.log.faults.items()))
    row["runner_answers"] = dict(sorted(Counter(report.answers.values()).items()))
    # What the clients had to repeat: "status:429" would be throttling refusing work.
    row["api_repeats"] = dict(sorted(report.extra.get("api_repeats", {}).items()))
    return row


COLUMNS = [
    ("logical_operations", "logical operations"),
    ("provider_effects", "provider effects"),
    ("duplicates", "duplicates"),
    ("lost", "lost"),
    ("succeeded", "succeeded"),
    ("failed_no_effect", "failed with no effect"),
    ("in_reconciliation", "left for reconciliation"),
    ("auto_reconciled", "resolved by automatic probe"),
    ("wall_s", "wall time (s)"),
]


def table(rows: list[dict[str, Any]]) -> str:
    """The figures side by side, one column per runner."""
    width = max(len(label) for _, label in COLUMNS) + 2
    column = max(12, *(len(row["runner"]) + 2 for row in rows))
    lines = [f"{'':<{width}}" + "".join(f"{row['runner']:>{column}}" for row in rows)]
    for key, label in COLUMNS:
        lines.append(f"{label:<{width}}" + "".join(f"{row[key]:>{column}}" for row in rows))
    return "\n".join(lines)
