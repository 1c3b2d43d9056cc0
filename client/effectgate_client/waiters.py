"""How a runner waits for an operation to leave a state (approval, reconciliation).

A waiter answers one question: "tell me when operation X is no longer in state S, or
when the deadline passes". ``PollingWaiter`` asks the API with capped exponential
backoff. ``NotifiedWaiter`` sleeps until something calls ``notify(operation_id)``
(typically the runner's webhook receiver, once it has checked the signature of an
``operation.*`` or ``approval.decided`` event) and falls back to slow polling, so a lost
webhook delays the runner but never strands it. Both re-read the operation from the
API after waking up: a notification says "look now", never what the new state is.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .client import EffectgateClient


class Waiter(Protocol):
    def wait(
        self, client: EffectgateClient, operation: dict[str, Any], *, status: str, deadline: float
    ) -> dict[str, Any]:
        """The operation once its status is not ``status``, or as it is at ``deadline``
        (a ``time.monotonic()`` value)."""
        ...


class PollingWaiter:
    """Poll ``GET /operations/{id}`` with capped exponential backoff and full jitter."""

    def __init__(
        self,
        *,
        initial_s: float = 0.5,
        max_s: float = 15.0,
        factor: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.factor = factor
        self.sleep = sleep
        self.clock = clock
        self.polls = 0

    def wait(
        self, client: EffectgateClient, operation: dict[str, Any], *, status: str, deadline: float
    ) -> dict[str, Any]:
        ceiling = self.initial_s
        while True:
            operation = client.get_operation(operation["id"])
            self.polls += 1
            remaining = deadline - self.clock()
            if operation["status"] != status or remaining <= 0:
                return operation
            # Full jitter spreads the polls of many runners waiting on one approver.
            delay = random.uniform(ceiling / 2, ceiling)  # noqa: S311
            self.sleep(min(delay, remaining))
            ceiling = min(self.max_s, ceiling * self.factor)


class NotifiedWaiter:
    """Wait for ``notify(operation_id)``; poll every ``fallback_poll_s`` regardless."""

    def __init__(
        self,
        *,
        fallback_poll_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fallback_poll_s = fallback_poll_s
        self.clock = clock
        self._condition = threading.Condition()
        self._versions: dict[str, int] = {}

    def notify(self, operation_id: str) -> None:
        """Something about ``operation_id`` changed: wake whoever waits for it."""
        with self._condition:
            self._versions[operation_id] = self._versions.get(operation_id, 0) + 1
            self._condition.notify_all()

    def wait(
        self, client: EffectgateClient, operation: dict[str, Any], *, status: str, deadline: float
    ) -> dict[str, Any]:
        op_id = operation["id"]
        while True:
            with self._condition:
                seen = self._versions.get(op_id, 0)
            operation = client.get_operation(op_id)
            remaining = deadline - self.clock()
            if operation["status"] != status or remaining <= 0:
                return operation
            with self._condition:
                # A notification that arrived while the GET was in flight counts: the
                # version moved, so the loop reads the operation again at once.
                self._condition.wait_for(
                    lambda seen=seen: self._versions.get(op_id, 0) != seen,
                    timeout=min(self.fallback_poll_s, remaining),
                )
