"""What a tool call did, as the runner tells Effectgate (api.md, outcome bodies).

A tool function returns a value (or ``Succeeded``) when the effect happened, and raises
one of ``NotSent``, ``Failed`` or ``Unknown`` when it did not or when nobody knows. Any
other exception is posted as ``unknown``: a runner that cannot tell whether the request
left the process must not claim that it did not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

NOT_SENT = "not_sent"


@dataclass(frozen=True)
class Succeeded:
    """The effect happened. ``downstream_id`` is the provider's reference for it."""

    result: Any = None
    downstream_id: str | None = None
    cost: float | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "succeeded"}
        if self.result is not None:
            body["result"] = self.result
        if self.downstream_id:
            body["downstream_id"] = self.downstream_id
        if self.cost is not None:
            body["cost"] = self.cost
        return body


class ToolOutcome(Exception):
    """Raised by a tool function to say how an attempt ended without success."""

    kind = "failed"

    def __init__(
        self,
        code: str,
        detail: str = "",
        *,
        retry_after_ms: int | None = None,
        cost: float | None = None,
    ) -> None:
        super().__init__(f"{self.kind} {code}: {detail}".strip())
        self.code = code
        self.detail = detail
        self.retry_after_ms = retry_after_ms
        self.cost = cost

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": self.kind, "code": self.code}
        if self.detail:
            body["detail"] = self.detail[:4000]
        if self.retry_after_ms is not None:
            body["retry_after_ms"] = int(self.retry_after_ms)
        if self.cost is not None:
            body["cost"] = self.cost
        return body


class Failed(ToolOutcome):
    """The provider refused or failed the call. A code in the contract's
    ``retryable_codes`` (which must mean "not processed") leads to a retry with
    backoff; any other code ends the operation (``failed_permanent``)."""


class NotSent(Failed):
    """Nothing left the runner: retrying is safe whatever the effect class."""

    def __init__(self, detail: str = "", *, retry_after_ms: int | None = None) -> None:
        super().__init__(NOT_SENT, detail, retry_after_ms=retry_after_ms)


class Unknown(ToolOutcome):
    """The request may have reached the provider and nobody knows what it did
    (a timeout after sending, a connection lost before the answer)."""

    kind = "unknown"

    def __init__(self, code: str = "timeout_unknown", detail: str = "", **kwargs: Any) -> None:
        super().__init__(code, detail, **kwargs)


def _provider(exc: httpx.HTTPError) -> str:
    """Where the request went, as ``the provider at HOST[:PORT]``: never the path, the
    query or credentials, which may hold secrets."""
    try:
        host, port = exc.request.url.host, exc.request.url.port
    except RuntimeError:  # an error raised without its request
        host, port = "", None
    if not host:
        return "the provider"
    return f"the provider at {host}" + (f":{port}" if port else "")


def outcome_from_httpx_error(exc: httpx.HTTPError) -> ToolOutcome:
    """Classify an httpx failure of a call to the outside world, conservatively.

    Only a failure to connect proves that the request never left: the server cannot
    have seen a request on a connection that was never made. A timeout or a connection
    that breaks after the request was written may have been processed, so it is
    ``unknown``; so is anything else this function does not recognise.

    The detail, which Effectgate keeps and shows the model and people, says what
    happened in words: that the provider could not be reached, with its host and the
    error's class. It never quotes the URL's path or query, nor a refused header (a
    ``LocalProtocolError`` may quote one, a credential included).
    """
    name = type(exc).__name__
    provider = _provider(exc)
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        unreachable = f"{provider} could not be reached ({name}: {exc}); nothing was sent."
        return NotSent(unreachable[0].upper() + unreachable[1:])
    if isinstance(exc, httpx.PoolTimeout):
        return NotSent(f"No connection to {provider} was free in time ({name}); nothing was sent.")
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return NotSent(f"The request to {provider} could not be made ({name}: {exc}).")
    if isinstance(exc, httpx.LocalProtocolError):
        return NotSent(f"The request to {provider} could not be sent ({name}).")
    if isinstance(exc, httpx.TimeoutException):
        return Unknown("timeout_unknown", f"{name} after the request was sent to {provider}: {exc}")
    return Unknown("connection_lost", f"{name} after the request was sent to {provider}: {exc}")
