"""Running an event loop from a test that may share its thread with another one.

The browser tests' session-scoped Playwright keeps an asyncio loop running in the main
thread (tests/browser/conftest.py), and ``asyncio.run`` or ``anyio.run`` refuse to
start a loop in a thread that has one. ``run_in_thread`` runs them in a fresh thread,
and closes the database connections that thread opened."""

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import connections

T = TypeVar("T")


def run_in_thread(function: Callable[..., T], *args: Any) -> T:
    def body() -> T:
        try:
            return function(*args)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(body).result()
