"""Background work without a broker: the beat schedule run on a thread (local mode).

``manage.py runlocal`` starts it beside the development server. It calls the same
Celery task functions as production workers do, synchronously, so local mode exercises
the same code; SQLite serializes the writes (IMMEDIATE transactions, busy timeout).
"""

import logging
import threading
import time
from importlib import import_module

from django.db import close_old_connections, connections

from .celery import app

logger = logging.getLogger(__name__)


class LocalScheduler(threading.Thread):
    def __init__(self, schedule: dict, *, tick: float = 0.5) -> None:
        super().__init__(name="effectgate-local-beat", daemon=True)
        self.entries = [(entry["task"], float(entry["schedule"])) for entry in schedule.values()]
        self.tick = tick
        self.stopping = threading.Event()
        # Celery registers tasks when their modules are imported, which a worker does at
        # start and a web process may never do: import each scheduled task's module.
        for name, _ in self.entries:
            import_module(name.rsplit(".", 1)[0])

    def run_due(self, next_runs: dict[str, float]) -> None:
        now = time.monotonic()
        for name, interval in self.entries:
            if next_runs.get(name, 0.0) > now:
                continue
            next_runs[name] = now + interval
            try:
                app.tasks[name].apply(throw=True)
            except Exception:
                logger.exception("Background task %s failed; it runs again later.", name)
            finally:
                close_old_connections()

    def run(self) -> None:
        next_runs: dict[str, float] = {}
        try:
            while not self.stopping.is_set():
                self.run_due(next_runs)
                self.stopping.wait(self.tick)
        finally:
            connections.close_all()  # this thread's own connections

    def stop(self) -> None:
        self.stopping.set()
