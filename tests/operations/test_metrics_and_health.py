"""GET /healthz, /readyz and /metrics: what operators and their tools ask of a process."""

import re
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
import yaml
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.views import health
from operations import services
from operations.models import Tool
from tests.conftest import contract

pytestmark = pytest.mark.django_db
RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "effectgate-rules.yml"
TOKEN = "metrics-token-for-tests"


@pytest.fixture
def scraper(settings):
    settings.METRICS_TOKEN = TOKEN
    client = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    return client


def _samples(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def test_healthz_answers_without_the_database(monkeypatch):
    def broken(*args, **kwargs):
        raise AssertionError("healthz must not touch the database")

    monkeypatch.setattr(connection, "cursor", broken)
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_ok_with_a_migrated_database_and_no_broker_in_local_mode():
    response = Client().get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "broker": "ok"}}


def test_readyz_names_an_unreachable_broker(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    response = Client().get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["broker"]
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["broker"].startswith("unreachable")


def test_readyz_names_a_database_not_migrated(monkeypatch):
    monkeypatch.setattr(health, "_migrated", False)
    monkeypatch.setattr(
        health.MigrationExecutor, "migration_plan", lambda self, targets: [("x", False)]
    )
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["database"]
    assert "1 migration(s) not applied" in response.json()["checks"]["database"]


def test_readyz_names_an_unreachable_database(monkeypatch):
    def unreachable(*args, **kwargs):
        raise health.connections["default"].Database.OperationalError("connection refused")

    monkeypatch.setattr(health.connections["default"], "cursor", unreachable)
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["failing"] == ["database"]


def test_metrics_need_the_token_or_an_allowed_address(settings):
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOWED_NETWORKS = []
    assert Client().get("/metrics").status_code == 403
    assert Client(HTTP_AUTHORIZATION="Bearer wrong").get("/metrics").status_code == 403
    assert Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}").get("/metrics").status_code == 200
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics").status_code == 403
    from ipaddress import ip_network

    settings.METRICS_ALLOWED_NETWORKS = [ip_network("127.0.0.0/8")]
    assert Client().get("/metrics").status_code == 200  # the test client is 127.0.0.1
    assert Client(REMOTE_ADDR="10.1.2.3").get("/metrics").status_code == 403


def test_the_ledger_gauges_say_what_waits_for_people(api, scraper, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    api.post("/api/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/h", "events": ["*"]})
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    api.tool("lookup", contract("irreversible"))
    run = api.run()
    api.register(run, "refund")
    unknown = api.register(run, "lookup", claim={"lease_s": 30})
    api.outcome(unknown["id"], 1, {"kind": "unknown", "code": "timeout"})
    Tool.objects.filter(pk="lookup").update(breaker_state="open")
    with time_machine.travel(timezone.now() + timedelta(minutes=20)):
        text = scraper.get("/metrics").content.decode()
    found = _samples(text)
    assert found['effectgate_operations{status="awaiting_approval",tool="refund"}'] == 1
    assert found['effectgate_operations{status="outcome_unknown",tool="lookup"}'] == 1
    assert found['effectgate_approvals_pending{tool="refund"}'] == 1
    assert found["effectgate_outcome_unknown_oldest_seconds"] >= 20 * 60
    assert found["effectgate_approvals_pending_oldest_seconds"] >= 20 * 60
    assert found["effectgate_webhook_backlog"] >= 3
    assert found["effectgate_webhook_oldest_seconds"] >= 20 * 60
    assert found['effectgate_breaker_open{tool="lookup"}'] == 1
    assert found['effectgate_breaker_open{tool="refund"}'] == 0
    assert found["effectgate_operations_capped"] == 0


def test_requests_and_sweeps_are_timed(api, scraper):
    api.tool("refund", contract("idempotent"))
    api.register(api.run(), "refund")
    services.sweep()
    found = _samples(scraper.get("/metrics").content.decode())
    labels = 'method="POST",route="/api/v1/operations",status="201"'
    assert found[f"effectgate_http_request_duration_seconds_count{{{labels}}}"] >= 1
    assert found['effectgate_sweep_duration_seconds_count{kind="lease_expiry"}'] >= 1
    assert found['effectgate_sweep_duration_seconds_count{kind="approval_escalation"}'] >= 1
    # A raw path never becomes a label: one route for every operation id.
    assert not any("op_" in name for name in found if name.startswith("effectgate_http"))


def test_a_scrape_reads_the_ledger_in_a_few_bounded_statements(api, scraper):
    api.tool("refund", contract("idempotent"))
    for _ in range(5):
        api.register(api.run(), "refund")
    with CaptureQueriesContext(connection) as queries:
        assert scraper.get("/metrics").status_code == 200
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) <= 8, statements
    for sql in statements:
        counts_operations = "count(" in sql.lower() and "operations_operation" in sql
        if counts_operations and "approvals_approvalrequest" not in sql:
            # Counting only what is open, and at most a capped number of rows.
            assert "LIMIT" in sql.upper(), sql


def test_every_alert_rule_reads_metrics_the_process_exports(scraper):
    rules = yaml.safe_load(RULES.read_text())
    exported = set(re.findall(r"^# TYPE (\w+) ", scraper.get("/metrics").content.decode(), re.M))
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert {rule["alert"] for rule in alerts} >= {
        "EffectgateUnknownOutcomesAging",
        "EffectgateWebhookBacklogGrowing",
        "EffectgateBreakerOpen",
    }
    for rule in alerts:
        names = set(re.findall(r"\b(effectgate_\w+)", rule["expr"]))
        assert names <= exported, (rule["alert"], names - exported)
