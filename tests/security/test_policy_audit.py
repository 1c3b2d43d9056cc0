"""audit verify on people's policies: each forgery of a policy's row or of one of its
versions that would put a text in force that two people did not put there, or hide
which text is in force, is reported, and the command fails.

The forgeries use what the application's database credentials allow: UPDATE and INSERT
on the policy tables (not append-only), and events appended with a well-formed chain.
"""

import pytest
from django.utils import timezone

from operations import audit, services
from operations.canonical import sha256_hex
from operations.machine import EventKind
from operations.models import Policy, PolicyVersion
from operations.services import policies
from operations.services.core import Actor, event_append
from tests.conftest import contract

from .conftest import audit_verify, steward

NO_HUGE = """@id("no-huge")
@message("Nobody refunds more than 5000.00")
forbid(principal, action == Action::"register", resource)
when { context.arguments has amount_cents && context.arguments.amount_cents > 500000 };"""

NO_BIG = NO_HUGE.replace("500000", "50000")

ASK = """@id("ask-big")
@approval("required")
permit(principal, action == Action::"register", resource == Tool::"refund")
when { context.arguments.amount_cents > 10000 };"""


@pytest.fixture(autouse=True)
def _fresh_policies():
    policies.forget()
    yield
    policies.forget()


@pytest.fixture
def ledger(api):
    """``no-huge``: version 1 in force, version 2 watched in shadow; ``ask-big`` in
    force; the authors and the second people who activated."""
    api.tool("refund", contract("irreversible"))
    ann, bob, cid = steward(), steward(), steward()
    services.policies.policy_write(user=ann, text=NO_HUGE)
    services.policies.policy_activate(user=bob, policy_id="no-huge")
    services.policies.policy_write(user=cid, text=NO_BIG, shadow=True)
    services.policies.policy_write(user=bob, text=ASK)
    services.policies.policy_activate(user=ann, policy_id="ask-big")
    assert api.register(api.run(), "refund", {"payment_id": "p", "amount_cents": 20000})[
        "status"
    ] == ("awaiting_approval")
    return {"ann": ann, "bob": bob, "cid": cid}


def _problems() -> list[str]:
    return [found.describe() for found in audit.state_verify()]


def test_a_clean_ledger_with_policies_verifies(ledger):
    policy = Policy.objects.get(pk="no-huge")
    assert (policy.state, policy.active_version.number, policy.shadow_version.number) == (
        "active",
        1,
        2,
    )
    assert _problems() == []
    assert audit_verify()[0] == 0


def test_a_retired_policy_and_one_written_again_verify(ledger):
    services.policies.policy_retire(user=ledger["ann"], policy_id="no-huge", reason="done")
    services.policies.policy_write(user=ledger["ann"], text=NO_HUGE.replace("5000.00", "5k"))
    assert Policy.objects.get(pk="no-huge").state == "draft"
    services.policies.policy_retire(user=ledger["cid"], policy_id="ask-big")
    assert _problems() == []


def test_a_forged_active_version_is_caught(ledger):
    # The shadowed, stricter-looking text put in force by one person in SQL.
    version = PolicyVersion.objects.get(policy_id="no-huge", number=2)
    Policy.objects.filter(pk="no-huge").update(active_version=version, shadow_version=None)
    assert _problems() == [
        "operations.Policy no-huge: its active version is 2, but its events leave 1 in force"
    ]
    status, output = audit_verify()
    assert status == 1
    assert "its active version is 2" in output


def test_a_draft_forged_into_force_is_caught(ledger):
    services.policies.policy_write(user=ledger["ann"], text=ASK.replace("10000", "100"))
    version = PolicyVersion.objects.get(policy_id="ask-big", number=2)
    Policy.objects.filter(pk="ask-big").update(active_version=version)
    assert _problems() == [
        "operations.Policy ask-big: its active version is 2, but its events leave 1 in force"
    ]


def test_a_forged_shadow_version_is_caught(ledger):
    Policy.objects.filter(pk="no-huge").update(shadow_version=None)
    assert _problems() == [
        "operations.Policy no-huge: its shadow version is null, but its events leave 2 watched"
    ]


@pytest.mark.parametrize("state", ["retired", "draft", "shadow"])
def test_a_forged_state_is_caught(ledger, state):
    Policy.objects.filter(pk="ask-big").update(state=state)
    assert _problems() == [
        f"operations.Policy ask-big: its state is {state}, but its events leave it active"
    ]


def test_a_retired_policy_put_back_in_force_is_caught(ledger):
    in_force = Policy.objects.get(pk="no-huge").active_version
    services.policies.policy_retire(user=ledger["ann"], policy_id="no-huge")
    Policy.objects.filter(pk="no-huge").update(state="active", active_version=in_force)
    assert _problems() == [
        "operations.Policy no-huge: its state is active, but its events leave it retired"
    ]


def test_a_changed_text_is_caught(ledger):
    # The forbid in force loosened by a digit, its hash left alone.
    PolicyVersion.objects.filter(policy_id="no-huge", number=1).update(
        text=NO_HUGE.replace("500000", "5000000")
    )
    assert _problems() == [
        "operations.PolicyVersion no-huge v1: its text is not the one its text_hash was "
        "computed over"
    ]


def test_a_changed_text_with_its_hash_recomputed_is_caught(ledger):
    looser = NO_HUGE.replace("500000", "5000000")
    PolicyVersion.objects.filter(policy_id="no-huge", number=1).update(
        text=looser, text_hash=sha256_hex(looser)
    )
    found = _problems()
    assert found == [
        f'operations.PolicyVersion no-huge v1: its text_hash is "{sha256_hex(looser)}", but '
        f'its policy_written event says "{sha256_hex(NO_HUGE)}"'
    ]


def test_a_version_without_its_written_event_is_caught(ledger):
    looser = NO_HUGE.replace("500000", "5000000")
    PolicyVersion.objects.create(
        policy_id="no-huge",
        number=3,
        text=looser,
        text_hash=sha256_hex(looser),
        kind="forbid",
        written_by=ledger["ann"],
        written_at=timezone.now(),
    )
    assert _problems() == ["operations.PolicyVersion no-huge v3: no policy_written event wrote it"]


def test_a_policy_row_without_events_is_caught(ledger):
    now = timezone.now()
    Policy.objects.create(id="planted", state="draft", created_at=now, updated_at=now)
    assert _problems() == ["operations.Policy planted: its stream has no policy_written event"]


def test_an_author_forged_onto_another_person_is_caught(ledger):
    # Moving the authorship would make the author's own activation look like four eyes.
    PolicyVersion.objects.filter(policy_id="no-huge", number=2).update(written_by=ledger["bob"])
    assert _problems() == [
        f"operations.PolicyVersion no-huge v2: its author is user {ledger['bob'].pk}, but its "
        f"policy_written event was written by user {ledger['cid'].pk}"
    ]


def test_an_activation_by_the_author_forged_into_the_events_is_caught(ledger):
    """A forger who appends a well-formed ``policy_activated`` event (every chain still
    holds) and sets the row to match: the replay agrees, the four eyes do not."""
    cid = ledger["cid"]
    version = PolicyVersion.objects.get(policy_id="no-huge", number=2)
    event_append(
        stream="policy:no-huge",
        kind=EventKind.POLICY_ACTIVATED,
        actor=Actor.of_user(cid),
        data={
            "policy": "no-huge",
            "state": "active",
            "version": 2,
            "text_hash": version.text_hash,
            "author": cid.pk,
            "previous_version": 1,
        },
        now=timezone.now(),
    )
    Policy.objects.filter(pk="no-huge").update(active_version=version, shadow_version=None)
    assert audit.chains_verify().ok
    assert _problems() == [
        f"operations.PolicyVersion no-huge v2: a policy_activated event by user {cid.pk}, its "
        "author, put it in force: activating needs a second person"
    ]
    assert audit_verify()[0] == 1
