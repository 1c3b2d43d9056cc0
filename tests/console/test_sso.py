"""Single sign-on's pieces without a provider: its settings, the mapped groups, password
sign-in for superusers only, and everything off while OIDC_ISSUER is unset. The redirect
flow itself runs against a real provider in tests/browser/test_single_sign_on.py."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ImproperlyConfigured
from django.test import Client

from console import settings as console_settings
from console import sso
from operations.models import Event

PASSWORD = "correct horse battery staple"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        (
            "finance-approvers=Finance, it = Support",
            {"finance-approvers": "Finance", "it": "Support"},
        ),
        ('{"cn=finance,ou=groups": "Finance"}', {"cn=finance,ou=groups": "Finance"}),
    ],
)
def test_the_group_map_reads_pairs_or_json(text, expected):
    assert console_settings._group_map(text) == expected


@pytest.mark.parametrize("text", ["Finance", "a=", '["Finance"]', '{"a": 1}'])
def test_a_group_map_that_is_no_map_is_refused(text):
    with pytest.raises(ImproperlyConfigured):
        console_settings._group_map(text)


@pytest.mark.parametrize(
    ("issuer", "allowed"),
    [
        ("https://login.example.com/realms/acme", True),
        ("http://127.0.0.1:9000", True),
        ("http://[::1]:9000", True),
        ("http://localhost:9000", True),
        ("http://login.example.com", False),
        ("http://10.0.0.5", False),
        ("ftp://login.example.com", False),
    ],
)
def test_the_issuer_is_https_or_loopback(issuer, allowed):
    assert console_settings._oidc_issuer_allowed(issuer) is allowed


@pytest.mark.django_db
def test_group_sync_touches_only_the_mapped_groups(settings):
    settings.OIDC_GROUPS_CLAIM = "roles"
    settings.OIDC_GROUP_MAP = {"fin": "Finance", "sup": "Support"}
    person = get_user_model().objects.create_user("dana")
    person.groups.add(Group.objects.create(name="Support"), Group.objects.create(name="Reviewers"))

    changed = sso.groups_sync(user=person, claims={"roles": ["fin", "other"], "groups": ["sup"]})

    assert changed == {"added": ["Finance"], "removed": ["Support"]}
    assert set(person.groups.values_list("name", flat=True)) == {"Finance", "Reviewers"}


@pytest.mark.django_db
def test_a_claim_that_is_no_list_removes_the_mapped_groups(settings):
    settings.OIDC_GROUP_MAP = {"fin": "Finance"}
    person = get_user_model().objects.create_user("dana")
    person.groups.add(Group.objects.create(name="Finance"))

    assert sso.groups_sync(user=person, claims={"groups": {"fin": True}})["removed"] == ["Finance"]
    assert not person.groups.exists()


@pytest.mark.django_db
def test_password_sign_in_of_a_non_superuser_is_refused_when_superusers_only(client, settings):
    settings.PASSWORD_LOGIN = "superusers"
    erin = get_user_model().objects.create_user("erin", password=PASSWORD)
    get_user_model().objects.create_superuser("root", password=PASSWORD)

    response = client.post("/login/", {"username": "erin", "password": PASSWORD})
    assert response.status_code == 200
    assert "_auth_user_id" not in client.session
    assert b"Password sign-in is for superusers only" in response.content
    assert not Event.objects.filter(stream=f"user:{erin.pk}", kind="signed_in").exists()

    response = client.post("/login/", {"username": "root", "password": PASSWORD})
    assert response.status_code == 302
    assert client.session["_auth_user_id"]


@pytest.mark.django_db
def test_without_an_issuer_there_is_no_sso_button_and_no_sso_pages(client):
    response = client.get("/login/")
    assert b"Sign in with" not in response.content
    assert b"Administrators:" not in response.content
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404


@pytest.mark.django_db
def test_a_provider_that_cannot_be_reached_is_said_so_on_the_sign_in_page(client, settings):
    from tests.support.net import free_port

    settings.OIDC_ISSUER = f"http://127.0.0.1:{free_port()}"
    settings.OIDC_TIMEOUT_S = 2

    response = client.get("/oidc/authenticate/", follow=True)

    assert response.redirect_chain == [("/login/", 302)]
    assert b"The identity provider cannot be reached" in response.content
    assert "oidc_states" not in client.session


@pytest.mark.django_db
def test_an_administrators_person_is_never_linked_by_email(settings):
    """Whoever holds an administrator's address at the provider must not become that
    administrator here (console/sso.py, _identity_new)."""
    settings.OIDC_LINK_BY_VERIFIED_EMAIL = True
    get_user_model().objects.create_superuser("root", email="root@example.com", password=PASSWORD)
    claims = {"sub": "s-1", "email": "root@example.com", "email_verified": True}
    with pytest.raises(sso.SignInRefused, match="never linked by email"):
        sso._identity_new(issuer="https://idp.example", subject="s-1", claims=claims)


@pytest.mark.django_db
def test_a_created_person_keeps_only_a_verified_email(settings):
    settings.OIDC_CREATE_USERS = True
    unverified = {"sub": "s-2", "email": "eve@example.com", "email_verified": "true"}
    person, via = sso._identity_new(issuer="https://idp.example", subject="s-2", claims=unverified)
    assert (via, person.email) == ("created", "")
    verified = {"sub": "s-3", "email": "ann@example.com", "email_verified": True}
    person, _ = sso._identity_new(issuer="https://idp.example", subject="s-3", claims=verified)
    assert person.email == "ann@example.com"


@pytest.mark.django_db
def test_a_callback_no_sign_in_started_writes_nothing_and_signs_nobody_out(client, settings):
    settings.OIDC_ISSUER = "http://127.0.0.1:9"
    person = get_user_model().objects.create_user("viv", password=PASSWORD)
    client.force_login(person)
    before = Event.objects.count()
    answer = client.get("/oidc/callback/", {"error": "access_denied", "state": "x"})
    assert answer.status_code == 302
    assert Event.objects.count() == before
    assert client.get("/account/").status_code == 200  # still signed in


class _Discovery(BaseHTTPRequestHandler):
    """A provider's discovery document; ``body`` is what it answers with."""

    body = b"{}"
    paths: list = []

    def do_GET(self):
        self.paths.append(self.path)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def _serve_discovery(body: bytes):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discovery)
    _Discovery.body, _Discovery.paths = body, []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_an_issuer_that_ends_in_a_slash_is_kept_exactly(settings):
    """Auth0's issuer is "https://tenant.auth0.com/": its tokens' iss ends in "/"."""
    server = _serve_discovery(b"")
    issuer = f"http://127.0.0.1:{server.server_port}/tenant/"
    _Discovery.body = json.dumps({"issuer": issuer, "jwks_uri": issuer + "jwks"}).encode()
    settings.OIDC_ISSUER = issuer
    sso._discovered.clear()
    try:
        assert sso.discovery()["issuer"] == issuer
    finally:
        server.shutdown()
        sso._discovered.clear()
    assert _Discovery.paths == ["/tenant/.well-known/openid-configuration"]


def test_a_discovery_document_too_large_is_refused_unread(settings):
    server = _serve_discovery(b" " * (sso.MAX_DISCOVERY_BYTES + 1) + b"{}")
    settings.OIDC_ISSUER = f"http://127.0.0.1:{server.server_port}"
    sso._discovered.clear()
    try:
        with pytest.raises(ImproperlyConfigured, match="larger than"):
            sso.discovery()
    finally:
        server.shutdown()
        sso._discovered.clear()


@pytest.mark.django_db
def test_a_password_session_from_before_superusers_only_ends_at_its_next_request(client, settings):
    erin = get_user_model().objects.create_user("erin", password=PASSWORD)
    root = get_user_model().objects.create_superuser("root", password=PASSWORD)
    assert client.post("/login/", {"username": "erin", "password": PASSWORD}).status_code == 302
    assert client.get("/").status_code == 200
    settings.PASSWORD_LOGIN = "superusers"
    response = client.get("/", follow=True)
    assert response.redirect_chain[-1][0].startswith("/login/")
    assert b"Password sign-in is now for superusers only" in response.content
    assert "_auth_user_id" not in client.session
    # A superuser's password session goes on; so does a session from single sign-on.
    other = Client()
    assert other.post("/login/", {"username": "root", "password": PASSWORD}).status_code == 302
    assert other.get("/").status_code == 200
    sso_client = Client()
    sso_client.force_login(erin, backend="console.sso.OIDCBackend")
    assert sso_client.get("/").status_code == 200
    assert root.is_superuser


@pytest.mark.django_db(transaction=True)
def test_two_first_sign_ins_of_one_account_at_once_make_one_person(settings):
    """Real concurrent sign-ins on the database: the second meets the first's link and
    signs in through it, and no second person is left behind."""
    from django.db import connection
    from django.test import RequestFactory

    if connection.vendor != "postgresql":
        pytest.skip("concurrency is proven on PostgreSQL (SQLite serializes writers)")
    settings.OIDC_ISSUER = "https://login.example.com"
    settings.OIDC_CREATE_USERS = True
    claims = {
        "sub": "race-1",
        "email": "ria@example.com",
        "email_verified": True,
        "preferred_username": "ria",
    }
    barrier = threading.Barrier(4)
    people, failures = [], []

    def sign_in():
        request = RequestFactory().get("/oidc/callback/")
        barrier.wait()
        try:
            people.append(
                sso.identity_sign_in(request=request, issuer=settings.OIDC_ISSUER, claims=claims)
            )
        except Exception as exc:
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=sign_in) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert len({person.pk for person in people}) == 1
    assert get_user_model().objects.filter(email="ria@example.com").count() == 1
    from approvals.models import ExternalIdentity

    assert ExternalIdentity.objects.filter(subject="race-1").count() == 1


@pytest.mark.django_db
def test_an_operator_links_an_administrator_to_their_provider_account(settings):
    from django.core.management import CommandError, call_command

    from approvals.models import ExternalIdentity

    settings.OIDC_ISSUER = "https://login.example.com"
    root = get_user_model().objects.create_superuser("root", password=PASSWORD)
    call_command("sso", "link", "root", "sub-root")
    link = ExternalIdentity.objects.get(user=root)
    assert (link.issuer, link.subject) == ("https://login.example.com", "sub-root")
    event = Event.objects.get(stream=f"user:{root.pk}", kind="identity_linked")
    assert event.data["via"] == "operator"
    with pytest.raises(CommandError, match="linked to another account already"):
        call_command("sso", "link", "root", "sub-other")
    get_user_model().objects.create_user("erin", password=PASSWORD)
    with pytest.raises(CommandError, match="linked already"):
        call_command("sso", "link", "erin", "sub-root")
