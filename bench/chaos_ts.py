"""The chaos bench's TypeScript phase: the same jobs, faults and accounting as the Python
runners (``bench.harness``), with each runner worker a node process running
``bench/chaos_ts.mjs``.

- ``run_naive_ts``: a hand-written TypeScript loop that sends each refund straight to
  the provider and sends it again on any error.
- ``run_effectgate_ts``: ``Runner.execute`` of ``@effectgate/client``, built from
  ``clients/typescript`` (``npm run build`` when ``dist/`` is missing or older than the
  sources).

A worker thread of ``harness.run_jobs`` owns one node process and hands it one refund at
a time. The fault ``runner_crash`` really ends that process (exit status 75) right after
the provider answered; the thread then raises ``RunnerCrash`` so that the queue delivers
the refund again, to a new process, as for the Python runners.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .fake_provider import FakeProvider
from .harness import (
    Job,
    Progress,
    RunnerCrash,
    RunReport,
    amount_cents,
    effectgate_setup,
    run_jobs,
    run_of,
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "clients" / "typescript"
CLIENT_MODULE = PACKAGE / "dist" / "index.js"
SCRIPT = ROOT / "bench" / "chaos_ts.mjs"
CRASHED = 75
TS_TOOL = "chaos_refund_ts"
TS_KEY_PREFIX = "chaos-ts:"


def unavailable() -> str | None:
    """Why the TypeScript phase cannot run here, or None when it can."""
    if shutil.which("node") is None:
        return "node is not installed"
    if not (PACKAGE / "node_modules").is_dir():
        return f"{PACKAGE.relative_to(ROOT)}/node_modules is missing (npm ci there)"
    return None


def ensure_built() -> None:
    """Build ``@effectgate/client`` when ``dist/`` is missing or older than ``src/``."""
    sources = [*PACKAGE.joinpath("src").rglob("*.ts"), PACKAGE / "package.json"]
    newest = max(path.stat().st_mtime for path in sources)
    if not CLIENT_MODULE.exists() or CLIENT_MODULE.stat().st_mtime < newest:
        subprocess.run(["npm", "run", "--silent", "build"], cwd=PACKAGE, check=True)  # noqa: S607


class NodeWorker:
    """One runner process: ``job(ref)`` sends it the refund and returns its answer."""

    def __init__(self, config: dict[str, Any], run_ids: list[str], stderr: IO[str]) -> None:
        self.run_ids = run_ids
        self.stats: Counter[str] = Counter()
        self.process = subprocess.Popen(  # noqa: S603
            ["node", str(SCRIPT)],  # noqa: S607
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "CHAOS_TS_CONFIG": json.dumps(config)},
        )

    def job(self, ref: str) -> str:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        job = {"ref": ref, "amount_cents": amount_cents(ref)}
        if self.run_ids:
            job["run"] = run_of(ref, self.run_ids)
        try:
            self.process.stdin.write(json.dumps(job) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it died; the read below says how
        line = self.process.stdout.readline()
        if not line:
            status = self.process.wait()
            if status == CRASHED:
                raise RunnerCrash(ref)
            # Not a modelled crash: a failure of the script, which the answers show.
            return f"error:node_exit_{status}"
        answer = json.loads(line)
        self.stats = Counter(answer["stats"])
        return str(answer["answer"])

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _run(
    runner: str,
    config: dict[str, Any],
    items: list[str],
    *,
    run_ids: list[str],
    workers: int,
    log_path: Path,
    progress: Progress | None,
) -> RunReport:
    repeats: Counter[str] = Counter()
    lock = threading.Lock()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as stderr:

        def make_worker() -> tuple[Job, Callable[[], None]]:
            worker = NodeWorker(config, run_ids, stderr)

            def close() -> None:
                worker.close()
                with lock:
                    repeats.update(worker.stats)

            return worker.job, close

        started = time.monotonic()
        answers, crashes = run_jobs(items, make_worker, workers=workers, progress=progress)
    return RunReport(
        runner,
        answers,
        crashes,
        time.monotonic() - started,
        run_ids=run_ids,
        extra={"api_repeats": repeats},
    )


def run_naive_ts(
    provider: FakeProvider,
    items: list[str],
    *,
    workers: int = 16,
    timeout_s: float = 1.0,
    log_path: Path,
    progress: Progress | None = None,
) -> RunReport:
    config = {"mode": "naive", "provider_url": provider.url, "timeout_s": timeout_s}
    return _run(
        "naive-ts",
        config,
        items,
        run_ids=[],
        workers=workers,
        log_path=log_path,
        progress=progress,
    )


def run_effectgate_ts(
    base_url: str,
    token: str,
    provider: FakeProvider,
    items: list[str],
    *,
    workers: int = 16,
    timeout_s: float = 1.0,
    lease_s: int = 3,
    runs: int = 64,
    log_path: Path,
    progress: Progress | None = None,
) -> RunReport:
    """The TypeScript Runner against Effectgate, with a tool, runs and operation keys of
    its own (``TS_TOOL``, ``TS_KEY_PREFIX``), beside the Python runner's in one server."""
    ensure_built()
    repeats: Counter[str] = Counter()
    run_ids = effectgate_setup(
        base_url,
        token,
        provider,
        tool=TS_TOOL,
        runs=runs,
        external_prefix="chaos-ts-",
        repeats=repeats,
    )
    config = {
        "mode": "effectgate",
        "client_module": str(CLIENT_MODULE),
        "base_url": base_url,
        "token": token,
        "provider_url": provider.url,
        "timeout_s": timeout_s,
        "lease_s": lease_s,
        "tool": TS_TOOL,
        "key_prefix": TS_KEY_PREFIX,
    }
    report = _run(
        "effectgate-ts",
        config,
        items,
        run_ids=run_ids,
        workers=workers,
        log_path=log_path,
        progress=progress,
    )
    report.extra["api_repeats"].update(repeats)
    return report
