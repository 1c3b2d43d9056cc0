"""The effects the runner's plans yield (``_plan``), beside the client's ``Send`` and
``Pause``: what ``Runner`` and ``AsyncRunner`` perform, each in its own way of waiting.

``_Register`` and ``_PostOutcome`` are the two requests a batch can carry (api.md,
Batches): a runner performs each as the client's single call, and a driver that gathers
several plans (``Runner.execute_many``, the MCP gateway's coalescing) performs many of
them in one batch request instead, with the same answers and the same typed refusals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._plan import Plan
from ._wire import _encoded_size, _outcome_bodies, _register_body
from .answers import Operation

if TYPE_CHECKING:
    from ._core import _ClientCore
    from ._wire import RegisterFields


@dataclass(frozen=True)
class AttemptContext:
    """What a tool function needs to make its call."""

    operation_id: str
    attempt: int
    idempotency_key: str
    arguments: dict[str, Any]
    lease_until: str


@dataclass
class _Lease:
    """When an attempt's lease was last known to run its full length: the claim's
    sending, then each heartbeat's that extended it (``execute_many``: a call waiting
    for a worker keeps its lease)."""

    since: float

    def renewed(self, at: float) -> None:
        self.since = max(self.since, at)


@dataclass(frozen=True)
class _Hold:
    """Effect: the runner's own wait (``retry_after_ms``, a conflict's backoff)."""

    seconds: float


@dataclass(frozen=True)
class _Await:
    """Effect: ``waiter.wait(client, operation, status=..., deadline=...)``."""

    waiter: Any
    operation: Operation
    status: str
    deadline: float


@dataclass(frozen=True)
class _Invoke:
    """Effect: call a tool (or undo) function; under the lease's heartbeat when
    ``beat`` is set. The result is what it returned; what it raised is thrown in."""

    function: Any
    context: AttemptContext
    beat: bool


@dataclass(frozen=True)
class _Register:
    """Effect: ``register(**fields)``; the result is its answer, its refusal is thrown
    in."""

    fields: RegisterFields

    def plan(self, client: _ClientCore) -> Plan[Any]:
        return client._register_plan(self.fields)

    def batch_item(self) -> dict[str, Any]:
        return dict(self.fields)

    def check(self) -> None:
        """Raise ``ValueError`` (``TypeError``) now for what ``register`` would refuse
        to send (arguments that are not JSON too)."""
        _encoded_size(_register_body(self.fields))

    def many_plan(self, client: _ClientCore, items: list[dict[str, Any]]) -> Plan[Any]:
        """``register_many`` of ``items`` (this effect's and those of its batch)."""
        return client._register_many_plan(self.fields["run"], items)


@dataclass(frozen=True)
class _PostOutcome:
    """Effect: ``post_outcome(operation_id, attempt, body)`` for an operation of the
    run ``run``; the result is its answer, its refusal is thrown in."""

    run: str
    operation_id: str
    attempt: int
    body: dict[str, Any]

    def plan(self, client: _ClientCore) -> Plan[Any]:
        return client._post_outcome_plan(self.operation_id, self.attempt, self.body)

    def batch_item(self) -> dict[str, Any]:
        return {"operation": self.operation_id, "attempt": self.attempt, **self.body}

    def check(self) -> None:
        """Raise ``ValueError`` (``TypeError``) now for what ``post_outcomes`` would
        refuse to send (a body that is not JSON too)."""
        _encoded_size(_outcome_bodies([self.batch_item()])[0])

    def many_plan(self, client: _ClientCore, items: list[dict[str, Any]]) -> Plan[Any]:
        """``post_outcomes`` of ``items`` (this effect's and those of its batch)."""
        return client._post_outcomes_plan(self.run, items)
