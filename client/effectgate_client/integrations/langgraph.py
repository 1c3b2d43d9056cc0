"""LangChain tools and LangGraph graphs: ``guard(tool, runner=..., run=...)`` wraps a
``BaseTool`` so that every call goes through ``Runner.execute`` and the model reads
Effectgate's envelope (``pip install 'effectgate-client[langgraph]'``).

Inside a graph (a ``ToolNode``), an operation that waits for a person does not block
the graph: the tool raises LangGraph's ``interrupt`` with the approval page's link, the
graph's state is saved by its checkpointer, and when you resume it with
``Command(resume=...)`` (after the ``approval.decided`` webhook, or when a person says
so) the node runs again: the same operation key finds the same operation, now approved
or rejected. Resumed too early, it interrupts again.

Async graphs (``ainvoke``, ``astream``) run the call on their event loop with an
``AsyncRunner`` (pass one; a ``Runner`` is mirrored per loop by ``AsyncRunner.like``),
awaiting the wrapped tool's ``ainvoke``: no hop to a thread of the adapter's own.

The operation key is the tool's name and the model's tool-call id, so a graph that
replays a step (a retry, a resume) repeats no effect; without a call id, the run, the
thread id, the tool and the canonical arguments. The wrapped tool runs inside the attempt
(``current_attempt().idempotency_key`` is the key for the provider); let its errors
propagate (``handle_tool_error`` off): an error turned into text looks like a success.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp
from langgraph.types import interrupt

from .._plan import Plan, adrive, drive
from ..errors import EffectgateError
from ..outcomes import Succeeded
from ..runner import AsyncRunner, AttemptContext, Runner, ToolCallResult
from ._common import _ATTEMPT, OnLoop, current_attempt, derived_key, guarded_envelope

__all__ = ["GuardedTool", "current_attempt", "guard"]

_TOOL_CALL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "effectgate_tool_call_id", default=None
)


class GuardedTool(BaseTool):
    """A ``BaseTool`` whose calls Effectgate guards; made by ``guard``."""

    inner: BaseTool
    runner: Any
    on_loop: Any
    effectgate_run: Any
    operation_key_for: Any = None
    interrupt_for_approval: bool = True

    def run(self, tool_input: Any, *args: Any, tool_call_id: str | None = None, **kwargs: Any):
        token = _TOOL_CALL_ID.set(tool_call_id)
        try:
            return super().run(tool_input, *args, tool_call_id=tool_call_id, **kwargs)
        finally:
            _TOOL_CALL_ID.reset(token)

    async def arun(
        self, tool_input: Any, *args: Any, tool_call_id: str | None = None, **kwargs: Any
    ):
        # Async graphs call ainvoke -> arun -> _arun, on the loop: the call id travels
        # in the context.
        token = _TOOL_CALL_ID.set(tool_call_id)
        try:
            return await super().arun(tool_input, *args, tool_call_id=tool_call_id, **kwargs)
        finally:
            _TOOL_CALL_ID.reset(token)

    def _key(self, arguments: dict[str, Any], config: RunnableConfig | None, run: str) -> str:
        call_id = _TOOL_CALL_ID.get()
        if self.operation_key_for is not None:
            return str(self.operation_key_for(call_id, arguments, config))
        if call_id:
            return f"{self.name}:{call_id}"
        thread = ((config or {}).get("configurable") or {}).get("thread_id")
        return derived_key(run, thread, self.name, arguments)

    def _call_options(
        self, arguments: dict[str, Any], key: str, run: str, approval_wait_s: float | None
    ) -> dict[str, Any]:
        return {
            "run": run,
            "tool": self.name,
            "operation_key": key,
            "arguments": arguments,
            "call_id": _TOOL_CALL_ID.get(),
            "approval_wait_s": approval_wait_s,
        }

    def _run(self, config: RunnableConfig, **arguments: Any) -> str:
        runner = self.runner
        if not isinstance(runner, Runner):
            raise TypeError(
                f"{self.name} is guarded with an AsyncRunner: call it with ainvoke (an async "
                "graph), or guard it with a Runner"
            )
        run, key = self._names(config, arguments)
        called: list[bool] = []

        def call(attempt: AttemptContext) -> Succeeded:
            called.append(True)
            token = _ATTEMPT.set(attempt)
            try:
                return _succeeded(self.inner.invoke(attempt.arguments))
            finally:
                _ATTEMPT.reset(token)

        def perform(approval_wait_s: float | None) -> ToolCallResult:
            options = self._call_options(arguments, key, run, approval_wait_s)
            return runner.execute(call=call, **options)

        return drive(self._flow(called), perform)

    async def _arun(self, config: RunnableConfig, **arguments: Any) -> str:
        runner: AsyncRunner = await self.on_loop.get()
        run, key = self._names(config, arguments)
        called: list[bool] = []

        async def call(attempt: AttemptContext) -> Succeeded:
            called.append(True)
            token = _ATTEMPT.set(attempt)
            try:
                return _succeeded(await self.inner.ainvoke(attempt.arguments))
            finally:
                _ATTEMPT.reset(token)

        async def perform(approval_wait_s: float | None) -> ToolCallResult:
            options = self._call_options(arguments, key, run, approval_wait_s)
            return await runner.execute(call=call, **options)

        return await adrive(self._flow(called), perform)

    def _names(self, config: RunnableConfig, arguments: dict[str, Any]) -> tuple[str, str]:
        run = self.effectgate_run(config) if callable(self.effectgate_run) else self.effectgate_run
        return run, self._key(arguments, config, run)

    def _flow(self, called: list[bool]) -> Plan[str]:
        """The call as the model reads it, for both paths: each ``yield`` is one
        ``execute`` with that ``approval_wait_s``."""
        try:
            if not self.interrupt_for_approval:
                result = yield None
            else:
                # Do not hold the graph while a person decides: ask once, then interrupt.
                result = yield 0
                while result.status == "awaiting_approval":
                    try:
                        interrupt(_approval_request(self.runner, result))
                    except (RuntimeError, KeyError):
                        # Not inside a graph (no checkpointer to resume from): wait.
                        result = yield None
                        break
                    result = yield 0
        except GraphBubbleUp:
            raise
        except EffectgateError as error:
            return json.dumps(guarded_envelope(error, tool=self.name, called=bool(called)))
        return json.dumps(result.for_model(), default=str)


def _succeeded(output: Any) -> Succeeded:
    if isinstance(output, Succeeded):
        return output
    return Succeeded(result=_jsonable(getattr(output, "content", output)))


def _approval_request(runner: Runner | AsyncRunner, result: ToolCallResult) -> dict[str, Any]:
    """What the graph's caller sees while the operation waits for a person."""
    approval: Mapping[str, Any] = result.operation.get("approval") or {}
    base = runner.client.base_url
    return {
        "effectgate": "approval_required",
        "operation": result.operation["id"],
        "tool": result.operation["tool"],
        "approval": approval.get("id"),
        "approval_url": f"{base}/approvals/{approval['id']}/" if approval.get("id") else None,
        "message": result.envelope.get("message"),
    }


def guard(
    tool: BaseTool,
    *,
    runner: Runner | AsyncRunner,
    run: str | Callable[[RunnableConfig | None], str],
    contract: dict[str, Any] | None = None,
    operation_key: Callable[[str | None, dict[str, Any], RunnableConfig | None], str] | None = None,
    interrupt_for_approval: bool = True,
) -> GuardedTool:
    """``tool`` guarded by Effectgate.

    ``run``: the Effectgate run id, or a function of the runnable config (e.g. one run
    per LangGraph thread). ``runner``: a ``Runner`` serves both ``invoke`` and
    ``ainvoke``; an ``AsyncRunner`` serves ``ainvoke`` only. ``contract``: registered
    now with a ``Runner``, before the first call with an ``AsyncRunner``
    (``PUT /tools/{name}``; a warning when stored inactive). ``interrupt_for_approval``:
    inside a graph, interrupt while a person decides (needs a checkpointer); off, wait up
    to ``runner.wait_s``.
    """
    on_loop = OnLoop(runner, tool.name, contract, mirror_now=False)
    return GuardedTool(
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        inner=tool,
        runner=runner,
        on_loop=on_loop,
        effectgate_run=run,
        operation_key_for=operation_key,
        interrupt_for_approval=interrupt_for_approval,
    )


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value
