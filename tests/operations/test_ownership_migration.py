"""The migration that introduces tool ownership breaks nothing in flight (api.md 1.1):
each tool's first registering runner owns it, and every runner keeps invoking the tools
it had already invoked."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from operations import access
from operations.models import Runner, Tool
from tests.operations.conftest import migrate_to

BEFORE = [("operations", "0003_search_indexes")]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_ownership_goes_to_the_first_registering_runner_and_invokers_keep_their_tools():
    migrate_to(BEFORE)
    old = MigrationExecutor(connection).loader.project_state(BEFORE).apps
    user_model = old.get_model("auth", "User")
    runner_model = old.get_model("operations", "Runner")

    def runner(name: str):
        service_user = user_model.objects.create(username=f"runner:{name}")
        return runner_model.objects.create(name=name, service_user=service_user)

    first, second, third = runner("first"), runner("second"), runner("third")
    tool = old.get_model("operations", "Tool").objects.create(name="t")
    versions = old.get_model("operations", "ToolVersion").objects
    v1 = versions.create(tool=tool, number=1, contract={}, contract_hash="a", registered_by=first)
    versions.create(tool=tool, number=2, contract={}, contract_hash="b", registered_by=second)
    tool.active_version = v1
    tool.save()
    run = old.get_model("operations", "Run").objects.create(runner=second, principal="p")
    old.get_model("operations", "Operation").objects.create(
        runner=second,
        run=run,
        tool=tool,
        tool_version=v1,
        effect_class="idempotent",
        operation_key="k",
        arguments={},
        intent_hash="0" * 64,
        principal="p",
        status="ready",
    )

    migrate_to(MigrationExecutor(connection).loader.graph.leaf_nodes())

    tool = Tool.objects.get(pk="t")
    assert tool.owner == Runner.objects.get(name="first")
    assert access.runner_may_invoke(Runner.objects.get(name="first"), tool)
    assert access.runner_may_invoke(Runner.objects.get(name="second"), tool)
    # A runner that never invoked the tool is not allowed on it by the migration.
    assert not access.runner_may_invoke(Runner.objects.get(pk=third.pk), tool)
