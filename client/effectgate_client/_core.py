"""What both clients share (``client.EffectgateClient``, ``client.AsyncEffectgateClient``):
their settings, and each call as a plan (``_plan``) of the requests it sends and the
repeat rules of ``client``'s docstring; the two clients only perform the plans, blocking
or awaited."""

from __future__ import annotations

import logging
import random
import warnings
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, TypeVar

import httpx

from ._plan import Plan
from ._version import __version__
from ._wire import (
    API_PREFIX,
    BatchItem,
    BatchRegistration,
    OutcomeItem,
    Pause,
    RegisterFields,
    Send,
    _chunks,
    _evidence_body,
    _outcome_bodies,
    _register_body,
    _register_many_bodies,
    _segment,
)
from .answers import (
    Attempt,
    Heartbeat,
    Operation,
    OutcomeAnswer,
    OutcomeBody,
    RegisteredOperation,
    Tool,
    ToolResult,
)
from .errors import (
    ContractNotActive,
    ContractNotActiveWarning,
    EffectgateError,
    NotCompensating,
    NotUnknown,
    PayloadTooLarge,
    ProblemError,
    TransportError,
    UnexpectedResponse,
    inactive_contract_message,
    own_copy,
    problem_from_body,
    problem_from_response,
    request_id_of,
)

logger = logging.getLogger(__name__)

# Answers after which repeating the same call is both safe (see above) and useful.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# The largest answer body read (Effectgate's are far smaller); beyond it the answer is
# dropped unread and the call raises ``UnexpectedResponse``.
MAX_RESPONSE_BYTES = 8 * 1024 * 1024
# The longest one wait before a repeat may last, whatever ``Retry-After`` asks.
MAX_RETRY_WAIT_S = 60.0
# The largest encoded body of one batch request: a batch is split into requests below
# it, comfortably under Effectgate's ``MAX_REQUEST_BYTES`` (1 MiB by default, 413 above).
MAX_BATCH_BYTES = 512 * 1024

T = TypeVar("T")


class ClientSettings(TypedDict, total=False):
    """The settings both clients take (defaults in ``_ClientCore``): the timeout of a
    request, how often one call is repeated after a lost answer, the backoff between
    repeats, the User-Agent, the largest answer read, the longest wait a
    ``Retry-After`` (or ``retry_after_ms``) may ask for, the largest batch request."""

    timeout: float
    max_retries: int
    backoff_base_s: float
    backoff_max_s: float
    user_agent: str
    max_response_bytes: int
    max_retry_wait_s: float
    max_batch_bytes: int


@dataclass(frozen=True)
class _Answer:
    """A success's JSON ``body``, its ``request_id`` and whether it answers a repeat."""

    body: Any
    request_id: str | None
    repeated: bool


def _batch_item(path: str, result: Any, request_id: str | None) -> BatchItem[Any]:
    """One item of a batch's answer, checked: an object with an integer ``status`` and
    either an ``operation`` (an object with an ``id``; the only answer of a 2xx) or a
    ``problem`` (an object); anything else raises ``UnexpectedResponse``."""
    status = result.get("status") if isinstance(result, dict) else None
    if isinstance(result, dict) and isinstance(status, int) and not isinstance(status, bool):
        operation, problem = result.get("operation"), result.get("problem")
        if (
            200 <= status < 300
            and "problem" not in result
            and isinstance(operation, dict)
            and "id" in operation
        ):
            return BatchItem(status, operation=operation)
        if not 200 <= status < 300 and "operation" not in result and isinstance(problem, dict):
            return BatchItem(
                status, error=problem_from_body(problem, status=status, request_id=request_id)
            )
    raise UnexpectedResponse(
        200,
        f"POST {path}: an item of the answer is unreadable: {result!r:.200}",
        request_id=request_id,
    )


def _failed_item(exc: EffectgateError, *, sent_before: bool | None) -> BatchItem[Any]:
    """The item of a request that was refused as a whole, or got no answer: a copy of
    the failure of its own, and the refusal's HTTP status (0 without one, or when the
    answer was a 2xx that could not be read). Its ``repeated``, as for an item's own
    refusal, says whether the item had been sent before: ``sent_before``, or None for
    what the failed request's own repeats say."""
    status = exc.status if isinstance(exc, ProblemError | UnexpectedResponse) else 0
    copy = own_copy(exc)
    if isinstance(copy, ProblemError) and sent_before is not None:
        copy.repeated = sent_before
    return BatchItem(status if status >= 300 else 0, error=copy)


class _ClientCore:
    """What both clients share: settings, the repeat policy and every call's plan."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        max_retries: int = 6,
        backoff_base_s: float = 0.05,
        backoff_max_s: float = 2.0,
        user_agent: str = f"effectgate-client/{__version__}",
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_retry_wait_s: float = MAX_RETRY_WAIT_S,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # What ``AsyncEffectgateClient.like`` needs to make a client with these settings.
        self._settings: dict[str, Any] = {
            "token": token,
            "timeout": timeout,
            "max_retries": max_retries,
            "backoff_base_s": backoff_base_s,
            "backoff_max_s": backoff_max_s,
            "user_agent": user_agent,
            "max_response_bytes": max_response_bytes,
            "max_retry_wait_s": max_retry_wait_s,
            "max_batch_bytes": max_batch_bytes,
        }
        self.max_batch_bytes = max_batch_bytes
        self.max_response_bytes = max_response_bytes
        self.max_retry_wait_s = max_retry_wait_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        # Counts of repeated calls by reason, for operators and benchmarks.
        self.stats: Counter[str] = Counter()
        self._http_options: dict[str, Any] = {
            "base_url": self.base_url + API_PREFIX,
            "headers": {
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": user_agent,
            },
            "timeout": timeout,
            "follow_redirects": False,
        }

    def _backoff_s(self, retry: int) -> float:
        ceiling = min(self.backoff_max_s, self.backoff_base_s * 2**retry)
        return random.uniform(0, ceiling)  # noqa: S311 (jitter, not secrecy)

    def _request_plan(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        max_retries: int | None = None,
    ) -> Plan[Any]:
        """One API call, repeated while the answer is lost; the JSON body of a success.

        Raises the typed ``ProblemError`` for a problem answer, ``TransportError`` when
        Effectgate stayed unreachable, ``UnexpectedResponse`` for anything else.
        """
        answer = yield from self._answer_plan(
            method, path, json=json, params=params, max_retries=max_retries
        )
        return answer.body

    def _answer_plan(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        max_retries: int | None = None,
    ) -> Plan[_Answer]:
        """``_request_plan`` with the answer's request id and whether it answers a
        repeat."""
        retries = self.max_retries if max_retries is None else max_retries
        retry = 0
        while True:
            wait: float | None = None
            try:
                response = yield Send(method, path, json, params)
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
                    try:
                        body = response.json() if response.content else None
                    except ValueError:  # not JSON (a proxy's page): no answer of Effectgate
                        raise UnexpectedResponse(
                            response.status_code,
                            f"{method} {path}: the answer is not JSON: {response.text[:200]}",
                            request_id=request_id_of(response),
                        ) from None
                    return _Answer(body, request_id_of(response), retry > 0)
                error = problem_from_response(response)
                if response.status_code not in RETRY_STATUSES or retry >= retries:
                    if isinstance(error, ProblemError):
                        # A refusal that answers a repeat may be caused by the first try
                        # having gone through (``not_unknown`` after a lost answer).
                        error.repeated = retry > 0
                    raise error
                self.stats[f"status:{response.status_code}"] += 1
                if isinstance(error, ProblemError) and error.retry_after_ms is not None:
                    # Bounded: an answer cannot park the caller for hours.
                    wait = min(error.retry_after_ms / 1000, self.max_retry_wait_s)
            logger.debug("repeating %s %s (try %d)", method, path, retry + 2)
            yield Pause(wait if wait is not None else self._backoff_s(retry))
            retry += 1

    # --- plans of the calls that do more than one request ----------------------------------

    def _put_tool_plan(
        self, name: str, contract: dict[str, Any], inactive: Literal["raise", "warn"]
    ) -> Plan[Tool]:
        if inactive not in ("raise", "warn"):
            raise ValueError(f"inactive must be 'raise' or 'warn', not {inactive!r}")
        answer = yield from self._request_plan("PUT", f"/tools/{_segment(name)}", json=contract)
        if answer.get("active") is False:
            if inactive == "raise":
                raise ContractNotActive(answer)
            warnings.warn(inactive_contract_message(answer), ContractNotActiveWarning, stacklevel=6)
        return answer

    def _get_operation_plan(self, operation_id: str) -> Plan[Operation]:
        return (yield from self._request_plan("GET", f"/operations/{_segment(operation_id)}"))

    def _register_plan(self, fields: RegisterFields) -> Plan[RegisteredOperation]:
        body = _register_body(fields)
        return (yield from self._request_plan("POST", "/operations", json=body))

    def _batch_plan(self, path: str, bodies: list[dict[str, Any]]) -> Plan[list[BatchItem[Any]]]:
        """The items of a batch in requests of at most ``max_batch_bytes`` (encoded) and
        50 items; a request Effectgate refuses as too large (413) is sent again item by
        item, and an item too large alone is answered ``PayloadTooLarge``. The items in
        order. A refusal or failure raises while no item of the batch has been answered
        (whatever the answer: an operation, or a problem of its own). After that, the
        first request that is refused as a whole or gets no answer (also a repeat of
        items answered 429 or 5xx) ends the batch: its unanswered items and those not
        sent yet carry what it raised as their error (each a copy of its own; ``status``
        that of the refusal, else 0), and every item answered before is kept."""
        items: list[BatchItem[Any] | None] = [None] * len(bodies)
        groups = deque(_chunks(bodies, self.max_batch_bytes))
        answered_any = False
        while groups:
            group = groups.popleft()
            failure: EffectgateError | None = None
            try:
                answered, failure = yield from self._batch_request_plan(
                    path, [bodies[i] for i in group]
                )
            except PayloadTooLarge as exc:
                if len(group) > 1:
                    self.stats["batch_split_413"] += 1
                    groups.extendleft([i] for i in reversed(group))
                    continue
                answered = [BatchItem(exc.status, error=exc)]
            except EffectgateError as exc:
                if not answered_any:
                    raise
                answered = [_failed_item(exc, sent_before=None) for _ in group]
                failure = exc
            answered_any = True
            for index, item in zip(group, answered, strict=True):
                items[index] = item
            if failure is not None:
                # Effectgate is unreachable, or refuses the token or its rate: the
                # requests left would meet the same, and a 429 would count them too.
                self.stats["batch_requests_failed"] += 1
                for index in [i for rest in groups for i in rest]:
                    items[index] = _failed_item(failure, sent_before=False)
                break
        return [item for item in items if item is not None]

    def _batch_request_plan(
        self, path: str, bodies: list[dict[str, Any]]
    ) -> Plan[tuple[list[BatchItem[Any]], EffectgateError | None]]:
        """One batch request (repeated while its answer is lost), then its items answered
        429 or 5xx alone, as often as a single call is repeated: the items in order, and
        the failure that ended it early. A failure of the first request raises; one of a
        repeat of some items is the error of those items (the items answered before
        are kept), and is returned as the failure."""
        items: list[BatchItem[Any] | None] = [None] * len(bodies)
        todo = list(range(len(bodies)))
        retry = 0
        failure: EffectgateError | None = None
        while True:
            try:
                again = yield from self._batch_answer_plan(path, bodies, todo, items, retry)
            except EffectgateError as exc:
                if retry == 0:
                    raise
                for index in todo:
                    items[index] = _failed_item(exc, sent_before=True)
                again, failure = [], exc
            if not again:
                return [item for item in items if item is not None], failure
            self.stats["batch_items_repeated"] += len(again)
            yield Pause(self._backoff_s(retry))
            todo, retry = again, retry + 1

    def _batch_answer_plan(
        self,
        path: str,
        bodies: list[dict[str, Any]],
        todo: list[int],
        items: list[BatchItem[Any] | None],
        retry: int,
    ) -> Plan[list[int]]:
        """Send the items ``todo`` of ``bodies`` in one request, put their answers in
        ``items``; the indexes of those to repeat (429, 5xx) while repeats are left."""
        answer = yield from self._answer_plan("POST", path, json=[bodies[i] for i in todo])
        results = answer.body.get("results") if isinstance(answer.body, dict) else None
        if not isinstance(results, list) or len(results) != len(todo):
            raise UnexpectedResponse(
                200,
                f"POST {path}: not an answer of {len(todo)} items",
                request_id=answer.request_id,
            )
        answered = [_batch_item(path, result, answer.request_id) for result in results]
        again: list[int] = []
        for index, item in zip(todo, answered, strict=True):
            if isinstance(item.error, ProblemError):
                # Repeated if this item, or the whole batch, was sent before.
                item.error.repeated = retry > 0 or answer.repeated
                if item.status in RETRY_STATUSES and retry < self.max_retries:
                    again.append(index)
            items[index] = item
        return again

    def _register_many_plan(
        self, run_id: str, registrations: Sequence[BatchRegistration | Mapping[str, Any]]
    ) -> Plan[list[BatchItem[RegisteredOperation]]]:
        bodies = _register_many_bodies(run_id, registrations)
        return (yield from self._batch_plan("/operations", bodies))

    def _post_outcomes_plan(
        self, run_id: str, outcomes: Sequence[OutcomeItem | Mapping[str, Any]]
    ) -> Plan[list[BatchItem[OutcomeAnswer]]]:
        path = f"/runs/{_segment(run_id)}/outcomes"
        return (yield from self._batch_plan(path, _outcome_bodies(outcomes)))

    def _claim_plan(self, operation_id: str, lease_s: int) -> Plan[Attempt]:
        path = f"/operations/{_segment(operation_id)}/attempts"
        return (yield from self._request_plan("POST", path, json={"lease_s": lease_s}))

    def _heartbeat_plan(
        self, operation_id: str, attempt: int, lease_s: int, max_retries: int | None
    ) -> Plan[Heartbeat]:
        path = f"/operations/{_segment(operation_id)}/attempts/{int(attempt)}/heartbeat"
        return (
            yield from self._request_plan(
                "POST", path, json={"lease_s": lease_s}, max_retries=max_retries
            )
        )

    def _post_outcome_plan(
        self, operation_id: str, attempt: int, outcome: OutcomeBody | dict[str, Any]
    ) -> Plan[OutcomeAnswer]:
        path = f"/operations/{_segment(operation_id)}/attempts/{int(attempt)}/outcome"
        return (yield from self._request_plan("POST", path, json=outcome))

    def _tool_result_plan(self, operation_id: str) -> Plan[ToolResult]:
        path = f"/operations/{_segment(operation_id)}/tool-result"
        return (yield from self._request_plan("GET", path))

    def _reconcile_plan(
        self,
        operation_id: str,
        result: str,
        downstream_id: str | None,
        evidence: dict[str, Any] | None,
    ) -> Plan[Operation]:
        body = _evidence_body(result, evidence, downstream_id=downstream_id)
        path = f"/operations/{_segment(operation_id)}/reconciliations"
        try:
            return (yield from self._request_plan("POST", path, json=body))
        except NotUnknown as exc:
            if not exc.repeated or result == "still_unknown":
                raise
            return (yield from self._get_operation_plan(operation_id))

    def _compensate_plan(
        self, operation_id: str, result: str, evidence: dict[str, Any] | None
    ) -> Plan[Operation]:
        body = _evidence_body(result, evidence)
        path = f"/operations/{_segment(operation_id)}/compensations"
        try:
            return (yield from self._request_plan("POST", path, json=body))
        except NotCompensating as exc:
            if not exc.repeated or result != "committed":
                raise
            return (yield from self._get_operation_plan(operation_id))
