"""audit verify on standing grants: each forgery of a grant's row that would let it
approve more, or hide what it approved, is reported, and the command fails.

The forgeries use what the application's database credentials allow: UPDATE of the
grant's row (not append-only), INSERT of a signature.
"""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from approvals.models import Grant, StandingGrant, StandingGrantSignature
from operations import audit, services
from tests.approvals.conftest import person
from tests.conftest import contract

from .conftest import audit_verify


@pytest.fixture
def used(api):
    """A grant of four uses of at most 1000 each and a sum cap, signed by two people,
    used once."""
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    ann, bob = person(decide_on="refund"), person(decide_on="refund")
    grant = services.standing_grant_issue(
        services.StandingTerms(
            tool="refund",
            max_uses=4,
            expires_at=timezone.now() + timedelta(hours=1),
            pins=[{"path": "/amount_cents", "op": "lte", "value": 1000}],
            sum_path="/amount_cents",
            max_sum=Decimal(2000),
            approvals_required=2,
        ),
        user=ann,
    )
    services.standing_grant_sign(grant_id=grant.id, user=bob)
    op = api.register(api.run(), "refund")
    assert op["status"] == "ready"
    grant.refresh_from_db()
    assert grant.uses == 1
    return grant


def _problems() -> list[str]:
    return [found.describe() for found in audit.state_verify()]


def test_a_clean_grant_verifies(used):
    assert _problems() == []
    assert audit_verify()[0] == 0


def test_a_forged_count_of_uses_is_caught(used):
    StandingGrant.objects.filter(pk=used.pk).update(uses=0)
    assert _problems() == [
        f"approvals.StandingGrant {used.id}: it counts 0 uses, but 1 standing_grant_used "
        "events record one"
    ]
    status, output = audit_verify()
    assert status == 1
    assert "it counts 0 uses" in output


@pytest.mark.parametrize(
    ("column", "value", "problem"),
    [
        ("max_uses", 400, "its max_uses is 400, but its standing_grant_issued event says 4"),
        ("principal", "", None),
        ("pins", [], "its pins is [], but"),
        ("max_sum", Decimal(900000), 'its max_sum is "900000.000000"'),
        ("approvals_required", 1, "its approvals_required is 1, but"),
        ("sum_used", Decimal(0), "its sum_used is 0.000000, but its last standing_grant_used"),
        ("status", "proposed", "its status is proposed, but its last event left it active"),
    ],
)
def test_a_forged_term_or_state_is_caught(used, column, value, problem):
    if column == "principal":
        StandingGrant.objects.filter(pk=used.pk).update(principal="user:alice")
        problem = 'its principal is "user:alice", but its standing_grant_issued event says ""'
    else:
        StandingGrant.objects.filter(pk=used.pk).update(**{column: value})
    found = _problems()
    assert len(found) == 1, found
    assert found[0].startswith(f"approvals.StandingGrant {used.id}: ")
    assert problem in found[0]


def test_a_revoked_grant_set_active_again_is_caught(used):
    services.standing_grant_revoke(grant_id=used.id, user=person(decide_on="refund"), reason="x")
    StandingGrant.objects.filter(pk=used.pk).update(status="active")
    assert _problems() == [
        f"approvals.StandingGrant {used.id}: its status is active, but its last event left it "
        "revoked"
    ]


def test_a_forged_signature_is_caught(used):
    mallory = person()
    StandingGrantSignature.objects.create(grant=used, user=mallory, at=timezone.now())
    given = Grant.objects.get(standing_grant=used)
    signers = sorted(StandingGrantSignature.objects.values_list("user_id", flat=True))
    assert _problems() == [
        f"approvals.Grant {given.id}: its deciders are users {signers} (the signers of its "
        f"standing grant), but its granted event names {signers[:2]}",
        f"approvals.StandingGrant {used.id}: it has 3 signatures, but 2 standing_grant_issued "
        "and standing_grant_signed events",
    ]


def test_a_grant_moved_onto_another_standing_grant_is_caught(used):
    other = services.standing_grant_issue(
        services.StandingTerms(
            tool="refund",
            max_uses=1,
            expires_at=timezone.now() + timedelta(hours=1),
            approvals_required=2,
        ),
        user=person(decide_on="refund"),
    )
    given = Grant.objects.get(standing_grant=used)
    Grant.objects.filter(pk=given.pk).update(standing_grant=other)
    found = _problems()
    assert found == [
        f'approvals.Grant {given.id}: its standing grant is "{other.id}", but its granted '
        f'event names "{used.id}"'
    ]
