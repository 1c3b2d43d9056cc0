"""A signed-in person's POSTs count against THROTTLE_SESSION_RATE (console.middleware,
operations/http/throttling.py); reads and signing in do not."""

import pytest
from django.test import Client

from operations.http.throttling import WindowRateThrottle
from operations.models import SavedView
from tests.approvals.conftest import person
from tests.console.conftest import client_for


@pytest.fixture
def clock(monkeypatch) -> list[float]:
    now = [1_800_000_000 + 45.0]  # 45 s into a minute
    monkeypatch.setattr(WindowRateThrottle, "timer", staticmethod(lambda: now[0]))
    return now


@pytest.fixture(params=["database", "redis"])
def shared_cache(request) -> str:
    request.getfixturevalue(f"{request.param}_cache")
    return request.param


def _save(client: Client, name: str):
    return client.post("/views/save", {"list_name": "operations", "name": name, "query": "q=x"})


def test_posts_over_the_session_rate_answer_429_and_change_nothing(
    db, settings, clock, shared_cache
):
    settings.THROTTLE_SESSION_RATE = "2/min"
    alice = person(username="alice")
    browser = client_for(alice)
    assert [_save(browser, name).status_code for name in ("one", "two")] == [302, 302]
    refused = _save(browser, "three")
    assert refused.status_code == 429
    assert refused["Retry-After"] == "15"
    page = refused.content.decode()
    assert "Too many requests" in page
    assert "Wait 15 seconds" in page
    assert sorted(SavedView.objects.filter(user=alice).values_list("name", flat=True)) == [
        "one",
        "two",
    ]
    # Reading goes on; another person's changes are theirs to count.
    assert browser.get("/operations/").status_code == 200
    bob = person(username="bob")
    assert _save(client_for(bob), "bob's").status_code == 302
    # The next minute, alice's changes are accepted again.
    clock[0] += 15
    assert _save(browser, "three").status_code == 302
    assert SavedView.objects.filter(user=alice).count() == 3


def test_signing_in_and_refused_forgeries_are_not_counted(db, settings, clock, database_cache):
    settings.THROTTLE_SESSION_RATE = "1/min"
    person(username="carol")
    browser = Client(enforce_csrf_checks=True)
    browser.get("/login/")
    signed_in = browser.post(
        "/login/",
        {
            "username": "carol",
            "password": "pw-for-tests-1",
            "csrfmiddlewaretoken": browser.cookies["csrftoken"].value,
        },
    )
    assert signed_in.status_code == 302
    # Without the CSRF token the POST is refused before it is counted...
    assert _save(browser, "forged").status_code == 403
    # ...so the one POST this minute allows is still there (the token changed at sign-in).
    browser.get("/operations/")
    token = browser.cookies["csrftoken"].value
    allowed = browser.post(
        "/views/save",
        {"list_name": "operations", "name": "mine", "query": "q=x", "csrfmiddlewaretoken": token},
    )
    assert allowed.status_code == 302
    assert list(SavedView.objects.values_list("name", flat=True)) == ["mine"]
