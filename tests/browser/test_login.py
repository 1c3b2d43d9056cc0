"""Signing in through the browser: the form works, the inbox is accessible, and the
console loads nothing from another origin (no CDN)."""

import re
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from .conftest import axe, axe_summary, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}


def test_sign_in_lands_on_an_accessible_inbox(page):
    user = get_user_model().objects.create_user("alice", password=PASSWORD)
    origins: set[str] = set()
    page.on("request", lambda request: origins.add(request.url))

    page.goto("/login/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Sign in")
    # Anonymous visitors get no navigation and no sign-out button.
    expect(page.get_by_role("navigation")).to_have_count(0)
    violations = axe(page)
    assert not violations, axe_summary(violations)

    login(page, user, PASSWORD)

    assert urlsplit(page.url).path == "/"
    expect(page.get_by_role("heading", level=1)).to_have_text(re.compile(r"^\s*Inbox\b"))
    expect(page.get_by_role("link", name="Inbox")).to_have_attribute("aria-current", "page")
    expect(page.locator(".whoami")).to_contain_text("alice")
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    # htmx and console.js came from our own static files and ran.
    assert page.evaluate("typeof window.htmx") == "object"

    violations = axe(page)
    assert not violations, axe_summary(violations)

    foreign = {
        url
        for url in origins
        if urlsplit(url).scheme not in {"data", "blob", "about"}
        and urlsplit(url).hostname not in LOCAL_HOSTS
    }
    assert not foreign, f"requests to other origins: {sorted(foreign)}"
    assert any(url.endswith("/static/css/console.css") for url in origins)
    assert any("/static/django_htmx/htmx-2" in url for url in origins)
    assert any(url.endswith("/static/js/console.js") for url in origins)


def test_wrong_password_is_announced(page):
    get_user_model().objects.create_user("bob", password=PASSWORD)

    login(page, "bob", "not the password")

    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("Please enter a correct username and password")
    assert urlsplit(page.url).path == "/login/"


def test_sign_out_returns_to_the_login_page(page):
    user = get_user_model().objects.create_user("carol", password=PASSWORD)
    login(page, user, PASSWORD)

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/login/")
    page.goto("/")
    assert urlsplit(page.url).path == "/login/"
