"""People's policies read the run as it is before each registration (docs/policies.md):
the items of a registration batch are judged as single calls one after another are, each
against the run as the items before it left it."""

import pytest
from django.conf import settings

from operations.models import Operation
from tests.operations.test_batches import _batch, _item
from tests.operations.test_policies import _fresh_policies, in_force  # noqa: F401

POSTGRES = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"

CAP = """@id("cap-calls")
@message("Two tool calls per run")
forbid(principal, action == Action::"register", resource)
when { context.run.tool_calls >= 2 };"""


@pytest.mark.skipif(not POSTGRES, reason="the set-based write is PostgreSQL's")
@pytest.mark.parametrize("together", [False, True])
def test_a_policy_on_the_runs_calls_so_far_counts_the_batchs_earlier_items(api, together):
    api.tool("t")
    in_force(CAP)
    run = api.run()
    items = [_item(run, f"p{n}", n=n) for n in range(4)]
    if together:
        statuses = [answer["status"] for answer in _batch(api, items)]
    else:
        statuses = [api.post("/api/v1/operations", item).status_code for item in items]
    assert statuses == [201, 201, 403, 403]
    assert Operation.objects.filter(run_id=run).count() == 2
