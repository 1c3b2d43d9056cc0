"""The lean hot path (issue 14): register+claim and outcome in their essential statements,
answered from what the transaction wrote, with nothing lost on the way.

The statement counts hold on PostgreSQL, where the attempt and the events of a
registration go in one statement (SQLite takes one per table); they count what reaches
the database, ``BEGIN`` and ``COMMIT`` included, as the bench does.
"""

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from operations import payloads
from operations.audit.chains import chains_verify
from operations.models import Attempt, Event, Operation, OutboxMessage, Run, Runner
from operations.serializers import AttemptOut, OperationOut
from tests.conftest import make_runner

POSTGRES = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def _claimed(api, run: str, **extra):
    body = api.register(run, "t", claim={"lease_s": 30}, **extra)
    assert body["status"] == "executing", body
    return body


def _without(body: dict, *keys: str) -> dict:
    # allowed_next_actions depends on the clock and updated_at on the write, both the
    # same here; nothing else may differ between the answer and a later read.
    return {key: value for key, value in body.items() if key not in keys}


def test_the_answers_are_what_a_later_read_returns(api):
    api.tool("t")
    run = api.run()
    registered = _claimed(api, run)
    assert registered["attempt"]["attempt"] == 1
    assert registered["attempt"]["idempotency_key"] == registered["idempotency_key"]
    assert _without(registered, "attempt") == api.operation(registered["id"])
    done = api.outcome(registered["id"], 1, {"kind": "succeeded", "downstream_id": "re_1"})
    assert done == api.operation(registered["id"])
    assert done["status"] == "succeeded"
    assert done["approval"] is None


def test_the_chain_head_lives_on_the_operation_and_every_chain_verifies(api):
    api.tool("t")
    run = api.run()
    op = _claimed(api, run)
    api.outcome(op["id"], 1, {"kind": "failed", "code": "provider_unavailable"})
    api.claim(op["id"], expect=409)  # retry_later: backoff; recorded nowhere
    stored = Operation.objects.get(pk=op["id"])
    events = list(Event.objects.filter(stream=op["id"]).order_by("seq"))
    assert [event.kind for event in events] == ["registered", "claimed", "outcome"]
    assert (stored.event_seq, stored.event_head) == (3, events[-1].hash)
    assert chains_verify().ok


def test_budgets_are_counted_last_and_a_refusal_writes_nothing(api):
    api.tool("t")
    run = api.run(max_tool_calls=1, max_turns=3)
    _claimed(api, run, turn=2)
    assert Run.objects.get(pk=run).turns == 2
    events = Event.objects.count()
    refused = api.register(run, "t", expect=409, claim={"lease_s": 30})
    assert refused["code"] == "budget_exhausted"
    assert refused["budget"] == "max_tool_calls"
    assert Operation.objects.filter(run_id=run).count() == 1
    assert Event.objects.count() == events
    assert Run.objects.get(pk=run).tool_calls == 1

    turns = api.run(max_turns=3)
    assert api.register(turns, "t", turn=4, expect=409)["budget"] == "max_turns"
    assert Run.objects.get(pk=turns).tool_calls == 0


def test_a_replay_takes_no_budget_and_claims_nothing(api):
    api.tool("t")
    run = api.run(max_tool_calls=1)
    first = _claimed(api, run, operation_key="k")
    again = api.post(
        "/api/v1/operations",
        {
            "run": run,
            "tool": "t",
            "operation_key": "k",
            "arguments": {"payment_id": "pay_1", "amount_cents": 500},
            "claim": {"lease_s": 30},
        },
    )
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert "attempt" not in again.json()
    assert Run.objects.get(pk=run).tool_calls == 1


def test_webhook_patterns_follow_the_endpoints_and_subscribers_get_every_message(api, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    api.tool("t")
    created = api.post(
        "/api/v1/webhook-endpoints",
        {"url": "http://127.0.0.1:9/in", "events": ["operation.ready", "operation.exec*"]},
    )
    assert created.status_code == 201, created.json()
    runner = Runner.objects.get(pk=api.runner.pk)
    assert runner.webhook_events == ["operation.exec*", "operation.ready"]
    op = _claimed(api, api.run())
    assert sorted(
        OutboxMessage.objects.filter(operation_id=op["id"]).values_list("event_type", flat=True)
    ) == ["operation.executing", "operation.ready"]

    assert api.client.delete(f"/api/v1/webhook-endpoints/{created.json()['id']}").status_code in (
        200,
        204,
    )
    assert Runner.objects.get(pk=api.runner.pk).webhook_events == []
    quiet = _claimed(api, api.run())
    assert not OutboxMessage.objects.filter(operation_id=quiet["id"]).exists()


def test_another_runner_cannot_post_an_outcome_to_an_operation(api):
    api.tool("t")
    op = _claimed(api, api.run())
    other = make_runner()
    response = other.post(
        f"/api/v1/operations/{op['id']}/attempts/1/outcome", {"kind": "succeeded"}
    )
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    missing = api.post(f"/api/v1/operations/{op['id']}/attempts/2/outcome", {"kind": "succeeded"})
    assert missing.status_code == 404
    assert "no attempt 2" in missing.json()["detail"]
    assert Operation.objects.get(pk=op["id"]).status == "executing"


@pytest.mark.skipif(
    not POSTGRES, reason="the counts are PostgreSQL's (one INSERT for rows of two tables)"
)
@pytest.mark.django_db(transaction=True)
def test_a_lifecycle_sends_its_essential_statements_only():
    # Outside a test transaction: the transactions' own BEGIN and COMMIT are counted.
    api = make_runner()
    api.tool("t")
    run = api.run()
    _claimed(api, run)  # the token is remembered from here on
    with CaptureQueriesContext(connection) as register:
        op = _claimed(api, run)
    with CaptureQueriesContext(connection) as outcome:
        api.outcome(op["id"], 1, {"kind": "succeeded"})
    statements = [query["sql"].split()[0].upper() for query in register.captured_queries]
    # generation read, run+tool read, BEGIN, INSERT operation, INSERT attempt+events,
    # UPDATE run, COMMIT
    assert statements == ["SELECT", "SELECT", "BEGIN", "INSERT", "WITH", "UPDATE", "COMMIT"]
    statements = [query["sql"].split()[0].upper() for query in outcome.captured_queries]
    # generation read, BEGIN, locking read, UPDATE attempt, INSERT event, UPDATE
    # operation, COMMIT
    assert statements == ["SELECT", "BEGIN", "SELECT", "UPDATE", "INSERT", "UPDATE", "COMMIT"]
    assert not any("SAVEPOINT" in query["sql"] for query in register.captured_queries)


def test_the_bodies_built_without_serializers_have_the_declared_fields(api):
    """The answers are built by ``payloads`` (no serializer per request); the serializers
    declare the same fields for the OpenAPI document."""
    api.tool("t")
    op = _claimed(api, api.run())
    assert set(op) - {"attempt"} == set(OperationOut().fields)
    assert set(op["attempt"]) == set(AttemptOut().fields)
    stored = Attempt.objects.select_related("operation").get(operation_id=op["id"])
    assert payloads.attempt(stored) == op["attempt"]
