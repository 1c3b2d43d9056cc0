"""Limits over time under concurrency, with real concurrent HTTP clients against a live
server on PostgreSQL: each request is served on a thread with its own database
connection, so twenty registrations read and write one window at once.

Twenty registrations of one group race for a bound of fewer: exactly as many as the
bound admits register ready, the others wait for a person, and all twenty are counted.
"""

import pytest

from approvals.models import ApprovalRequest
from operations import audit
from operations.models import Operation, PolicyWindowEntry
from operations.services import policies
from tests.conftest import contract, make_runner
from tests.operations.test_policies import in_force
from tests.operations.test_policy_windows import SCHEMA
from tests.support.db import skip_unless_postgresql
from tests.support.race import race_registrations

THREADS = 20

pytestmark = [
    skip_unless_postgresql(
        "needs PostgreSQL: concurrent transactions there run at once and race for the "
        "window (SQLite serializes every write); CI runs the suite on PostgreSQL"
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.mark.parametrize(
    ("bound", "ready"),
    [('@max_count("3")', 3), ('@max_sum("700")\n@sum_of("/amount")', 7)],
    ids=["count", "sum"],
)
def test_twenty_racing_registrations_never_overshoot_a_window(live_server, bound, ready):
    policies.forget()
    api = make_runner()
    api.tool("refund", contract(input_schema=SCHEMA))
    in_force(
        '@id("racing")\n@approval("required")\n@window("24h")\n'
        + bound
        + '\n@group_by("/customer_id")\n'
        'permit(principal, action == Action::"register", resource == Tool::"refund");'
    )
    run = api.run()
    bodies = [
        {
            "run": run,
            "tool": "refund",
            "operation_key": f"race-{i}",
            "arguments": {"payment_id": f"pay_{i}", "customer_id": "c-1", "amount": 100},
        }
        for i in range(THREADS)
    ]

    results = race_registrations(live_server, api.token, bodies)

    assert sorted(code for code, _ in results) == [201] * THREADS
    statuses = sorted(body["status"] for _, body in results)
    assert statuses == ["awaiting_approval"] * (THREADS - ready) + ["ready"] * ready
    assert Operation.objects.filter(status="ready").count() == ready
    assert PolicyWindowEntry.objects.filter(policy_id="racing").count() == THREADS
    # Each one that waits saw the window with every earlier one in it: the figures it
    # was told are the counts from the bound up, each once.
    reasons = sorted(ApprovalRequest.objects.values_list("reason", flat=True))
    assert len(reasons) == THREADS - ready
    if ready == 3:
        figures = sorted(int(r.split("(")[1].split(" ")[0]) for r in reasons)
        assert figures == list(range(ready + 1, THREADS + 1))
    assert [found.describe() for found in audit.state_verify()] == []
    policies.forget()
