"""OpenAI Agents SDK: ``guard(tool, runner=..., run=...)`` turns a ``FunctionTool`` into
one whose every invocation goes through ``Runner.execute`` and returns Effectgate's
envelope to the model (``pip install 'effectgate-client[openai-agents]'``).

The operation key is the tool's name and the model's call id (``ToolContext.
tool_call_id``): a run that repeats the same tool call (a retry after a crash, a resumed
run) is the same operation, so the effect happens at most once. The wrapped tool runs
inside the attempt; ``current_attempt().idempotency_key`` is the key to pass to the
provider. What it returns is the result; ``NotSent``, ``Failed`` and ``Unknown`` (from
``effectgate_client``) say precisely what happened, and any other exception is posted
as ``unknown`` (the tool's own error handler, ``failure_error_function``, is bypassed:
an error turned into text would look like a success; so is the SDK's
``timeout_seconds``: a call the SDK stops waiting for goes on in its thread).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from agents import FunctionTool
from agents.tool_context import ToolContext

from ..errors import EffectgateError
from ..outcomes import Succeeded
from ..runner import AttemptContext, Runner
from ._common import _ATTEMPT, current_attempt, guarded_envelope, register_contract

__all__ = ["current_attempt", "guard"]

RunId = str | Callable[[ToolContext[Any]], str]
KeyFunction = Callable[[ToolContext[Any], dict[str, Any]], str]


def _call_id_key(ctx: ToolContext[Any], arguments: dict[str, Any]) -> str:
    return f"{ctx.tool_name}:{ctx.tool_call_id}"


def guard(
    tool: FunctionTool,
    *,
    runner: Runner,
    run: RunId,
    contract: dict[str, Any] | None = None,
    operation_key: KeyFunction = _call_id_key,
) -> FunctionTool:
    """A copy of ``tool`` that Effectgate guards.

    ``run``: the Effectgate run id, or a function of the tool context that answers it
    (e.g. from your run context). ``contract``: registered as the tool's contract now
    (``PUT /tools/{name}``; a warning when Effectgate stores it inactive).
    ``operation_key``: from the context and the arguments; the default names the model's
    call. The model always gets a JSON envelope (``status``, ``code``, ``message``,
    ``allowed_next_actions``, and ``result`` once it succeeded); an approval that is
    still pending when ``runner.wait_s`` runs out comes back as ``awaiting_approval``.
    """
    register_contract(runner, tool.name, contract)
    invoke = getattr(tool.on_invoke_tool, "_invoke_tool_impl", tool.on_invoke_tool)

    async def on_invoke(ctx: ToolContext[Any], input_json: str) -> str:
        arguments = json.loads(input_json or "{}")
        loop = asyncio.get_running_loop()

        async def attempt(attempt_ctx: AttemptContext) -> Any:
            _ATTEMPT.set(attempt_ctx)
            return await invoke(ctx, json.dumps(attempt_ctx.arguments))

        called = False

        def call(attempt_ctx: AttemptContext) -> Any:
            nonlocal called
            called = True
            output = asyncio.run_coroutine_threadsafe(attempt(attempt_ctx), loop).result()
            return output if isinstance(output, Succeeded) else Succeeded(result=_jsonable(output))

        run_id = run(ctx) if callable(run) else run
        try:
            result = await asyncio.to_thread(
                runner.execute,
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

    # No SDK timeout: giving up on a call that goes on in its thread would tell the
    # model "timed out" while the effect happens (the runner's lease covers a hang).
    return dataclasses.replace(tool, on_invoke_tool=on_invoke, timeout_seconds=None)


def _jsonable(value: Any) -> Any:
    """What the tool returned, as JSON Effectgate can store (text otherwise)."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value
