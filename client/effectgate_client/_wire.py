"""What goes over the wire for both clients: the transport's two effects (``Send`` a
request, ``Pause`` before a repeat), the reading of an answer with a cap on its body,
and the request bodies and paths the endpoints take. No state and no policy: which
answers are repeated, and when, is ``client._ClientCore``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NotRequired, Required, TypedDict
from urllib.parse import quote

import httpx

from .answers import Budgets
from .errors import UnexpectedResponse, request_id_of

API_PREFIX = "/api/v1"


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
