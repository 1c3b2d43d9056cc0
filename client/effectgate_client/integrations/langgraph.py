"""LangChain tools and LangGraph graphs: ``guard(tool, runner=..., run=...)`` wraps a
``BaseTool`` so that every call goes through ``Runner.execute`` and the model reads
Effectgate's envelope (``pip install 'effectgate-client[langgraph]'``).

Inside a graph (a ``ToolNode``), an operation that waits for a person does not block
the graph: the tool raises LangGraph's ``interrupt`` with the approval page's link, the
graph's state is saved by its checkpointer, and when you resume it with
``Command(resume=...)`` (after the ``approval.decided`` webhook, or when a person says
so) the node runs again: the same operation key finds the same operation, now approved
or rejected. Resumed too early, it interrupts again.

The operation key is the tool's name and the model's tool-call id, so a graph that
replays a step (a retry, a resume) repeats no effect; without a call id, the run, the
thread id, the tool and the canonical arguments. The wrapped tool runs inside the attempt
(``current_attempt().idempotency_key`` is the key for the provider); let its errors
propagate (``handle_tool_error`` off): an error turned into text looks like a success.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp
from langgraph.types import interrupt

from ..errors import EffectgateError
from ..outcomes import Succeeded
from ..runner import AttemptContext, Runner, ToolCallResult
from ._common import (
    _ATTEMPT,
    current_attempt,
    derived_key,
    guarded_envelope,
    register_contract,
)

__all__ = ["GuardedTool", "current_attempt", "guard"]

_TOOL_CALL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "effectgate_tool_call_id", default=None
)


class GuardedTool(BaseTool):
    """A ``BaseTool`` whose calls Effectgate guards; made by ``guard``."""

    inner: BaseTool
    runner: Any
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
        # Async graphs call ainvoke -> arun -> _arun (run_in_executor -> _run): the
        # call id travels in the copied context.
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

    def _execute(
        self,
        arguments: dict[str, Any],
        key: str,
        run: str,
        called: list[bool],
        approval_wait_s: float | None,
    ):
        def call(attempt: AttemptContext) -> Any:
            called.append(True)
            token = _ATTEMPT.set(attempt)
            try:
                output = self.inner.invoke(attempt.arguments)
            finally:
                _ATTEMPT.reset(token)
            if isinstance(output, Succeeded):
                return output
            return Succeeded(result=_jsonable(getattr(output, "content", output)))

        runner: Runner = self.runner
        return runner.execute(
            run=run,
            tool=self.name,
            operation_key=key,
            arguments=arguments,
            call=call,
            call_id=_TOOL_CALL_ID.get(),
            approval_wait_s=approval_wait_s,
        )

    def _run(self, config: RunnableConfig, **arguments: Any) -> str:
        run = self.effectgate_run(config) if callable(self.effectgate_run) else self.effectgate_run
        key = self._key(arguments, config, run)
        called: list[bool] = []
        try:
            if not self.interrupt_for_approval:
                result = self._execute(arguments, key, run, called, None)
            else:
                # Do not hold the graph while a person decides: ask once, then interrupt.
                result = self._execute(arguments, key, run, called, 0)
                while result.status == "awaiting_approval":
                    try:
                        interrupt(_approval_request(self.runner, result))
                    except (RuntimeError, KeyError):
                        # Not inside a graph (no checkpointer to resume from): wait.
                        result = self._execute(arguments, key, run, called, None)
                        break
                    result = self._execute(arguments, key, run, called, 0)
        except GraphBubbleUp:
            raise
        except EffectgateError as error:
            return json.dumps(guarded_envelope(error, tool=self.name, called=bool(called)))
        return json.dumps(result.for_model(), default=str)


def _approval_request(runner: Runner, result: ToolCallResult) -> dict[str, Any]:
    """What the graph's caller sees while the operation waits for a person."""
    approval = result.operation.get("approval") or {}
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
    runner: Runner,
    run: str | Callable[[RunnableConfig | None], str],
    contract: dict[str, Any] | None = None,
    operation_key: Callable[[str | None, dict[str, Any], RunnableConfig | None], str] | None = None,
    interrupt_for_approval: bool = True,
) -> GuardedTool:
    """``tool`` guarded by Effectgate.

    ``run``: the Effectgate run id, or a function of the runnable config (e.g. one run
    per LangGraph thread). ``contract``: registered now (``PUT /tools/{name}``; a
    warning when stored inactive). ``interrupt_for_approval``: inside a graph, interrupt
    while a person decides (needs a checkpointer); off, wait up to ``runner.wait_s``.
    """
    register_contract(runner, tool.name, contract)
    return GuardedTool(
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        inner=tool,
        runner=runner,
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
