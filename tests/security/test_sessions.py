"""Console sessions: cookies, rotation at sign-in, idle and absolute timeouts, sign-in
throttling, and ending the sessions of a deactivated person."""

import time

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.test import Client

from console import security
from operations.models import Event

PASSWORD = "correct horse battery staple"


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice", password=PASSWORD)


def _sign_in(client: Client, username: str = "alice", password: str = PASSWORD, **extra):
    return client.post("/login/", {"username": username, "password": password}, **extra)


def _shift_clocks(client: Client, *, signed_in_ago: float, seen_ago: float) -> None:
    session = client.session
    now = time.time()
    session[security.SIGNED_IN_AT] = int(now - signed_in_ago)
    session[security.SEEN_AT] = int(now - seen_ago)
    session.save()


def test_cookies_are_httponly_samesite_and_secure_off_debug(alice):
    assert not settings.DEBUG
    client = Client()
    client.get("/login/")
    response = _sign_in(client)
    assert response.status_code == 302
    session_cookie = response.cookies[settings.SESSION_COOKIE_NAME]
    assert session_cookie["httponly"]
    assert session_cookie["secure"]
    assert session_cookie["samesite"] == "Lax"
    csrf = client.cookies[settings.CSRF_COOKIE_NAME]
    assert csrf["secure"]
    assert csrf["httponly"]
    assert settings.SESSION_COOKIE_AGE == settings.SESSION_ABSOLUTE_TIMEOUT_S


def test_signing_in_rotates_the_session_key(alice):
    client = Client()
    client.get("/login/")
    session = client.session
    session["before"] = "anonymous"
    session.save()
    anonymous_key = session.session_key
    assert _sign_in(client).status_code == 302
    signed_in_key = client.cookies[settings.SESSION_COOKIE_NAME].value
    assert signed_in_key != anonymous_key
    assert not Session.objects.filter(session_key=anonymous_key).exists()
    assert Session.objects.get(session_key=signed_in_key).get_decoded()["_auth_user_id"] == str(
        alice.pk
    )
    # A fixated key (an attacker's cookie planted before sign-in) is worth nothing now.
    fixated = Client()
    fixated.cookies[settings.SESSION_COOKIE_NAME] = anonymous_key
    assert fixated.get("/").status_code == 302


def test_sign_in_starts_both_clocks_and_is_audited(alice):
    client = Client()
    _sign_in(client, REMOTE_ADDR="192.0.2.7")
    session = client.session
    assert abs(session[security.SIGNED_IN_AT] - time.time()) < 5
    assert session[security.SEEN_AT] == session[security.SIGNED_IN_AT]
    event = Event.objects.get(stream=f"user:{alice.pk}", kind="signed_in")
    assert event.data == {"ip": "192.0.2.7"}


def test_an_idle_session_is_signed_out(alice, settings):
    settings.SESSION_IDLE_TIMEOUT_S = 1800
    client = Client()
    _sign_in(client)
    _shift_clocks(client, signed_in_ago=1900, seen_ago=1801)
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=/")
    assert "_auth_user_id" not in client.session
    assert Event.objects.filter(stream=f"user:{alice.pk}", kind="signed_out").count() == 1
    page = client.get(response["Location"])
    assert "signed out after a period of inactivity" in page.content.decode()


def test_activity_keeps_a_session_alive(alice, settings):
    settings.SESSION_IDLE_TIMEOUT_S = 1800
    client = Client()
    _sign_in(client)
    _shift_clocks(client, signed_in_ago=3000, seen_ago=1700)
    assert client.get("/").status_code == 200
    assert time.time() - client.session[security.SEEN_AT] < 5
    _shift_clocks(client, signed_in_ago=3000, seen_ago=1700)
    assert client.get("/").status_code == 200


def test_background_polls_are_not_activity(alice, settings):
    settings.SESSION_IDLE_TIMEOUT_S = 1800
    client = Client()
    _sign_in(client)
    _shift_clocks(client, signed_in_ago=1000, seen_ago=1000)
    seen = client.session[security.SEEN_AT]
    response = client.get("/?partial=1", HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert client.session[security.SEEN_AT] == seen


def test_an_idle_htmx_poll_gets_a_client_redirect_to_sign_in(alice):
    client = Client()
    _sign_in(client)
    _shift_clocks(client, signed_in_ago=4000, seen_ago=4000)
    response = client.get(
        "/?partial=1", HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL="http://testserver/?tool=t"
    )
    assert response.status_code == 200
    assert response["HX-Redirect"].startswith("/login/?next=")
    assert "tool%3Dt" in response["HX-Redirect"]
    assert "_auth_user_id" not in client.session


def test_the_absolute_timeout_ends_even_a_busy_session(alice, settings):
    settings.SESSION_ABSOLUTE_TIMEOUT_S = 12 * 3600
    client = Client()
    _sign_in(client)
    _shift_clocks(client, signed_in_ago=12 * 3600 + 1, seen_ago=10)
    response = client.get("/")
    assert response.status_code == 302
    assert "_auth_user_id" not in client.session


def test_a_session_from_before_the_clocks_starts_them(alice):
    client = Client()
    client.force_login(alice)
    session = client.session
    del session[security.SIGNED_IN_AT]
    session.save()
    assert client.get("/").status_code == 200
    assert security.SIGNED_IN_AT in client.session


# --- sign-in throttling (django-axes) -------------------------------------------------


def test_sign_in_is_locked_after_the_failure_limit(alice, settings):
    limit = settings.AXES_FAILURE_LIMIT
    client = Client()
    for _ in range(limit - 1):
        response = _sign_in(client, password="wrong")
        assert response.status_code == 200
        assert "Please enter a correct username and password" in response.content.decode()
    locked = _sign_in(client, password="wrong")
    assert locked.status_code == 429
    assert "Sign-in locked" in locked.content.decode()
    # Even the right password is refused while locked: guessing gains nothing.
    assert _sign_in(client).status_code == 429
    assert "_auth_user_id" not in client.session
    # Another person, or the same person from another address, is not locked out.
    get_user_model().objects.create_user("bob", password=PASSWORD)
    assert _sign_in(Client(), "bob").status_code == 302
    assert _sign_in(Client(), REMOTE_ADDR="198.51.100.9").status_code == 302


def test_a_success_resets_the_failure_count(alice, settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        _sign_in(client, password="wrong")
    assert _sign_in(client).status_code == 302
    client.post("/logout/")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert _sign_in(client, password="wrong").status_code == 200
    assert _sign_in(client).status_code == 302


def test_the_admin_sign_in_is_throttled_too(alice, settings):
    client = Client()
    for _ in range(settings.AXES_FAILURE_LIMIT):
        client.post("/admin/login/", {"username": "alice", "password": "wrong"})
    assert _sign_in(client).status_code == 429


def test_the_client_address_behind_trusted_proxies(rf, settings):
    request = rf.get("/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="1.2.3.4, 203.0.113.5")
    settings.TRUSTED_PROXY_COUNT = 0
    assert security.client_ip(request) == "10.0.0.2"
    settings.TRUSTED_PROXY_COUNT = 1
    # The right-most entry was added by our proxy; anything left of it the client wrote.
    assert security.client_ip(request) == "203.0.113.5"
    settings.TRUSTED_PROXY_COUNT = 3
    assert security.client_ip(request) == "10.0.0.2"


# --- deactivation ----------------------------------------------------------------------


def test_deactivating_a_person_ends_their_sessions(alice):
    laptop, phone = Client(), Client()
    _sign_in(laptop)
    _sign_in(phone, REMOTE_ADDR="192.0.2.8")
    bob = get_user_model().objects.create_user("bob", password=PASSWORD)
    other = Client()
    _sign_in(other, "bob")
    assert Session.objects.count() == 3

    alice.is_active = False
    alice.save()

    assert Session.objects.count() == 1
    for client in (laptop, phone):
        response = client.get("/")
        assert response.status_code == 302
        assert response["Location"].startswith("/login/")
    assert other.get("/").status_code == 200
    event = Event.objects.get(stream=f"user:{alice.pk}", kind="sessions_ended")
    assert event.data == {"sessions": 2}
    assert bob.is_active


def test_deactivating_through_the_admin_ends_sessions(alice, superuser_client):
    victim = Client()
    _sign_in(victim)
    response = superuser_client.post(
        f"/admin/auth/user/{alice.pk}/change/",
        {
            "username": "alice",
            "is_active": "",
            "date_joined_0": "2025-01-01",
            "date_joined_1": "00:00:00",
            "initial-date_joined_0": "2025-01-01",
            "initial-date_joined_1": "00:00:00",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    alice.refresh_from_db()
    assert not alice.is_active
    assert victim.get("/").status_code == 302


def test_saving_an_active_person_keeps_their_sessions(alice):
    client = Client()
    _sign_in(client)
    alice.first_name = "Alice"
    alice.save()
    assert client.get("/").status_code == 200


@pytest.fixture
def superuser_client(db):
    user = get_user_model().objects.create_superuser("root", password=PASSWORD)
    client = Client()
    client.force_login(user)
    return client
