"""Single sign-on through a real OpenID provider (oidc-provider on loopback, started by
tests/support/oidc.py): the whole redirect flow with PKCE, state and nonce, people found
by (issuer, sub), groups refreshed at each sign-in, and the refusals: a state this
browser did not start, a replayed code, an expired ID token, an unknown person."""

import copy
from datetime import timedelta
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.sessions.models import Session
from django.utils import timezone
from playwright.sync_api import Page, expect

from approvals.models import ExternalIdentity
from console.security import SIGNED_IN_AT
from operations.models import Event
from tests.support.oidc import Provider, oidc_provider

from .conftest import axe, axe_summary

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SUB = "248289761001"
PEOPLE = {
    SUB: {
        "email": "dana@example.com",
        "email_verified": True,
        "preferred_username": "dana.at.idp",
        "groups": ["finance-approvers", "everyone"],
    }
}
GROUP_MAP = {"finance-approvers": "Finance", "support-approvers": "Support"}


@pytest.fixture
def idp(live_server, settings):
    with oidc_provider(console_url=live_server.url, people=copy.deepcopy(PEOPLE)) as provider:
        for name, value in provider.settings(OIDC_GROUP_MAP=GROUP_MAP).items():
            setattr(settings, name, value)
        policy = copy.deepcopy(settings.CONTENT_SECURITY_POLICY)
        policy["DIRECTIVES"]["form-action"].append(provider.issuer)
        settings.CONTENT_SECURITY_POLICY = policy
        yield provider


def provider_sign_in(page: Page, idp: Provider) -> None:
    """From the console's sign-in page through the provider's login and consent pages."""
    page.goto("/login/")
    page.get_by_role("link", name="Sign in with Test IdP").click()
    page.wait_for_url(f"{idp.issuer}/**")
    _provider_pages(page)


def test_sign_in_through_the_provider_links_by_verified_email_and_maps_groups(
    page, idp, settings, live_server
):
    settings.OIDC_LINK_BY_VERIFIED_EMAIL = True
    dana = get_user_model().objects.create_user("dana", email="Dana@example.com")
    # A group given in the console, which the provider's claim does not manage.
    dana.groups.add(Group.objects.create(name="Reviewers"))
    Group.objects.create(name="Support")
    page.goto("/login/")
    violations = axe(page)
    assert not violations, axe_summary(violations)

    provider_sign_in(page, idp)

    page.wait_for_url(f"{live_server.url}/")
    expect(page.locator(".whoami")).to_contain_text("dana")
    link = ExternalIdentity.objects.get()
    assert (link.issuer, link.subject, link.user_id) == (idp.issuer, SUB, dana.pk)
    assert set(dana.groups.values_list("name", flat=True)) == {"Finance", "Reviewers"}
    kinds = list(Event.objects.filter(stream=f"user:{dana.pk}").values_list("kind", "data"))
    assert [kind for kind, _ in kinds] == ["identity_linked", "groups_synced", "signed_in"]
    assert kinds[0][1]["via"] == "verified_email"
    assert kinds[1][1]["added"] == ["Finance"]
    assert kinds[2][1]["via"] == "sso"
    # The session's clocks started at sign-in: SESSION_ABSOLUTE_TIMEOUT_S applies to it.
    (session,) = [s.get_decoded() for s in Session.objects.all()]
    assert session["_auth_user_id"] == str(dana.pk)
    assert session[SIGNED_IN_AT] > 0

    # Signing out ends the console's session and, through RP-initiated logout, the
    # provider's; removed from finance at the provider, dana is removed here at once at
    # the next sign-in, and the console's own group stays.
    page.get_by_role("button", name="Sign out").click()
    page.get_by_role("button", name="Yes, sign me out").click()
    page.wait_for_url(f"{live_server.url}/login/")
    page.goto("/")
    assert urlsplit(page.url).path == "/login/"
    idp.people_set({SUB: {**PEOPLE[SUB], "groups": ["everyone", "support-approvers"]}})

    provider_sign_in(page, idp)

    page.wait_for_url(f"{live_server.url}/")
    assert set(dana.groups.values_list("name", flat=True)) == {"Support", "Reviewers"}
    synced = Event.objects.filter(stream=f"user:{dana.pk}", kind="groups_synced").last()
    assert synced is not None
    assert (synced.data["added"], synced.data["removed"]) == (["Support"], ["Finance"])
    assert ExternalIdentity.objects.count() == 1


def test_an_unknown_person_is_refused_with_a_message(page, idp, live_server):
    before = get_user_model().objects.count()

    provider_sign_in(page, idp)

    page.wait_for_url(f"{live_server.url}/login/")
    expect(page.get_by_role("alert").or_(page.locator(".message"))).to_contain_text(
        "not linked to a person here"
    )
    assert get_user_model().objects.count() == before
    refusal = Event.objects.get(stream="sso", kind="sign_in_refused")
    assert (refusal.data["issuer"], refusal.data["subject"]) == (idp.issuer, SUB)
    assert not ExternalIdentity.objects.exists()


def test_first_sign_in_creates_the_person_when_allowed(page, idp, settings, live_server):
    settings.OIDC_CREATE_USERS = True

    provider_sign_in(page, idp)

    page.wait_for_url(f"{live_server.url}/")
    person = ExternalIdentity.objects.get(subject=SUB).user
    assert person.username == "dana.at.idp"
    assert not person.has_usable_password()
    assert list(person.groups.values_list("name", flat=True)) == ["Finance"]


def _refused(page: Page, live_server) -> None:
    page.wait_for_url(f"{live_server.url}/login/**")
    expect(page.locator("body")).to_contain_text("Please sign in again")
    page.goto("/")
    assert urlsplit(page.url).path == "/login/"


def _start(page: Page) -> str:
    """Start a sign-in in this browser (its session keeps the state, nonce and verifier)
    and return the provider's address it was sent to, without following it."""
    response = page.request.get("/oidc/authenticate/", max_redirects=0)
    assert response.status == 302
    return response.headers["location"]


def _with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {key: values[0] for key, values in parse_qs(parts.query).items()}
    return parts._replace(query=urlencode({**query, **changes})).geturl()


def _provider_pages(page: Page) -> None:
    page.locator("input[name=login]").fill(SUB)
    page.locator("input[name=password]").fill("anything")
    page.get_by_role("button", name="Sign-in").click()
    page.get_by_role("button", name="Continue").click()


def test_a_state_this_browser_did_not_start_is_refused(page, idp, settings, live_server):
    settings.OIDC_CREATE_USERS = True
    page.goto("/login/")
    # The provider sends back whatever state it was given: here not the one this
    # browser's session holds.
    page.goto(_with_query(_start(page), state="a-state-from-someone-else"))
    _provider_pages(page)

    _refused(page, live_server)
    assert not ExternalIdentity.objects.exists()
    refusal = Event.objects.get(stream="sso", kind="sign_in_refused")
    assert "state not found" in refusal.data["reason"]


def test_a_replayed_code_is_refused(page, idp, settings, live_server, browser):
    settings.OIDC_CREATE_USERS = True
    callbacks: list[str] = []
    page.on("request", lambda r: callbacks.append(r.url) if "/oidc/callback/" in r.url else None)
    provider_sign_in(page, idp)
    page.wait_for_url(f"{live_server.url}/")
    code = parse_qs(urlsplit(callbacks[0]).query)["code"][0]

    # Another browser starts a sign-in of its own (a fresh state, nonce and verifier) and
    # answers it with the code already used.
    other = browser.new_context(base_url=live_server.url)
    thief = other.new_page()
    thief.goto("/login/")
    state = parse_qs(urlsplit(_start(thief)).query)["state"][0]
    thief.goto(f"/oidc/callback/?{urlencode({'code': code, 'state': state})}")

    _refused(thief, live_server)
    other.close()
    refusal = Event.objects.filter(stream="sso", kind="sign_in_refused").get()
    assert refusal.data["reason"] == "HTTPError"
    assert ExternalIdentity.objects.count() == 1


def test_an_expired_id_token_is_refused(page, idp, settings, live_server):
    settings.OIDC_CREATE_USERS = True
    page.goto("/login/")
    page.get_by_role("link", name="Sign in with Test IdP").click()
    page.locator("input[name=login]").fill(SUB)
    page.locator("input[name=password]").fill("anything")
    page.get_by_role("button", name="Sign-in").click()
    # The provider issues the token now, valid for a minute; the console reads it an hour
    # later (its clock moved, the provider's not).
    with time_machine.travel(timezone.now() + timedelta(hours=1), tick=True):
        page.get_by_role("button", name="Continue").click()
        _refused(page, live_server)
    assert not ExternalIdentity.objects.exists()
    refusal = Event.objects.get(stream="sso", kind="sign_in_refused")
    assert refusal.data["reason"] == "ExpiredSignatureError"


def test_password_sign_in_is_for_superusers_only_when_so_set(page, idp, settings, live_server):
    settings.PASSWORD_LOGIN = "superusers"
    get_user_model().objects.create_user("erin", password="correct horse battery staple")
    get_user_model().objects.create_superuser("root", password="correct horse battery staple")

    def password_sign_in(username: str) -> None:
        page.goto("/login/")
        page.get_by_text("Administrators: sign in with a password").click()
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill("correct horse battery staple")
        page.get_by_role("button", name="Sign in", exact=True).click()
        page.wait_for_load_state()

    password_sign_in("erin")
    assert urlsplit(page.url).path == "/login/"
    password_sign_in("root")
    assert urlsplit(page.url).path == "/"


def test_a_person_signed_in_through_the_provider_approves_by_their_mapped_group(
    page, idp, settings, live_server
):
    """The issue's "done when": sign in through the OpenID provider, then approve. The
    right to decide comes from the provider's group claim, mapped to Finance."""
    from guardian.shortcuts import assign_perm

    from operations.models import Tool
    from tests.conftest import contract, make_runner

    settings.OIDC_LINK_BY_VERIFIED_EMAIL = True
    get_user_model().objects.create_user("dana", email="dana@example.com")
    api = make_runner()
    api.tool("send_refund", contract("irreversible", approval={"mode": "always"}))
    assign_perm(
        "operations.decide_tool",
        Group.objects.create(name="Finance"),
        Tool.objects.get(pk="send_refund"),
    )
    op = api.register(api.run(principal="user:cus_1"), "send_refund")

    provider_sign_in(page, idp)
    page.wait_for_url(f"{live_server.url}/")
    row = page.locator(f"#inbox-rows tr[data-operation='{op['id']}']")
    expect(row).to_be_visible()
    row.get_by_role("link").first.click()
    page.get_by_role("button", name="Approve", exact=True).click()
    page.wait_for_url(lambda url: "/approvals/" not in url)
    expect(page.get_by_role("status").first).to_contain_text("Approved send_refund")
    assert api.operation(op["id"])["status"] == "ready"
    decided = Event.objects.filter(stream=op["id"], kind="decision").values_list("actor", flat=True)
    assert list(decided) == ["user:dana"]
