"""The runner API over HTTP, one method per endpoint (api.md).

``EffectgateClient`` repeats its own calls when Effectgate's answer is lost (a
connection error, a timeout, a 5xx from Effectgate or a proxy in front of it). That is
safe because of how the API is built, call by call:

- ``register``: the same ``operation_key`` with the same intent answers the same
  operation (200), never a second one. An inline claim is ignored on a replay, so a
  lost answer to a registration that claimed leaves an attempt this client never saw:
  it is never used, its lease expires and Effectgate classifies it (for an irreversible
  tool: reconciliation, whose lookup finds that nothing was sent).
- ``claim``: a repeat either claims (the first never committed) or is refused with
  ``attempt_in_progress`` (it did). Either way the tool runs only with a 201 in hand.
- ``post_outcome``: the same outcome for the same attempt answers 200 with the same
  body. ``heartbeat`` and every ``GET`` are idempotent; ``put_tool`` with an unchanged
  contract answers the same version.
- ``register_many`` and ``post_outcomes`` (api.md, Batches): a batch is its items, each
  safe to repeat as its single call is; a lost answer repeats the whole batch, and the
  items answered 429 or 5xx are repeated alone, as their single calls would be.
- ``create_run`` is the exception: a lost answer may leave an empty run behind. It
  holds no operation and costs nothing.

Protocol refusals (409, 403, 422...) are never repeated here: they are answers, raised
as the typed exceptions of ``effectgate_client.errors``.

``AsyncEffectgateClient`` has the same methods, awaited, over ``httpx.AsyncClient``.
Both run the same plans (``_core``, driven by ``_plan``): which answers are repeated,
how long to wait, what a repeat's refusal means, how each body is built. Only the
waiting differs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeVar, Unpack

import httpx

from ._core import ClientSettings, _ClientCore
from ._plan import Plan, adrive, drive
from ._wire import API_PREFIX as API_PREFIX  # re-exported: where the client's paths start
from ._wire import (
    BatchItem,
    BatchRegistration,
    OutcomeItem,
    Pause,
    RegisterFields,
    Send,
    _areceive,
    _list_params,
    _next_page,
    _receive,
    _run_body,
    _segment,
)
from .answers import (
    ApprovalDetail,
    Attempt,
    Budgets,
    Event,
    Heartbeat,
    Operation,
    OutcomeAnswer,
    OutcomeBody,
    RegisteredOperation,
    Run,
    Tool,
    ToolResult,
)

T = TypeVar("T")


class EffectgateClient(_ClientCore):
    """A thread-safe client for one runner token.

    ``max_retries`` (default 6) bounds how often one call is repeated after a lost
    answer; waits between repeats follow capped exponential backoff with full jitter
    (``backoff_base_s`` 0.05 doubling up to ``backoff_max_s`` 2), or Effectgate's
    ``Retry-After`` when it sends one, at most ``max_retry_wait_s`` (60) each.
    ``timeout`` (10 s) bounds each request; an answer's body larger than
    ``max_response_bytes`` (8 MiB) is not read and raises ``UnexpectedResponse``.
    ``user_agent`` names the caller. ``sleep`` is injectable for tests.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        **settings: Unpack[ClientSettings],
    ) -> None:
        super().__init__(base_url, token, **settings)
        self.sleep = sleep
        # Whether requests go through a transport of the caller's (see ``like``).
        self.custom_transport = transport is not None
        self._http = httpx.Client(transport=transport, **self._http_options)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EffectgateClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _perform(self, effect: Any) -> Any:
        if isinstance(effect, Send):
            return _receive(self._http, effect, self.max_response_bytes)
        if isinstance(effect, Pause):
            return self.sleep(effect.seconds)
        raise TypeError(f"not an effect of the client: {effect!r}")

    def _run(self, plan: Plan[T]) -> T:
        return drive(plan, self._perform)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        max_retries: int | None = None,
    ) -> Any:
        """One API call, repeated while the answer is lost; the JSON body of a success.

        Raises the typed ``ProblemError`` for a problem answer, ``TransportError`` when
        Effectgate stayed unreachable, ``UnexpectedResponse`` for anything else.
        """
        plan = self._request_plan(method, path, json=json, params=params, max_retries=max_retries)
        return self._run(plan)

    # --- tools and runs -----------------------------------------------------------------

    def put_tool(
        self, name: str, contract: dict[str, Any], *, inactive: Literal["raise", "warn"] = "raise"
    ) -> Tool:
        """Register a contract (``PUT /tools/{name}``) and return the answer.

        A version Effectgate stores but does not activate (``active: false``: it weakens
        the active one, ``weakens`` says how) raises ``ContractNotActive``, because the
        calls that follow would silently run under the old contract. ``inactive="warn"``
        warns with ``ContractNotActiveWarning`` and returns the answer instead.
        """
        return self._run(self._put_tool_plan(name, contract, inactive))

    def get_tool(self, name: str) -> Tool:
        return self.request("GET", f"/tools/{_segment(name)}")

    def create_run(
        self,
        *,
        principal: str,
        external_id: str | None = None,
        budgets: Budgets | dict[str, Any] | None = None,
    ) -> Run:
        return self.request("POST", "/runs", json=_run_body(principal, external_id, budgets))

    def get_run(self, run_id: str) -> Run:
        return self.request("GET", f"/runs/{_segment(run_id)}")

    def cancel_run(self, run_id: str) -> Run:
        return self.request("POST", f"/runs/{_segment(run_id)}/cancel")

    # --- operations -----------------------------------------------------------------------

    def register(self, **fields: Unpack[RegisterFields]) -> RegisteredOperation:
        """Register an intended effect, or get back the one registered under the key.

        ``run``, ``tool``, ``operation_key`` and ``arguments`` are required; ``call_id``
        and ``turn`` name the model's call, ``approval`` is the runner's approval hint.
        With ``claim_lease_s`` the first attempt is claimed in the same round trip when
        the new operation is ``ready``: the body then carries ``attempt`` (or ``null``
        with ``claim_error``). A replay (status 200) never claims.
        """
        return self._run(self._register_plan(fields))

    def register_many(
        self, run_id: str, registrations: Sequence[BatchRegistration | Mapping[str, Any]]
    ) -> list[BatchItem[RegisteredOperation]]:
        """Register 1 to 50 intended effects of the run ``run_id`` in one request
        (api.md, Batches); each item is what ``register`` takes (``run`` may be left
        out). Returns each item's ``BatchItem``, in order: the operation ``register``
        returns, or the ``error`` it would raise. A refusal of the whole request (the
        token, its rate, an unreachable Effectgate) raises, as ``register`` does, while
        none of the batch's items has been answered; after that (a batch split into
        several requests by ``max_batch_bytes``, a repeat of items answered 5xx) it is
        the ``error`` of each item not answered, and the items answered are kept. A
        batch of no or more than 50 items raises ``ValueError`` before sending."""
        return self._run(self._register_many_plan(run_id, registrations))

    def get_operation(self, operation_id: str) -> Operation:
        return self._run(self._get_operation_plan(operation_id))

    def list_operations(
        self,
        *,
        status: str | None = None,
        run: str | None = None,
        tool: str | None = None,
        limit: int = 200,
    ) -> Iterator[Operation]:
        """Every matching operation, newest first, following the cursor."""
        path: str | None = "/operations"
        params: dict[str, Any] | None = _list_params(status, run, tool, limit)
        while path is not None:
            page = self.request("GET", path, params=params)
            yield from page["results"]
            path, params = _next_page(page), None

    def events(self, operation_id: str) -> list[Event]:
        return self.request("GET", f"/operations/{_segment(operation_id)}/events")

    def tool_result(self, operation_id: str) -> ToolResult:
        """The envelope to hand back to the model (status, code, message, next actions)."""
        return self._run(self._tool_result_plan(operation_id))

    def get_approval(self, approval_id: str) -> ApprovalDetail:
        return self.request("GET", f"/approvals/{_segment(approval_id)}")

    # --- attempts -------------------------------------------------------------------------

    def claim(self, operation_id: str, *, lease_s: int = 30) -> Attempt:
        """Claim the next attempt; raises the claim refusal's typed exception."""
        return self._run(self._claim_plan(operation_id, lease_s))

    def heartbeat(
        self, operation_id: str, attempt: int, *, lease_s: int = 30, max_retries: int | None = None
    ) -> Heartbeat:
        return self._run(self._heartbeat_plan(operation_id, attempt, lease_s, max_retries))

    def post_outcome(
        self, operation_id: str, attempt: int, outcome: OutcomeBody | dict[str, Any]
    ) -> OutcomeAnswer:
        """Post an attempt's outcome (``{"kind": "succeeded" | "failed" | "unknown",
        ...}``); the operation after classification. Repeating it is safe."""
        return self._run(self._post_outcome_plan(operation_id, attempt, outcome))

    def post_outcomes(
        self, run_id: str, outcomes: Sequence[OutcomeItem | Mapping[str, Any]]
    ) -> list[BatchItem[OutcomeAnswer]]:
        """Post 1 to 50 outcomes of attempts of the run ``run_id`` in one request, each
        an outcome with the ``operation`` and ``attempt`` it is for; each item's
        ``BatchItem``, in order, as ``register_many``. Repeating it is safe."""
        return self._run(self._post_outcomes_plan(run_id, outcomes))

    # --- reconciliation and compensation -----------------------------------------------------

    def reconcile(
        self,
        operation_id: str,
        *,
        result: str,
        downstream_id: str | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> Operation:
        """Answer an ``outcome_unknown`` operation: committed, not_found or still_unknown.

        When the answer to a ``committed`` or ``not_found`` was lost and the repeat
        finds the operation no longer unknown (``not_unknown``), the first try went
        through: the operation as it is now is returned.
        """
        return self._run(self._reconcile_plan(operation_id, result, downstream_id, evidence))

    def compensate(
        self, operation_id: str, *, result: str, evidence: dict[str, Any] | None = None
    ) -> Operation:
        """Record the undo of a ``compensating`` operation (``committed`` or ``failed``)."""
        return self._run(self._compensate_plan(operation_id, result, evidence))


class AsyncEffectgateClient(_ClientCore):
    """``EffectgateClient`` for asyncio (``httpx.AsyncClient``): the same methods,
    awaited, with the same repeats. Use it with ``async with`` or ``await aclose()``;
    share one per event loop. ``sleep`` is injectable for tests."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        **settings: Unpack[ClientSettings],
    ) -> None:
        super().__init__(base_url, token, **settings)
        self.sleep = sleep
        self._http = httpx.AsyncClient(transport=transport, **self._http_options)

    @classmethod
    def like(cls, client: EffectgateClient) -> AsyncEffectgateClient:
        """An asynchronous client with the settings of ``client``: its URL, token,
        timeout and repeats. A transport of the caller's cannot be carried over (it
        blocks): pass an ``AsyncEffectgateClient`` with an async one instead."""
        if client.custom_transport:
            raise TypeError(
                "this EffectgateClient sends through a transport of its own, which an "
                "AsyncEffectgateClient cannot use: make an AsyncEffectgateClient (and an "
                "AsyncRunner) with an httpx.AsyncBaseTransport"
            )
        return cls(client.base_url, **client._settings)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncEffectgateClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _perform(self, effect: Any) -> Any:
        if isinstance(effect, Send):
            return await _areceive(self._http, effect, self.max_response_bytes)
        if isinstance(effect, Pause):
            return await self.sleep(effect.seconds)
        raise TypeError(f"not an effect of the client: {effect!r}")

    async def _run(self, plan: Plan[T]) -> T:
        return await adrive(plan, self._perform)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        max_retries: int | None = None,
    ) -> Any:
        """``EffectgateClient.request``, awaited."""
        plan = self._request_plan(method, path, json=json, params=params, max_retries=max_retries)
        return await self._run(plan)

    # --- tools and runs -----------------------------------------------------------------

    async def put_tool(
        self, name: str, contract: dict[str, Any], *, inactive: Literal["raise", "warn"] = "raise"
    ) -> Tool:
        """``EffectgateClient.put_tool``: raises ``ContractNotActive`` (or warns with
        ``inactive="warn"``) when the version is stored but not active."""
        return await self._run(self._put_tool_plan(name, contract, inactive))

    async def get_tool(self, name: str) -> Tool:
        return await self.request("GET", f"/tools/{_segment(name)}")

    async def create_run(
        self,
        *,
        principal: str,
        external_id: str | None = None,
        budgets: Budgets | dict[str, Any] | None = None,
    ) -> Run:
        body = _run_body(principal, external_id, budgets)
        return await self.request("POST", "/runs", json=body)

    async def get_run(self, run_id: str) -> Run:
        return await self.request("GET", f"/runs/{_segment(run_id)}")

    async def cancel_run(self, run_id: str) -> Run:
        return await self.request("POST", f"/runs/{_segment(run_id)}/cancel")

    # --- operations -----------------------------------------------------------------------

    async def register(self, **fields: Unpack[RegisterFields]) -> RegisteredOperation:
        """``EffectgateClient.register``, awaited."""
        return await self._run(self._register_plan(fields))

    async def register_many(
        self, run_id: str, registrations: Sequence[BatchRegistration | Mapping[str, Any]]
    ) -> list[BatchItem[RegisteredOperation]]:
        """``EffectgateClient.register_many``, awaited."""
        return await self._run(self._register_many_plan(run_id, registrations))

    async def get_operation(self, operation_id: str) -> Operation:
        return await self._run(self._get_operation_plan(operation_id))

    async def list_operations(
        self,
        *,
        status: str | None = None,
        run: str | None = None,
        tool: str | None = None,
        limit: int = 200,
    ) -> AsyncIterator[Operation]:
        """Every matching operation, newest first, following the cursor
        (``async for``)."""
        path: str | None = "/operations"
        params: dict[str, Any] | None = _list_params(status, run, tool, limit)
        while path is not None:
            page = await self.request("GET", path, params=params)
            for operation in page["results"]:
                yield operation
            path, params = _next_page(page), None

    async def events(self, operation_id: str) -> list[Event]:
        return await self.request("GET", f"/operations/{_segment(operation_id)}/events")

    async def tool_result(self, operation_id: str) -> ToolResult:
        return await self._run(self._tool_result_plan(operation_id))

    async def get_approval(self, approval_id: str) -> ApprovalDetail:
        return await self.request("GET", f"/approvals/{_segment(approval_id)}")

    # --- attempts -------------------------------------------------------------------------

    async def claim(self, operation_id: str, *, lease_s: int = 30) -> Attempt:
        return await self._run(self._claim_plan(operation_id, lease_s))

    async def heartbeat(
        self, operation_id: str, attempt: int, *, lease_s: int = 30, max_retries: int | None = None
    ) -> Heartbeat:
        return await self._run(self._heartbeat_plan(operation_id, attempt, lease_s, max_retries))

    async def post_outcome(
        self, operation_id: str, attempt: int, outcome: OutcomeBody | dict[str, Any]
    ) -> OutcomeAnswer:
        return await self._run(self._post_outcome_plan(operation_id, attempt, outcome))

    async def post_outcomes(
        self, run_id: str, outcomes: Sequence[OutcomeItem | Mapping[str, Any]]
    ) -> list[BatchItem[OutcomeAnswer]]:
        """``EffectgateClient.post_outcomes``, awaited."""
        return await self._run(self._post_outcomes_plan(run_id, outcomes))

    # --- reconciliation and compensation -----------------------------------------------------

    async def reconcile(
        self,
        operation_id: str,
        *,
        result: str,
        downstream_id: str | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> Operation:
        """``EffectgateClient.reconcile``: a repeat that finds the operation no longer
        unknown returns the operation as it is now."""
        return await self._run(self._reconcile_plan(operation_id, result, downstream_id, evidence))

    async def compensate(
        self, operation_id: str, *, result: str, evidence: dict[str, Any] | None = None
    ) -> Operation:
        return await self._run(self._compensate_plan(operation_id, result, evidence))
