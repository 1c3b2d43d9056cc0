"""Automatic reconciliation probes: ask the runner's lookup URL what happened.

A contract with ``reconcile: {"mode": "lookup", "url": ...}`` names a URL template on
the runner's side (``{idempotency_key}``, ``{operation_id}``). Due work lives in the
database: ``next_probe_at`` on each ``outcome_unknown`` operation. ``probe_due``

1. selects operations whose probe is due,
2. claims each by compare-and-set, moving ``next_probe_at`` one lease ahead, so that
   several workers never probe the same operation at once and a worker that dies
   mid-probe leaves it to be probed again when the lease passes,
3. calls the URL outside any transaction, through the egress guard
   (``RECONCILE_ALLOWED_HOSTS``), with a timeout and without following redirects,
4. records the answer through the services: a definitive answer resolves the
   operation, anything else is a failed probe that resolves nothing.

Whatever goes wrong with one operation (a template that cannot be filled, a URL httpx
refuses, a bug in parsing) is that operation's failed probe, logged, and the batch goes
on: one bad contract must not stop every other tool's reconciliation.
"""

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.utils import timezone

from .. import contracts, errors, services
from ..hosts import lookup_policy
from ..machine import Status
from ..metrics import PROBE_FAILURES, timed_sweep
from ..models import Operation
from ..strictjson import loads_strict
from .egress import guarded_client

logger = logging.getLogger(__name__)

PROBE_LEASE = timedelta(minutes=2)
MAX_ANSWER_BYTES = 64 * 1024
RESULTS = {"committed", "not_found", "still_unknown"}


@dataclass(frozen=True)
class Answer:
    result: str | None  # None: the probe failed
    downstream_id: str = ""
    evidence: dict[str, Any] | None = None
    error: str = ""


def lookup_url(template: str, op: Operation) -> str:
    """``contracts.lookup_url`` for ``op``: a template that is no longer accepted raises
    ValueError, a failed probe."""
    return contracts.lookup_url(template, idempotency_key=op.idempotency_key, operation_id=op.id)


def _parse(response: httpx.Response, body: bytes) -> Answer:
    if response.status_code != 200:
        return Answer(None, error=f"HTTP {response.status_code}")
    # The runner's lookup answers with what becomes evidence on the ledger: parsed as
    # strictly as a request body, so that U+0000 or a lone surrogate (which no column
    # or hash takes), NaN, duplicate keys or 1e300 are a failed probe, not a crash.
    try:
        document = loads_strict(body)
    except (errors.MalformedJSON, errors.NumberOutOfRange) as exc:
        return Answer(None, error=f"the answer is not JSON Effectgate accepts: {exc.detail}")
    if not isinstance(document, dict) or document.get("result") not in RESULTS:
        return Answer(
            None, error='the answer has no "result" of committed, not_found, still_unknown'
        )
    downstream_id = document.get("downstream_id") or ""
    evidence = document.get("evidence") or {}
    if not isinstance(downstream_id, str) or not isinstance(evidence, dict):
        return Answer(None, error="downstream_id must be a string and evidence an object")
    return Answer(document["result"], downstream_id=downstream_id[:255], evidence=evidence)


def lookup(op: Operation, client: httpx.Client) -> Answer:
    url = lookup_url(op.tool_version.contract["reconcile"]["url"], op)
    try:
        with client.stream("GET", url, headers={"Accept": "application/json"}) as response:
            body = b""
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > MAX_ANSWER_BYTES:
                    return Answer(None, error="the answer is larger than 64 KiB")
            return _parse(response, body)
    except httpx.TimeoutException:
        return Answer(None, error="the lookup timed out")
    except httpx.HTTPError as exc:
        return Answer(None, error=f"the lookup failed: {exc}")


def _probe(op: Operation, client: httpx.Client) -> Answer:
    """``lookup``, with any unexpected error turned into a failed answer."""
    try:
        return lookup(op, client)
    except Exception as exc:
        logger.exception("The lookup for %s raised; recorded as a failed probe.", op.pk)
        reason = f"{type(exc).__name__}: {exc}"[:300]
        return Answer(None, error=f"the lookup could not be made: {reason}")


@dataclass
class ProbeReport:
    probed: int = 0
    resolved: int = 0
    failed: int = 0


def _claim(op_id: str, due_at: datetime | None, now: datetime) -> bool:
    return bool(
        Operation.objects.filter(
            pk=op_id, status=Status.OUTCOME_UNKNOWN, next_probe_at=due_at
        ).update(next_probe_at=now + PROBE_LEASE)
    )


@timed_sweep("probes")
def probe_due(*, now: datetime | None = None, limit: int = 50) -> ProbeReport:
    now = now or timezone.now()
    report = ProbeReport()
    due = list(
        Operation.objects.filter(
            status=Status.OUTCOME_UNKNOWN,
            next_probe_at__lte=now,
            tool_version__contract__reconcile__mode="lookup",
        )
        .order_by("next_probe_at")
        .values_list("pk", "next_probe_at")[:limit]
    )
    if not due:
        return report
    actor = services.Actor.system("probe")
    with guarded_client(lookup_policy(), timeout=settings.RECONCILE_PROBE_TIMEOUT_S) as client:
        for op_id, due_at in due:
            if not _claim(op_id, due_at, now):
                continue  # another worker took it
            op = Operation.objects.select_related("tool_version").get(pk=op_id)
            answer = _probe(op, client)
            report.probed += 1
            try:
                _record(op, answer, actor=actor, report=report)
            except Exception:
                # The claim's lease brings the operation back once it has passed.
                logger.exception("Recording the probe of %s failed; probed again later.", op.pk)
    return report


def _record(op: Operation, answer: Answer, *, actor: Any, report: ProbeReport) -> None:
    if answer.result is None:
        services.operation_probe_failed(operation=op, error=answer.error, actor=actor)
        PROBE_FAILURES.labels(tool=op.tool_id).inc()
        report.failed += 1
        return
    try:
        services.operation_reconcile(
            operation=op,
            result=answer.result,
            actor=actor,
            downstream_id=answer.downstream_id,
            evidence=answer.evidence,
            source="probe",
        )
    except errors.NotUnknown:
        return  # answered meanwhile by someone else
    report.resolved += answer.result != "still_unknown"
