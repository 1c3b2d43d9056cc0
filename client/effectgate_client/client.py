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
- ``create_run`` is the exception: a lost answer may leave an empty run behind. It
  holds no operation and costs nothing.

Protocol refusals (409, 403, 422...) are never repeated here: they are answers, raised
as the typed exceptions of ``effectgate_client.errors``.
"""

from __future__ import annotations

import logging
import random
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Literal
from urllib.parse import quote

import httpx

from .errors import (
    ContractNotActive,
    ContractNotActiveWarning,
    NotCompensating,
    NotUnknown,
    ProblemError,
    TransportError,
    inactive_contract_message,
    problem_from_response,
)

logger = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
# Answers after which repeating the same call is both safe (see above) and useful.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def _segment(value: str) -> str:
    return quote(str(value), safe="")


class EffectgateClient:
    """A thread-safe client for one runner token.

    ``max_retries`` bounds how often one call is repeated after a lost answer; waits
    between repeats follow capped exponential backoff with full jitter, or Effectgate's
    ``Retry-After`` when it sends one. ``sleep`` is injectable for tests.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        max_retries: int = 6,
        backoff_base_s: float = 0.05,
        backoff_max_s: float = 2.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        user_agent: str = "effectgate-client/0.1",
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.sleep = sleep
        # Counts of repeated calls by reason, for operators and benchmarks.
        self.stats: Counter[str] = Counter()
        self._http = httpx.Client(
            base_url=self.base_url + API_PREFIX,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": user_agent,
            },
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EffectgateClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- transport ----------------------------------------------------------------------

    def _backoff_s(self, retry: int) -> float:
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2**retry)
        return random.uniform(0, ceiling)  # noqa: S311 (jitter, not secrecy)

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
        retries = self.max_retries if max_retries is None else max_retries
        retry = 0
        while True:
            wait: float | None = None
            try:
                response = self._http.request(method, path, json=json, params=params)
            except httpx.TransportError as exc:
                if retry >= retries:
                    raise TransportError(
                        f"{method} {path}: no answer after {retry + 1} tries ({exc!r})",
                        method=method,
                        path=path,
                    ) from exc
                self.stats[f"lost:{type(exc).__name__}"] += 1
            else:
                if response.is_success:
                    return response.json() if response.content else None
                error = problem_from_response(response)
                if response.status_code not in RETRY_STATUSES or retry >= retries:
                    if isinstance(error, ProblemError):
                        # A refusal that answers a repeat may be caused by the first try
                        # having gone through (``not_unknown`` after a lost answer).
                        error.repeated = retry > 0
                    raise error
                self.stats[f"status:{response.status_code}"] += 1
                if isinstance(error, ProblemError) and error.retry_after_ms is not None:
                    wait = error.retry_after_ms / 1000
            logger.debug("repeating %s %s (try %d)", method, path, retry + 2)
            self.sleep(wait if wait is not None else self._backoff_s(retry))
            retry += 1

    # --- tools and runs -----------------------------------------------------------------

    def put_tool(
        self, name: str, contract: dict[str, Any], *, inactive: Literal["raise", "warn"] = "raise"
    ) -> dict[str, Any]:
        """Register a contract (``PUT /tools/{name}``) and return the answer.

        A version Effectgate stores but does not activate (``active: false``: it weakens
        the active one, ``weakens`` says how) raises ``ContractNotActive``, because the
        calls that follow would silently run under the old contract. ``inactive="warn"``
        warns with ``ContractNotActiveWarning`` and returns the answer instead.
        """
        if inactive not in ("raise", "warn"):
            raise ValueError(f"inactive must be 'raise' or 'warn', not {inactive!r}")
        answer = self.request("PUT", f"/tools/{_segment(name)}", json=contract)
        if answer.get("active") is False:
            if inactive == "raise":
                raise ContractNotActive(answer)
            warnings.warn(inactive_contract_message(answer), ContractNotActiveWarning, stacklevel=2)
        return answer

    def get_tool(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/tools/{_segment(name)}")

    def create_run(
        self,
        *,
        principal: str,
        external_id: str | None = None,
        budgets: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"principal": principal}
        if external_id is not None:
            body["external_id"] = external_id
        if budgets:
            body["budgets"] = budgets
        return self.request("POST", "/runs", json=body)

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"/runs/{_segment(run_id)}")

    def cancel_run(self, run_id: str) -> dict[str, Any]:
        return self.request("POST", f"/runs/{_segment(run_id)}/cancel")

    # --- operations -----------------------------------------------------------------------

    def register(
        self,
        *,
        run: str,
        tool: str,
        operation_key: str,
        arguments: dict[str, Any],
        call_id: str | None = None,
        turn: int | None = None,
        approval: dict[str, Any] | None = None,
        claim_lease_s: int | None = None,
    ) -> dict[str, Any]:
        """Register an intended effect, or get back the one registered under the key.

        With ``claim_lease_s`` the first attempt is claimed in the same round trip when
        the new operation is ``ready``: the body then carries ``attempt`` (or ``null``
        with ``claim_error``). A replay (status 200) never claims.
        """
        if not operation_key:
            raise ValueError("operation_key is required: make it before the first attempt")
        body: dict[str, Any] = {
            "run": run,
            "tool": tool,
            "operation_key": operation_key,
            "arguments": arguments,
        }
        if call_id:
            body["call_id"] = call_id
        if turn is not None:
            body["turn"] = turn
        if approval is not None:
            body["approval"] = approval
        if claim_lease_s is not None:
            body["claim"] = {"lease_s": claim_lease_s}
        return self.request("POST", "/operations", json=body)

    def get_operation(self, operation_id: str) -> dict[str, Any]:
        return self.request("GET", f"/operations/{_segment(operation_id)}")

    def list_operations(
        self,
        *,
        status: str | None = None,
        run: str | None = None,
        tool: str | None = None,
        limit: int = 200,
    ) -> Iterator[dict[str, Any]]:
        """Every matching operation, newest first, following the cursor."""
        params: dict[str, Any] | None = {
            key: value
            for key, value in {"status": status, "run": run, "tool": tool, "limit": limit}.items()
            if value is not None
        }
        path = "/operations"
        while True:
            page = self.request("GET", path, params=params)
            yield from page["results"]
            if not page.get("next"):
                return
            # The cursor URL is absolute; keep only the part after the API prefix.
            path = page["next"].split(API_PREFIX, 1)[1]
            params = None

    def events(self, operation_id: str) -> list[dict[str, Any]]:
        return self.request("GET", f"/operations/{_segment(operation_id)}/events")

    def tool_result(self, operation_id: str) -> dict[str, Any]:
        """The envelope to hand back to the model (status, code, message, next actions)."""
        return self.request("GET", f"/operations/{_segment(operation_id)}/tool-result")

    def get_approval(self, approval_id: str) -> dict[str, Any]:
        return self.request("GET", f"/approvals/{_segment(approval_id)}")

    # --- attempts -------------------------------------------------------------------------

    def claim(self, operation_id: str, *, lease_s: int = 30) -> dict[str, Any]:
        """Claim the next attempt; raises the claim refusal's typed exception."""
        return self.request(
            "POST", f"/operations/{_segment(operation_id)}/attempts", json={"lease_s": lease_s}
        )

    def heartbeat(
        self, operation_id: str, attempt: int, *, lease_s: int = 30, max_retries: int | None = None
    ) -> dict[str, Any]:
        return self.request(
            "POST",
            f"/operations/{_segment(operation_id)}/attempts/{int(attempt)}/heartbeat",
            json={"lease_s": lease_s},
            max_retries=max_retries,
        )

    def post_outcome(self, operation_id: str, attempt: int, outcome: dict[str, Any]) -> dict:
        """Post an attempt's outcome (``{"kind": "succeeded" | "failed" | "unknown",
        ...}``); the operation after classification. Repeating it is safe."""
        return self.request(
            "POST",
            f"/operations/{_segment(operation_id)}/attempts/{int(attempt)}/outcome",
            json=outcome,
        )

    # --- reconciliation and compensation -----------------------------------------------------

    def reconcile(
        self,
        operation_id: str,
        *,
        result: str,
        downstream_id: str | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Answer an ``outcome_unknown`` operation: committed, not_found or still_unknown.

        When the answer to a ``committed`` or ``not_found`` was lost and the repeat
        finds the operation no longer unknown (``not_unknown``), the first try went
        through: the operation as it is now is returned.
        """
        body: dict[str, Any] = {"result": result}
        if downstream_id:
            body["downstream_id"] = downstream_id
        if evidence is not None:
            body["evidence"] = evidence
        path = f"/operations/{_segment(operation_id)}/reconciliations"
        try:
            return self.request("POST", path, json=body)
        except NotUnknown as exc:
            if not exc.repeated or result == "still_unknown":
                raise
            return self.get_operation(operation_id)

    def compensate(
        self, operation_id: str, *, result: str, evidence: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Record the undo of a ``compensating`` operation (``committed`` or ``failed``)."""
        body: dict[str, Any] = {"result": result}
        if evidence is not None:
            body["evidence"] = evidence
        path = f"/operations/{_segment(operation_id)}/compensations"
        try:
            return self.request("POST", path, json=body)
        except NotCompensating as exc:
            if not exc.repeated or result != "committed":
                raise
            return self.get_operation(operation_id)
