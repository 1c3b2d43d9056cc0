"""OpenAI Agents SDK: ``guard(tool, runner=..., run=...)`` turns a ``FunctionTool`` into
one whose every invocation goes through ``AsyncRunner.execute`` on the agent's event
loop and returns Effectgate's envelope to the model (``pip install
'effectgate-client[openai-agents]'``). Pass an ``AsyncRunner``; a ``Runner`` is
mirrored by one with its settings (``AsyncRunner.like``). No call hops to a thread of
its own: the tool's invocation is awaited inside the attempt, and the heartbeat is a
task on the same loop (the SDK itself still runs a plain ``def`` tool in a thread).

The operation key is the tool's name and the model's call id (``ToolContext.
tool_call_id``): a run that repeats the same tool call (a retry after a crash, a resumed
run) is the same operation, so the effect happens at most once. The wrapped tool runs
inside the attempt; ``current_attempt().idempotency_key`` is the key to pass to the
provider. What it returns is the result; ``NotSent``, ``Failed`` and ``Unknown`` (from
``effectgate_client``) say precisely what happened, and any other exception is posted
as ``unknown`` (the tool's own error handler, ``failure_error_function``, is bypassed:
an error turned into text would look like a success; so is the SDK's
``timeout_seconds``: a call the SDK stops waiting for may have made its effect).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from agents import FunctionTool
from agents.tool_context import ToolContext

from ..errors import EffectgateError
from ..outcomes import Succeeded
from ..runner import AsyncRunner, AttemptContext, Runner
from ._common import _ATTEMPT, OnLoop, current_attempt, guarded_envelope

__all__ = ["current_attempt", "guard"]

RunId = str | Callable[[ToolContext[Any]], str]
KeyFunction = Callable[[ToolContext[Any], dict[str, Any]], str]


def _call_id_key(ctx: ToolContext[Any], arguments: dict[str, Any]) -> str:
    return f"{ctx.tool_name}:{ctx.tool_call_id}"


def guard(
    tool: FunctionTool,
    *,
    runner: AsyncRunner | Runner,
    run: RunId,
    contract: dict[str, Any] | None = None,
    operation_key: KeyFunction = _call_id_key,
) -> FunctionTool:
    """A copy of ``tool`` that Effectgate guards.

    ``run``: the Effectgate run id, or a function of the tool context that answers it
    (e.g. from your run context). ``contract``: registered as the tool's contract
    (``PUT /tools/{name}``; a warning when Effectgate stores it inactive): now with a
    ``Runner``, before the first call with an ``AsyncRunner``.
    ``operation_key``: from the context and the arguments; the default names the model's
    call. The model always gets a JSON envelope (``status``, ``code``, ``message``,
    ``allowed_next_actions``, and ``result`` once it succeeded); an approval that is
    still pending when ``runner.wait_s`` runs out comes back as ``awaiting_approval``.
    """
    on_loop = OnLoop(runner, tool.name, contract)
    invoke = getattr(tool.on_invoke_tool, "_invoke_tool_impl", tool.on_invoke_tool)

    async def on_invoke(ctx: ToolContext[Any], input_json: str) -> str:
        arguments = json.loads(input_json or "{}")
        called = False

        async def call(attempt_ctx: AttemptContext) -> Succeeded:
            nonlocal called
            called = True
            token = _ATTEMPT.set(attempt_ctx)
            try:
                output = await invoke(ctx, json.dumps(attempt_ctx.arguments))
            finally:
                _ATTEMPT.reset(token)
            return output if isinstance(output, Succeeded) else Succeeded(result=_jsonable(output))

        run_id = run(ctx) if callable(run) else run
        async_runner = await on_loop.get()
        try:
            result = await async_runner.execute(
                run=run_id,
                tool=tool.name,
                operation_key=operation_key(ctx, arguments),
                arguments=arguments,
                call=call,
                call_id=ctx.tool_call_id,
            )
        except EffectgateError as error:
            return json.dumps(guarded_envelope(error, tool=tool.name, called=called))
        return json.dumps(result.for_model(), default=str)

    # No SDK timeout: giving up on a call that may already have made its effect would
    # tell the model "timed out" while the effect happens (the lease covers a hang).
    return dataclasses.replace(tool, on_invoke_tool=on_invoke, timeout_seconds=None)


def _jsonable(value: Any) -> Any:
    """What the tool returned, as JSON Effectgate can store (text otherwise)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value
