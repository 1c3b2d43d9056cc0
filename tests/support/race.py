"""Real concurrent HTTP clients racing against a live server (PostgreSQL tests of what
must hold exactly under concurrency: standing grant uses, window limits)."""

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx


def race_registrations(
    live_server: Any, token: str, bodies: list[dict[str, Any]]
) -> list[tuple[int, dict[str, Any]]]:
    """POST each body to /api/v1/operations at once, each from its own client (and so
    its own server thread and database connection), released together by a barrier;
    the answers' statuses and bodies, in the order of ``bodies``."""
    barrier = threading.Barrier(len(bodies))

    def register(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with httpx.Client(
            base_url=live_server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as client:
            barrier.wait()
            response = client.post("/api/v1/operations", json=body)
            return response.status_code, response.json()

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(register, bodies))
