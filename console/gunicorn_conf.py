"""gunicorn settings Effectgate needs: ``gunicorn -c python:console.gunicorn_conf
console.wsgi --bind ...`` (other settings on the command line as usual).

With ``PROMETHEUS_MULTIPROC_DIR`` set (a directory for this machine's processes,
emptied before gunicorn starts), each worker counts into files there and ``/metrics``
adds them up; a worker that exits is marked dead so that its gauges leave the sums
(prometheus_client's multiprocess mode)."""

import os
from typing import Any


def child_exit(server: Any, worker: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
