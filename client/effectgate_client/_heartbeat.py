"""The sync runner's heartbeat: a daemon thread that extends an attempt's lease (the
runner's ``_beat_plan``) until stopped. ``AsyncRunner`` beats in a task instead."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ._plan import drive

if TYPE_CHECKING:
    from ._effects import AttemptContext, _Lease
    from .runner import Runner


class _Heartbeat:
    """Extends an attempt's lease from a daemon thread until stopped."""

    def __init__(self, runner: Runner, context: AttemptContext, lease: _Lease | None = None):
        self.runner = runner
        self.context = context
        self.lease = lease
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            name=f"heartbeat-{context.operation_id}-{context.attempt}",
            daemon=True,
        )

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        plan = self.runner._beat_plan
        while not self._stop.wait(self.runner.heartbeat_every_s):
            if not drive(plan(self.context, self.lease), self.runner.client._perform):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.runner.heartbeat_every_s + 1)
