"""Uses of a standing grant under concurrency, with real concurrent HTTP clients against
a live server on PostgreSQL: each thread has its own connection to the server, which
serves each request on a thread with its own database connection.

Twenty registrations in the grant's family race for fewer uses (or less of the sum)
than they ask for: exactly as many as the grant holds are covered, the others wait for
a person, and the count, the grants and the events agree.
"""

import threading
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest
from django.db import connection
from django.utils import timezone

from approvals.models import Grant, StandingGrant
from operations import audit, services
from operations.models import Event, Operation
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner
from tests.support.db import skip_unless_postgresql
from tests.support.race import race_registrations

THREADS = 20

pytestmark = [
    skip_unless_postgresql(
        "needs PostgreSQL: concurrent transactions there run at once and race for the "
        "grant's row (SQLite serializes every write); CI runs the suite on PostgreSQL"
    ),
    pytest.mark.django_db(transaction=True),
]


@pytest.mark.parametrize(
    ("limits", "amount", "covered"),
    [
        ({"max_uses": 5}, 100, 5),
        ({"max_uses": 50, "sum_path": "/amount_cents", "max_sum": Decimal(700)}, 100, 7),
    ],
    ids=["uses", "sum"],
)
def test_twenty_racing_registrations_never_overspend_a_standing_grant(
    live_server, limits, amount, covered
):
    api = make_runner()
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    grant = services.standing_grant_issue(
        services.StandingTerms(
            tool="refund",
            expires_at=timezone.now() + timedelta(hours=1),
            pins=[{"path": "/amount_cents", "op": "lte", "value": 1000}],
            **limits,
        ),
        user=person(decide_on="refund"),
    )
    run = api.run()
    bodies = [
        {
            "run": run,
            "tool": "refund",
            "operation_key": f"race-{i}",
            "arguments": {"payment_id": f"pay_{i}", "amount_cents": amount},
        }
        for i in range(THREADS)
    ]

    results = race_registrations(live_server, api.token, bodies)

    assert sorted(code for code, _ in results) == [201] * THREADS
    statuses = sorted(body["status"] for _, body in results)
    assert statuses == ["awaiting_approval"] * (THREADS - covered) + ["ready"] * covered
    ready = [body for _, body in results if body["status"] == "ready"]
    assert {body["approval"]["standing_grant"] for body in ready} == {grant.id}
    grant.refresh_from_db()
    assert grant.uses == covered
    assert grant.status == "exhausted"
    if "max_sum" in limits:
        assert grant.sum_used == limits["max_sum"]
    assert Grant.objects.filter(standing_grant=grant).count() == covered
    used = Event.objects.filter(stream=f"sgr:{grant.id}", kind="standing_grant_used")
    assert sorted(used.values_list("data__uses", flat=True)) == list(range(1, covered + 1))
    assert Operation.objects.filter(status="ready").count() == covered
    assert [found.describe() for found in audit.state_verify()] == []
    assert audit.chains_verify().ok


def test_a_revocation_on_another_connection_stops_the_next_claim(live_server):
    """No process remembers a standing grant: a claim served by the live server's
    thread reads the revocation another connection committed a moment before."""
    api = make_runner()
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    ann = person(decide_on="refund")
    grant = services.standing_grant_issue(
        services.StandingTerms(
            tool="refund", max_uses=5, expires_at=timezone.now() + timedelta(hours=1)
        ),
        user=ann,
    )
    run = api.run()
    ops = [api.register(run, "refund")["id"] for _ in range(2)]
    headers = {"Authorization": f"Bearer {api.token}"}
    with httpx.Client(base_url=live_server.url, headers=headers, timeout=60) as client:
        first = client.post(f"/api/v1/operations/{ops[0]}/attempts", json={})
        assert first.status_code == 201, first.json()

        def revoke() -> None:
            try:
                services.standing_grant_revoke(grant_id=grant.id, user=ann, reason="paused")
            finally:
                connection.close()

        thread = threading.Thread(target=revoke)
        thread.start()
        thread.join()
        assert StandingGrant.objects.get(pk=grant.id).status == "revoked"

        second = client.post(f"/api/v1/operations/{ops[1]}/attempts", json={})
    assert second.status_code == 403
    assert second.json()["code"] == "grant_invalid"
    assert Operation.objects.get(pk=ops[1]).status == "awaiting_approval"
