"""The migration behind the lean hot path (0007) fills its new columns for rows that
exist: each operation's event-chain head, each run's principal user, each runner's
webhook patterns. A wrong head would make the next event collide with the last one; a
missing pattern would silently drop webhooks."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from operations.models import Event, Operation, Run, Runner
from tests.operations.conftest import migrate_to

BEFORE = [("operations", "0006_toolversion_registering_owner")]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_heads_principal_users_and_webhook_patterns_are_filled_in():
    migrate_to(BEFORE)
    old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
    users = old.get_model("auth", "User").objects
    alice = users.create(username="Alice")
    users.create(username="runner:alice")  # a service user is nobody's principal
    service_user = users.create(username="runner:r")
    runner = old.get_model("operations", "Runner").objects.create(
        name="r", service_user=service_user
    )
    quiet = old.get_model("operations", "Runner").objects.create(
        name="quiet", service_user=users.create(username="runner:quiet")
    )
    tool = old.get_model("operations", "Tool").objects.create(name="t", owner=runner)
    version = old.get_model("operations", "ToolVersion").objects.create(
        tool=tool, number=1, contract={}, contract_hash="a", registered_by=runner
    )
    runs = old.get_model("operations", "Run").objects
    named = runs.create(runner=runner, principal="user:ALICE")
    nobody = runs.create(runner=runner, principal="user:bob")
    op_model = old.get_model("operations", "Operation")

    def operation(key: str):
        return op_model.objects.create(
            runner=runner,
            run=named,
            tool=tool,
            tool_version=version,
            effect_class="idempotent",
            operation_key=key,
            arguments={},
            intent_hash="0" * 64,
            principal="user:ALICE",
            status="ready",
        )

    with_events, without_events = operation("k1"), operation("k2")
    events = old.get_model("operations", "Event").objects
    for seq, digest in ((1, "1" * 64), (2, "2" * 64), (3, "3" * 64)):
        events.create(
            stream=with_events.id,
            seq=seq,
            kind="k",
            operation=with_events,
            actor="a",
            at="2026-11-30T00:00:00Z",
            prev_hash="x" * 64,
            hash=digest,
        )
    endpoints = old.get_model("operations", "WebhookEndpoint").objects
    endpoints.create(runner=runner, url="https://a.example", events=["operation.*"])
    endpoints.create(runner=runner, url="https://b.example", events=["approval.*", "operation.*"])
    endpoints.create(runner=runner, url="https://c.example", events=["run.*"], is_active=False)

    migrate_to(MigrationExecutor(connection).loader.graph.leaf_nodes())

    op = Operation.objects.get(pk=with_events.id)
    assert (op.event_seq, op.event_head) == (3, "3" * 64)
    assert Event.objects.get(stream=op.id, seq=op.event_seq).hash == op.event_head
    blank = Operation.objects.get(pk=without_events.id)
    assert (blank.event_seq, blank.event_head) == (0, "")
    assert Run.objects.get(pk=named.id).principal_user_id == alice.id
    assert Run.objects.get(pk=nobody.id).principal_user_id is None
    assert Runner.objects.get(pk=runner.id).webhook_events == ["approval.*", "operation.*"]
    assert Runner.objects.get(pk=quiet.id).webhook_events == []
