"""What operators and their tools ask of a running process: is it alive (``/healthz``),
may it take traffic (``/readyz``), and its metrics (``/metrics``, Prometheus text)."""

import os
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client import REGISTRY as PROCESS_REGISTRY
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from operations import access
from operations.selectors import metrics as ledger

# Set once the schema is found migrated: a process never goes back to an older schema.
_migrated = False


@require_GET
@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    """The process answers. Nothing else is checked: a load balancer restarting a
    process because the database is down would only make things worse."""
    return JsonResponse({"status": "ok"})


def _database() -> str | None:
    global _migrated
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        if not _migrated:
            executor = MigrationExecutor(connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
            if plan:
                return f"{len(plan)} migration(s) not applied: run manage.py migrate"
            _migrated = True
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}"
    return None


def _broker() -> str | None:
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return None  # background work runs in-process: no broker to reach
    from kombu import Connection

    try:
        # Redis reads its socket timeouts from transport_options, not connect_timeout.
        options = {"socket_connect_timeout": 2, "socket_timeout": 2}
        with Connection(
            settings.CELERY_BROKER_URL, connect_timeout=2, transport_options=options
        ) as broker:
            broker.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}"
    return None


@require_GET
@never_cache
def readyz(request: HttpRequest) -> HttpResponse:
    """May this process take traffic: the database answers and is migrated, and the
    broker answers when one is configured. 503 names the failing part."""
    checks = {"database": _database(), "broker": _broker()}
    failing = {name: problem for name, problem in checks.items() if problem}
    body: dict[str, Any] = {
        "status": "unavailable" if failing else "ok",
        "checks": {name: problem or "ok" for name, problem in checks.items()},
    }
    if failing:
        body["failing"] = sorted(failing)
    return JsonResponse(body, status=503 if failing else 200)


class _LedgerCollector:
    """The ledger's gauges, read when scraped."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = timezone.now()
        found = ledger.gauges(now=now)
        operations = GaugeMetricFamily(
            "effectgate_operations",
            "Operations not yet ended, by state and tool.",
            labels=["status", "tool"],
        )
        for (status, tool), count in sorted(found.operations.items()):
            operations.add_metric([status, tool], count)
        yield operations
        yield GaugeMetricFamily(
            "effectgate_operations_capped",
            "1 when more operations are open than one scrape counts (the counts are a floor).",
            value=int(found.operations_capped),
        )
        yield GaugeMetricFamily(
            "effectgate_outcome_unknown_oldest_seconds",
            "Age of the oldest unknown outcome (0 when none).",
            value=found.unknown_oldest_s,
        )
        pending = GaugeMetricFamily(
            "effectgate_approvals_pending",
            "Approval requests waiting for a decision, by tool.",
            labels=["tool"],
        )
        for tool, count in sorted(found.approvals_pending.items()):
            pending.add_metric([tool], count)
        yield pending
        yield GaugeMetricFamily(
            "effectgate_approvals_pending_oldest_seconds",
            "Age of the oldest approval request still pending (0 when none).",
            value=found.approvals_oldest_s,
        )
        yield GaugeMetricFamily(
            "effectgate_webhook_backlog",
            "Webhook messages not delivered yet.",
            value=found.webhook_backlog,
        )
        yield GaugeMetricFamily(
            "effectgate_webhook_oldest_seconds",
            "Age of the oldest webhook message not delivered yet (0 when none).",
            value=found.webhook_oldest_s,
        )
        breaker = GaugeMetricFamily(
            "effectgate_breaker_open",
            "1 while a tool's circuit breaker is open or half-open.",
            labels=["tool"],
        )
        for tool, is_open in sorted(found.breaker_open.items()):
            breaker.add_metric([tool], is_open)
        yield breaker


@require_GET
@never_cache
def metrics(request: HttpRequest) -> HttpResponse:
    if not access.may_scrape_metrics(
        authorization=request.headers.get("Authorization", ""),
        address=request.META.get("REMOTE_ADDR", ""),
    ):
        return HttpResponse(
            "Metrics need a metrics token or an allowed address.\n",
            status=403,
            content_type="text/plain",
        )
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        counted = CollectorRegistry()
        MultiProcessCollector(counted)
    else:
        counted = PROCESS_REGISTRY
    scraped = CollectorRegistry()
    scraped.register(_LedgerCollector())
    body = generate_latest(counted) + generate_latest(scraped)
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
