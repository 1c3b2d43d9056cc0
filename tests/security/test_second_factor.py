"""The optional second factor (TOTP, django-otp) and the setting that requires it for
deciding on irreversible tools."""

import re
import time
from base64 import b32decode

import pytest
import time_machine
from django.test import Client
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from approvals.errors import PermissionRefused
from approvals.models import Decision
from operations import services
from operations.access import SECOND_FACTOR_REFUSAL
from operations.models import Event, Operation
from tests.approvals.conftest import person
from tests.conftest import contract
from tests.support.world import Direct


def _code(device: TOTPDevice, *, offset_steps: int = 0) -> str:
    return f"{totp(device.bin_key, t0=-offset_steps * device.step):06d}"


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _enrol(client: Client, user) -> TOTPDevice:
    page = client.post("/account/totp")
    assert page.status_code == 200
    assert "no-store" in page["Cache-Control"]
    secret = re.search(r'id="totp-secret">([A-Z2-7 ]+)<', page.content.decode()).group(1)
    device = TOTPDevice.objects.get(user=user, confirmed=False)
    assert b32decode(secret.replace(" ", "")) == device.bin_key
    response = client.post("/account/totp/confirm", {"code": _code(device)})
    assert response.status_code == 302
    device.refresh_from_db()
    assert device.confirmed
    return device


@pytest.fixture
def pending_irreversible(api):
    direct = Direct(api)  # the tests are about deciding, not about registering
    direct.tool("pay", contract("irreversible", approval={"mode": "always"}))
    direct.tool("read", contract("read_only", approval={"mode": "always"}))
    run = direct.run(principal="user:somebody")
    return {
        "pay": direct.register(run, "pay"),
        "read": direct.register(run, "read", {"payment_id": "p", "amount_cents": 2}),
    }


def test_setting_up_an_authenticator_verifies_the_session(db):
    user = person()
    client = _client(user)
    assert "not verified" in client.get("/account/").content.decode()
    _enrol(client, user)
    page = client.get("/account/").content.decode()
    assert "This session is <strong>verified</strong>" in page
    kinds = list(Event.objects.filter(stream=f"user:{user.pk}").values_list("kind", flat=True))
    assert "second_factor_added" in kinds
    # The secret is in no event and in no later page.
    device = TOTPDevice.objects.get(user=user)
    assert device.key not in str(list(Event.objects.values_list("data", flat=True)))
    assert "totp-secret" not in page


def test_a_wrong_code_does_not_confirm_the_authenticator(db):
    user = person()
    client = _client(user)
    client.post("/account/totp")
    response = client.post("/account/totp/confirm", {"code": "000000"})
    assert response.status_code == 400
    assert not TOTPDevice.objects.filter(user=user, confirmed=True).exists()
    assert Event.objects.filter(stream=f"user:{user.pk}", kind="second_factor_failed").exists()


def test_a_new_session_must_verify_with_a_fresh_code(db):
    user = person()
    device = _enrol(_client(user), user)
    client = _client(user)
    assert "not verified" in client.get("/account/").content.decode()
    device.refresh_from_db()
    fresh = _code(device, offset_steps=1)  # the next time step's code
    response = client.post("/account/verify", {"code": fresh, "next": "/approvals/x/"})
    assert response.status_code == 302
    assert response["Location"] == "/approvals/x/"
    assert "This session is <strong>verified</strong>" in client.get("/account/").content.decode()


def test_a_used_code_cannot_be_replayed(db):
    user = person()
    # The clock stands still: the code made again below is the one the enrolment used
    # (a TOTP step ending in between would make it the next step's, which is unused).
    with time_machine.travel(time.time(), tick=False):
        device = _enrol(_client(user), user)
        client = _client(user)
        used = _code(device)  # the code the enrolment just used
        assert client.post("/account/verify", {"code": used}).status_code == 400
    assert "not verified" in client.get("/account/").content.decode()


def test_verify_redirects_only_to_this_site(db):
    user = person()
    device = _enrol(_client(user), user)
    client = _client(user)
    device.refresh_from_db()
    response = client.post(
        "/account/verify",
        {"code": _code(device, offset_steps=1), "next": "https://evil.example/"},
    )
    assert response.status_code == 302
    assert response["Location"] == "/account/"


def test_adding_another_authenticator_needs_a_verified_session(db):
    user = person()
    _enrol(_client(user), user)
    thief = _client(user)
    response = thief.post("/account/totp")
    assert response.status_code == 302
    assert TOTPDevice.objects.filter(user=user).count() == 1


def test_without_the_setting_nobody_needs_a_second_factor(pending_irreversible, settings):
    settings.REQUIRE_TOTP_FOR_IRREVERSIBLE = False
    approver = person(decide_on="pay")
    op = services.approval_decide(
        request_id=pending_irreversible["pay"]["approval"]["id"],
        user=approver,
        approve=True,
        comment="",
    )
    assert op.status == "ready"


def test_the_setting_refuses_unverified_decisions_on_irreversible_tools(
    pending_irreversible, settings
):
    settings.REQUIRE_TOTP_FOR_IRREVERSIBLE = True
    approver = person(decide_on="pay")
    approval_id = pending_irreversible["pay"]["approval"]["id"]
    with pytest.raises(PermissionRefused, match="one-time password"):
        services.approval_decide(request_id=approval_id, user=approver, approve=True, comment="")
    with pytest.raises(PermissionRefused, match="one-time password"):
        services.approval_decide(request_id=approval_id, user=approver, approve=False, comment="no")
    assert not Decision.objects.exists()
    assert Operation.objects.get(pk=pending_irreversible["pay"]["id"]).status == (
        "awaiting_approval"
    )
    op = services.approval_decide(
        request_id=approval_id, user=approver, approve=True, comment="", otp_verified=True
    )
    assert op.status == "ready"


def test_the_setting_leaves_other_effect_classes_alone(pending_irreversible, settings):
    settings.REQUIRE_TOTP_FOR_IRREVERSIBLE = True
    approver = person()
    from guardian.shortcuts import assign_perm

    from operations.models import Tool

    assign_perm("operations.decide_tool", approver, Tool.objects.get(pk="read"))
    op = services.approval_decide(
        request_id=pending_irreversible["read"]["approval"]["id"],
        user=approver,
        approve=True,
        comment="",
    )
    assert op.status == "ready"


def test_the_console_asks_for_verification_then_accepts_the_decision(
    pending_irreversible, settings
):
    settings.REQUIRE_TOTP_FOR_IRREVERSIBLE = True
    approver = person(decide_on="pay")
    device = _enrol(_client(approver), approver)
    client = _client(approver)
    approval_id = pending_irreversible["pay"]["approval"]["id"]

    page = client.get(f"/approvals/{approval_id}/").content.decode()
    assert SECOND_FACTOR_REFUSAL in page
    assert "/account/verify?next=" in page
    assert 'value="approve"' not in page
    refused = client.post(f"/approvals/{approval_id}/decide", {"decision": "approve"}, follow=True)
    assert refused.redirect_chain == [(f"/approvals/{approval_id}/", 302)]
    assert SECOND_FACTOR_REFUSAL in refused.content.decode()
    assert not Decision.objects.exists()

    device.refresh_from_db()
    client.post("/account/verify", {"code": _code(device, offset_steps=1)})
    page = client.get(f"/approvals/{approval_id}/").content.decode()
    assert SECOND_FACTOR_REFUSAL not in page
    assert 'value="approve"' in page
    client.post(f"/approvals/{approval_id}/decide", {"decision": "approve"})
    assert Decision.objects.get().user == approver
    assert Operation.objects.get(pk=pending_irreversible["pay"]["id"]).status == "ready"


def test_verification_is_throttled_after_a_failure(db):
    user = person()
    device = _enrol(_client(user), user)
    client = _client(user)
    assert client.post("/account/verify", {"code": "000000"}).status_code == 400
    device.refresh_from_db()
    assert device.throttling_failure_count == 1
    # While throttled (a delay that doubles with every failure) even the right code fails.
    right = _code(device, offset_steps=1)
    assert client.post("/account/verify", {"code": right}).status_code == 400
    with time_machine.travel(time.time() + 3, tick=False):
        right = _code(device, offset_steps=1)
        assert client.post("/account/verify", {"code": right}).status_code == 302


@pytest.mark.parametrize(
    ("claims", "asserted"),
    [
        ({"amr": ["pwd", "otp"]}, "amr:otp"),
        ({"amr": ["pwd"]}, ""),
        ({"amr": "otp"}, ""),  # not a list: no assertion
        ({"acr": "urn:example:mfa"}, "acr:urn:example:mfa"),
        ({"acr": "urn:example:password"}, ""),
        ({}, ""),
    ],
)
def test_which_provider_assertions_count_as_a_second_factor(claims, asserted, settings):
    from console.sso import second_factor_asserted

    settings.OIDC_SECOND_FACTOR_AMR = frozenset({"otp", "hwk"})
    settings.OIDC_SECOND_FACTOR_ACR = frozenset({"urn:example:mfa"})
    assert second_factor_asserted(claims) == asserted


def test_a_session_whose_sign_in_asserted_a_second_factor_may_decide_irreversible_tools(
    pending_irreversible, settings
):
    """REQUIRE_TOTP_FOR_IRREVERSIBLE is met by the identity provider's amr / acr at
    sign-in (console/sso.py sets the session's mark), and only in that session."""
    from console.security import SSO_SECOND_FACTOR

    settings.REQUIRE_TOTP_FOR_IRREVERSIBLE = True
    approver = person(decide_on="pay")
    approval_id = pending_irreversible["pay"]["approval"]["id"]
    plain = _client(approver)
    plain.post(f"/approvals/{approval_id}/decide", {"decision": "approve"})
    assert not Decision.objects.exists()
    asserted = _client(approver)
    session = asserted.session
    session[SSO_SECOND_FACTOR] = True
    session.save()
    asserted.post(f"/approvals/{approval_id}/decide", {"decision": "approve"})
    assert Operation.objects.get(pk=pending_irreversible["pay"]["id"]).status == "ready"
