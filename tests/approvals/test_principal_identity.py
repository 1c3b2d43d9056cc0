"""Who is barred from deciding is judged when a person decides, from the principal as
an identity (NFKC, case-folded) and the current people, not a snapshot taken at
registration."""

import pytest

from approvals.errors import PermissionRefused
from approvals.models import ApprovalRequest
from operations import services
from tests.approvals.conftest import person
from tests.conftest import contract


@pytest.fixture
def needs_approval(api):
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))


def _request(api, principal: str) -> ApprovalRequest:
    op = api.register(api.run(principal=principal), "refund")
    return ApprovalRequest.objects.get(pk=op["approval"]["id"])


@pytest.mark.parametrize("principal", ["user:ALICE", "user:Alice", "user:\uff41lice"])
def test_a_spelling_variant_of_the_principal_cannot_approve(api, needs_approval, principal):
    alice = person(username="alice", decide_on="refund")
    request = _request(api, principal)
    with pytest.raises(PermissionRefused, match="principal"):
        services.approval_decide(request_id=request.id, user=alice, approve=True, comment="")
    request.refresh_from_db()
    assert request.status == "pending"


def test_a_person_created_after_registration_is_barred_as_the_principal(api, needs_approval):
    request = _request(api, "user:newcomer")
    newcomer = person(username="newcomer", decide_on="refund")
    with pytest.raises(PermissionRefused, match="principal"):
        services.approval_decide(request_id=request.id, user=newcomer, approve=True, comment="")


def test_a_runner_owner_named_after_registration_is_barred(api, needs_approval):
    request = _request(api, "user:bob")
    owner = person(decide_on="refund")
    api.runner.owner = owner
    api.runner.save(update_fields=["owner"])
    with pytest.raises(PermissionRefused, match="owner"):
        services.approval_decide(request_id=request.id, user=owner, approve=True, comment="")


def test_someone_else_still_approves(api, needs_approval):
    person(username="alice", decide_on="refund")
    request = _request(api, "user:ALICE")
    other = person(decide_on="refund")
    op = services.approval_decide(request_id=request.id, user=other, approve=True, comment="")
    assert op.status == "ready"


@pytest.mark.parametrize("username", ["Stra\u00dfe", "\u00c9lodie"])
def test_a_principal_named_by_case_folding_beyond_ascii_is_barred(api, needs_approval, username):
    # The database's case-insensitive match is not case folding: ß folds to "ss", and
    # SQLite compares only ASCII letters without case.
    user = person(username=username, decide_on="refund")
    request = _request(api, f"user:{username}")
    with pytest.raises(PermissionRefused, match="principal"):
        services.approval_decide(request_id=request.id, user=user, approve=True, comment="")
