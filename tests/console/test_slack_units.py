"""The parts of Slack's handling that need no Slack: which profiles may be linked by
email, how emails compare, how text is escaped for mrkdwn."""

import pytest

from console.slack import confirmed_email, same_email
from operations.dispatch.slack import escape
from tests.approvals.conftest import person

TEAM = "T0OURS"
MEMBER = {
    "id": "U0ANN",
    "team_id": TEAM,
    "is_email_confirmed": True,
    "profile": {"email": "Ann@Example.com"},
}


@pytest.fixture(autouse=True)
def _team(settings):
    settings.SLACK_TEAM_ID = TEAM


def test_a_full_member_with_a_confirmed_email_has_it_lower_cased():
    assert confirmed_email(MEMBER) == "ann@example.com"


@pytest.mark.parametrize(
    "change",
    [
        {"team_id": "TOTHER"},
        {"is_stranger": True},
        {"is_restricted": True},
        {"is_ultra_restricted": True},
        {"is_bot": True},
        {"deleted": True},
        {"is_email_confirmed": False},
        {"is_email_confirmed": "true"},
        {"profile": {"email": "ann@exa@mple.com"}},
        {"profile": {"email": "ann@\u0131bm.com"}},
        {"profile": {}},
    ],
)
def test_no_email_is_taken_from_a_guest_a_stranger_or_an_unconfirmed_address(change):
    assert confirmed_email({**MEMBER, **change}) == ""
    assert confirmed_email(None) == ""


@pytest.mark.django_db
def test_emails_compare_exactly_as_ascii():
    assert same_email(person(email="ann@example.com"), "ann@example.com")
    assert same_email(person(email="ANN@example.com"), "ann@example.com")
    assert not same_email(person(email="adm\u0131n@ibm.com"), "admin@ibm.com")
    assert not same_email(person(email=""), "")


def test_escaping_comes_before_cutting_and_never_splits_an_escape():
    text = escape("<" * 3000, 100)
    assert len(text) <= 100
    assert text.endswith("…")
    assert text[:-1].replace("&lt;", "") == ""
    assert escape("a & b <c>") == "a &amp; b &lt;c&gt;"
