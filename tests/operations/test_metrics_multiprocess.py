"""/metrics under gunicorn with several workers: every worker's requests are counted
(prometheus_client's multiprocess mode, console/gunicorn_conf.py)."""

import os
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench.stack import Stack, fresh_database
from tests.support.db import own_database_name

pytestmark = pytest.mark.slow
TOKEN = "multiprocess-metrics-token"


def _count(text: str, route: str) -> float:
    labels = rf'method="GET",route="{route}",status="200"'
    pattern = rf"^effectgate_http_request_duration_seconds_count\{{{labels}\}} (\S+)$"
    return sum(float(value) for value in re.findall(pattern, text, re.M))


def test_every_workers_requests_are_counted(tmp_path):
    url = fresh_database(own_database_name("metrics"), base_url=os.environ.get("DATABASE_URL"))
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    env = {"PROMETHEUS_MULTIPROC_DIR": str(multiproc), "METRICS_TOKEN": TOKEN}
    with Stack(
        url,
        workers=3,
        threads=2,
        loops=False,
        env=env,
        gunicorn_config="python:console.gunicorn_conf",
        log_dir=tmp_path / "logs",
    ) as stack:

        def probe(_: int) -> int:
            # A connection each, from several threads at once: the workers share them.
            return httpx.get(
                f"{stack.base_url}/healthz", headers={"Connection": "close"}
            ).status_code

        with ThreadPoolExecutor(max_workers=6) as pool:
            assert set(pool.map(probe, range(60))) == {200}
        scraped = httpx.get(
            f"{stack.base_url}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert scraped.status_code == 200
    assert _count(scraped.text, "/healthz") == 60
    # Each worker wrote its own file: the sum came from more than one process.
    assert len(list(multiproc.glob("histogram_*.db"))) >= 2
