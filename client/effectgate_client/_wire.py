"""What goes over the wire for both clients: the transport's two effects (``Send`` a
request, ``Pause`` before a repeat), the reading of an answer with a cap on its body,
and the request bodies and paths the endpoints take. No state and no policy: which
answers are repeated, and when, is ``client._ClientCore``'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NotRequired, Required, TypedDict, TypeVar
from urllib.parse import quote

import httpx

from .answers import Budgets, OutcomeBody
from .errors import EffectgateError, UnexpectedResponse, request_id_of

API_PREFIX = "/api/v1"
# Items per batch request (api.md, Batches).
BATCH_MAX_ITEMS = 50

A = TypeVar("A")


def _segment(value: str) -> str:
    return quote(str(value), safe="")


@dataclass(frozen=True)
class Send:
    """Effect: send one HTTP request; the result is the ``httpx.Response``."""

    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None


def _too_large(response: httpx.Response, limit: int) -> UnexpectedResponse:
    return UnexpectedResponse(
        response.status_code,
        f"the answer's body is larger than max_response_bytes ({limit}); not read",
        request_id=request_id_of(response),
    )


def _declared_too_large(response: httpx.Response, limit: int) -> bool:
    declared = response.headers.get("Content-Length", "")
    return declared.isdigit() and int(declared) > limit


def _receive(http: httpx.Client, effect: Send, limit: int) -> httpx.Response:
    """Send ``effect`` and read at most ``limit`` bytes of the answer's (decoded) body."""
    request = http.build_request(effect.method, effect.path, json=effect.json, params=effect.params)
    response = http.send(request, stream=True)
    try:
        if _declared_too_large(response, limit):
            raise _too_large(response, limit)
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > limit:
                raise _too_large(response, limit)
    finally:
        response.close()
    response._content = bytes(body)
    return response


async def _areceive(http: httpx.AsyncClient, effect: Send, limit: int) -> httpx.Response:
    """``_receive`` over an ``httpx.AsyncClient``."""
    request = http.build_request(effect.method, effect.path, json=effect.json, params=effect.params)
    response = await http.send(request, stream=True)
    try:
        if _declared_too_large(response, limit):
            raise _too_large(response, limit)
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > limit:
                raise _too_large(response, limit)
    finally:
        await response.aclose()
    response._content = bytes(body)
    return response


@dataclass(frozen=True)
class Pause:
    """Effect: the client's wait before repeating a call."""

    seconds: float


class RegisterFields(TypedDict):
    """What ``register`` takes (``EffectgateClient.register`` says what each means)."""

    run: Required[str]
    tool: Required[str]
    operation_key: Required[str]
    arguments: Required[dict[str, Any]]
    call_id: NotRequired[str | None]
    turn: NotRequired[int | None]
    approval: NotRequired[dict[str, Any] | None]
    claim_lease_s: NotRequired[int | None]


class BatchRegistration(TypedDict):
    """One item of ``register_many``: what ``register`` takes; ``run`` may be left out
    (it is the batch's)."""

    tool: Required[str]
    operation_key: Required[str]
    arguments: Required[dict[str, Any]]
    run: NotRequired[str]
    call_id: NotRequired[str | None]
    turn: NotRequired[int | None]
    approval: NotRequired[dict[str, Any] | None]
    claim_lease_s: NotRequired[int | None]


class OutcomeItem(OutcomeBody):
    """One item of ``post_outcomes``: an attempt's outcome with the ``operation`` and
    ``attempt`` it is for."""

    operation: str
    attempt: int


@dataclass(frozen=True)
class BatchItem(Generic[A]):
    """One item's answer in a batch, in the request's order: its HTTP ``status`` and
    either the ``operation`` (what the single call answers) or the ``error`` (the typed
    ``ProblemError`` the single call raises for that problem, with the batch request's
    ``request_id``; or, for the items left when a request was refused or not answered
    after others of the batch were, what that request raised: ``status`` 0 when no
    answer came)."""

    status: int
    operation: A | None = None
    error: EffectgateError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> A:
        """The operation, or raise the item's error (as the single call would)."""
        if self.error is not None:
            raise self.error
        assert self.operation is not None
        return self.operation


def _batch_size_check(items: Sequence[Any]) -> None:
    if not 1 <= len(items) <= BATCH_MAX_ITEMS:
        raise ValueError(f"a batch holds 1 to {BATCH_MAX_ITEMS} items, not {len(items)}")


def _encoded_size(body: Any) -> int:
    """The size of ``body`` as JSON, no smaller than what ``httpx`` sends; ``TypeError``
    or ``ValueError`` for what ``httpx`` would refuse to encode (an object, NaN)."""
    return len(json.dumps(body, allow_nan=False).encode())


def _chunks(bodies: Sequence[Any], limit: int) -> list[list[int]]:
    """The indexes of ``bodies`` in groups of at most ``BATCH_MAX_ITEMS`` whose JSON
    array is at most ``limit`` bytes, in order; a body larger than ``limit`` alone is a
    group of its own."""
    groups: list[list[int]] = []
    size = 0
    for index, body in enumerate(bodies):
        item = _encoded_size(body) + 2  # the separator (and the brackets, once)
        if not groups or len(groups[-1]) >= BATCH_MAX_ITEMS or size + item > limit:
            groups.append([])
            size = 2
        groups[-1].append(index)
        size += item
    return groups


def _register_many_bodies(
    run_id: str, registrations: Sequence[BatchRegistration | Mapping[str, Any]]
) -> list[dict[str, Any]]:
    _batch_size_check(registrations)
    bodies = []
    for item in registrations:
        if item.get("run", run_id) != run_id:
            raise ValueError(f"every registration of the batch must be of run {run_id}")
        fields: RegisterFields = {**item, "run": run_id}  # type: ignore[typeddict-item]
        bodies.append(_register_body(fields))
    return bodies


def _outcome_bodies(outcomes: Sequence[OutcomeItem | Mapping[str, Any]]) -> list[dict[str, Any]]:
    _batch_size_check(outcomes)
    bodies = []
    for item in outcomes:
        if not item.get("operation") or not isinstance(item.get("attempt"), int):
            raise ValueError("every outcome of the batch needs its operation and attempt")
        bodies.append(dict(item))
    return bodies


def _run_body(
    principal: str, external_id: str | None, budgets: Budgets | dict[str, Any] | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"principal": principal}
    if external_id is not None:
        body["external_id"] = external_id
    if budgets:
        body["budgets"] = budgets
    return body


def _register_body(fields: RegisterFields) -> dict[str, Any]:
    if not fields.get("operation_key"):
        raise ValueError("operation_key is required: make it before the first attempt")
    body: dict[str, Any] = {
        "run": fields["run"],
        "tool": fields["tool"],
        "operation_key": fields["operation_key"],
        "arguments": fields["arguments"],
    }
    if fields.get("call_id"):
        body["call_id"] = fields["call_id"]
    if fields.get("turn") is not None:
        body["turn"] = fields["turn"]
    if fields.get("approval") is not None:
        body["approval"] = fields["approval"]
    if fields.get("claim_lease_s") is not None:
        body["claim"] = {"lease_s": fields["claim_lease_s"]}
    return body


def _list_params(
    status: str | None, run: str | None, tool: str | None, limit: int
) -> dict[str, Any]:
    values = {"status": status, "run": run, "tool": tool, "limit": limit}
    return {key: value for key, value in values.items() if value is not None}


def _next_page(page: dict[str, Any]) -> str | None:
    """The path of the next page, or None on the last one."""
    if not page.get("next"):
        return None
    # The cursor URL is absolute; keep only the part after the API prefix.
    return str(page["next"]).split(API_PREFIX, 1)[1]


def _evidence_body(result: str, evidence: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"result": result, **{k: v for k, v in extra.items() if v}}
    if evidence is not None:
        body["evidence"] = evidence
    return body
