"""What the framework adapters share: the attempt a guarded tool runs for, the
envelope a model reads, contract registration, and the ``AsyncRunner`` an async
adapter runs on."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import weakref
from typing import Any

import rfc8785

from ..errors import EffectgateError, ProblemError, TransportError
from ..runner import AsyncRunner, AttemptContext, Runner, ToolCallResult

_ATTEMPT: contextvars.ContextVar[AttemptContext | None] = contextvars.ContextVar(
    "effectgate_attempt", default=None
)


def current_attempt() -> AttemptContext | None:
    """The Effectgate attempt the running guarded tool serves (its ``idempotency_key``
    is the one to pass to the provider), or None outside a guarded call."""
    return _ATTEMPT.get()


def register_contract(runner: Runner, name: str, contract: dict[str, Any] | None) -> None:
    """``PUT /tools/{name}``; a version stored inactive (it weakens the active one)
    runs under the old contract until a person activates it, so warn loudly
    (``ContractNotActiveWarning``) rather than stop the agent."""
    if contract is None:
        return
    runner.client.put_tool(name, contract, inactive="warn")


class OnLoop:
    """The ``AsyncRunner`` an async adapter uses on the running event loop.

    Given an ``AsyncRunner``, that one (made for the loop it runs on). Given a
    ``Runner``, an ``AsyncRunner.like`` it per event loop, since an async client's
    connections belong to the loop that opened them (a program may ``asyncio.run``
    its agent more than once). Either way the call runs on the loop: no thread.

    A contract that could not be registered when the adapter was made (an
    ``AsyncRunner`` needs its loop) is registered before the first call: one
    registration per loop that every call awaits, so none runs before it is done (and
    under whatever version was active). A failed registration raises in every call
    that awaited it, and the next call tries again; it is done once it succeeded.
    """

    def __init__(
        self,
        runner: Runner | AsyncRunner,
        name: str,
        contract: dict[str, Any] | None,
        *,
        mirror_now: bool = True,
    ) -> None:
        self.runner = runner
        self.name = name
        self._contract = contract
        self._mirrors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncRunner] = (
            weakref.WeakKeyDictionary()
        )
        # The first loop's mirror, made now unless the adapter also runs synchronously:
        # a Runner that cannot be mirrored (a transport or a waiter of its own) is
        # refused here, not at the first call.
        self._unused: AsyncRunner | None = None
        self._registering: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Task[Any]
        ] = weakref.WeakKeyDictionary()
        if isinstance(runner, Runner):
            if mirror_now:
                self._unused = AsyncRunner.like(runner)
            register_contract(runner, name, contract)
            self._contract = None

    async def get(self) -> AsyncRunner:
        if isinstance(self.runner, AsyncRunner):
            runner = self.runner
        else:
            loop = asyncio.get_running_loop()
            mirrored = self._mirrors.get(loop)
            if mirrored is None:
                mirrored, self._unused = self._unused or AsyncRunner.like(self.runner), None
                self._mirrors[loop] = mirrored
            runner = mirrored
        if self._contract is not None:
            await self._register(runner, self._contract)
        return runner

    async def _register(self, runner: AsyncRunner, contract: dict[str, Any]) -> None:
        loop = asyncio.get_running_loop()
        task = self._registering.get(loop)
        if task is None:
            task = loop.create_task(runner.client.put_tool(self.name, contract, inactive="warn"))
            self._registering[loop] = task
        try:
            # Shielded: a caller cancelled while waiting does not cancel the others' wait.
            await asyncio.shield(task)
        except Exception:
            if self._registering.get(loop) is task:
                del self._registering[loop]  # the next call registers again
            raise
        self._contract = None


def derived_key(*parts: Any) -> str:
    """An operation key from what identifies one intended call.

    The parts are hashed in their RFC 8785 canonical form, the form Effectgate's intent
    hash uses: arguments that are one intent to Effectgate (``500`` and ``500.0``, keys
    in any order, a character written escaped or not) give one key, so a repeated call
    is the same operation instead of a second effect.
    """
    try:
        text = rfc8785.dumps(list(parts))
    except rfc8785.CanonicalizationError:
        # No canonical form (an integer beyond ±(2^53-1), NaN, Infinity): Effectgate
        # refuses such arguments itself, so the key only has to be stable for them.
        text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str).encode()
    return "eg:" + hashlib.sha256(text).hexdigest()[:40]


def for_model(result: ToolCallResult) -> dict[str, Any]:
    return result.for_model()


def unrecorded_envelope(error: EffectgateError, *, tool: str) -> dict[str, Any]:
    """What the model reads when the tool ran but Effectgate did not hear how it ended
    (the outcome could not be posted, or the answer after it was lost): the effect may
    exist, so the model must not make the call again as a new one."""
    return {
        "status": "outcome_unknown",
        "code": "outcome_not_recorded",
        "logical_operation_id": getattr(error, "operation_id", None),
        "message": f"The call to {tool} was made, but its outcome could not be recorded; "
        "it is being reconciled. Do not retry it.",
        "allowed_next_actions": ["reconcile"],
    }


def guarded_envelope(error: EffectgateError, *, tool: str, called: bool) -> dict[str, Any]:
    """The envelope for an error of ``Runner.execute``: before the tool ran, a refusal;
    after, an unknown outcome."""
    return unrecorded_envelope(error, tool=tool) if called else refusal_envelope(error, tool=tool)


def refusal_envelope(error: EffectgateError, *, tool: str) -> dict[str, Any]:
    """What the model reads when Effectgate refused the call or could not be reached:
    the envelope's shape, so the model sees one kind of answer."""
    if isinstance(error, ProblemError):
        return error.for_model()
    if isinstance(error, TransportError):
        return {
            "status": "refused",
            "code": "effectgate_unreachable",
            "logical_operation_id": None,
            "message": f"The call to {tool} was not made: Effectgate could not be reached. "
            "Try again later with the same arguments.",
            "allowed_next_actions": [],
        }
    return {
        "status": "refused",
        "code": "effectgate_error",
        "logical_operation_id": None,
        "message": f"The call to {tool} was not made: {error}",
        "allowed_next_actions": [],
    }
