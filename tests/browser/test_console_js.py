"""The console's design system and console.js on a page built from base.html.

The page is rendered here from a template string that extends console/base.html and
served at /__design__/ on the live server's origin (Playwright answers the request), so
the static files come from the live server. It is served with a strict
Content-Security-Policy (no 'unsafe-inline', no 'unsafe-eval'): base.html, console.css
and console.js must work under it.
"""

import collections
import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.messages import constants
from django.contrib.messages.storage.base import Message
from django.template import engines
from django.test import RequestFactory
from django.utils import timezone
from playwright.sync_api import Page, Route, expect

from .conftest import axe, axe_summary

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)

STATUSES = [
    # operations
    "awaiting_approval", "ready", "executing", "outcome_unknown", "compensating",
    "succeeded", "rejected", "failed_permanent", "budget_exhausted", "compensated",
    "cancelled",
    # approval requests and decisions
    "pending", "approved", "expired", "revoked", "withdrawn", "approve", "reject",
    # attempts, runs, effect classes
    "failed", "unknown", "lease_expired", "superseded", "active", "read_only",
    "idempotent", "deduplicated", "compensable", "irreversible",
]  # fmt: skip

DESIGN = """{% extends "console/base.html" %}{% load console_tags %}
{% block title %}Design{% endblock %}
{% block content %}
<h1>Design check</h1>
<form class="filters" method="get" action="/__design__/">
  <label>State <select name="state"><option>any</option></select></label>
  <label>Tool <input name="tool" type="text"></label>
  <button type="submit">Filter</button>
</form>
<div class="table-wrap">
<table class="data" id="ops" data-keynav aria-keyshortcuts="j k Enter"
       aria-describedby="ops-keys">
  <caption>Operations</caption>
  <thead><tr><th scope="col">Operation</th><th scope="col">State</th>
    <th scope="col">Created</th><th scope="col">Key</th></tr></thead>
  <tbody>
  {% for status in statuses %}
    <tr data-key="op_{{ forloop.counter }}">
      <td><a href="/__design__/op/{{ forloop.counter }}">op_{{ forloop.counter }}</a></td>
      <td>{{ status|badge }}</td>
      <td>{{ created|reltime }}</td>
      <td class="mono">k-{{ forloop.counter }}-0O1lI</td>
    </tr>
  {% endfor %}
  </tbody>
</table>
</div>
{% with keynav_for="ops" %}{% include "console/_shared.html#keynav-help" %}{% endwith %}
<h2>Arguments</h2>
<pre class="literal">{{ runner_text|reveal }}</pre>
<dl class="facts">
  <dt>Intent hash</dt><dd class="mono">{{ intent_hash }}</dd>
  <dt>Expires</dt><dd id="expires">{{ expires|reltime }}</dd>
</dl>
<div class="field"><label for="comment">Comment</label><textarea id="comment"></textarea></div>
<div class="actions">
  <button type="button" class="button-primary">Approve</button>
  <button type="button" class="button-danger">Reject</button>
  <button type="button">Later</button>
  <span class="htmx-indicator">Saving…</span>
</div>
<p>Polls: <span id="fast" hx-get="/__design__/poll/fast" hx-trigger="every 200ms, refresh">0</span>
   <span id="slow" hx-get="/__design__/poll/slow" hx-trigger="every 60s, refresh">0</span></p>
{% endblock %}
"""


class Site:
    """The /__design__/ pages, answered by Playwright on the live server's origin."""

    def __init__(self, page: Page, live_server) -> None:
        self.polls: collections.Counter[str] = collections.Counter()
        self.csp_violations: list[str] = []
        self.errors: list[str] = []
        now = timezone.now()
        request = RequestFactory().get("/__design__/")
        request.user = get_user_model()(username="dana", is_staff=True)
        self.html = (
            engines["django"]
            .from_string(DESIGN)
            .render(
                {
                    "statuses": STATUSES,
                    "created": now - timedelta(seconds=185),
                    "expires": now + timedelta(hours=2, seconds=30),
                    "runner_text": 'refund "pay_1"\u202e 005 <b>\u200b\n\tnext line',
                    "search_url": "console:inbox",
                    "intent_hash": "9f86d081884c7d659a2feaa0c55ad015" * 2,
                    "messages": [
                        Message(constants.SUCCESS, "Approved op_1."),
                        Message(constants.ERROR, "op_2 changed since you opened it."),
                    ],
                },
                request,
            )
        )
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.route(f"{live_server.url}/__design__/**", self._answer)

    def _console(self, message) -> None:
        if "Content Security Policy" in message.text:
            self.csp_violations.append(message.text)
        elif message.type == "error":
            self.errors.append(message.text)

    def _answer(self, route: Route) -> None:
        path = route.request.url.split("/__design__/", 1)[1].split("?", 1)[0]
        if path.startswith("poll/"):
            name = path.removeprefix("poll/")
            self.polls[name] += 1
            route.fulfill(body=str(self.polls[name]), content_type="text/html")
        elif path.startswith("op/"):
            body = f"<!doctype html><title>op</title><h1>Operation {path[3:]}</h1>"
            route.fulfill(body=body, content_type="text/html")
        else:
            route.fulfill(
                body=self.html, content_type="text/html", headers={"Content-Security-Policy": CSP}
            )


@pytest.fixture
def site(page, live_server) -> Site:
    return Site(page, live_server)


def set_hidden(page: Page, hidden: bool) -> None:
    page.evaluate(
        """hidden => {
            Object.defineProperty(document, "hidden", {configurable: true, get: () => hidden});
            document.dispatchEvent(new Event("visibilitychange"));
        }""",
        hidden,
    )


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_design_is_accessible_in_both_themes_under_a_strict_csp(page, site, scheme):
    page.emulate_media(color_scheme=scheme)
    page.goto("/__design__/")
    expect(page.locator("#fast")).not_to_have_text("0")  # htmx runs

    violations = axe(page)
    assert not violations, axe_summary(violations)
    assert not site.csp_violations
    assert not site.errors

    # Badges: one class per state, underscores shown as spaces.
    badge = page.locator(".badge-awaiting_approval")
    expect(badge).to_have_text("awaiting approval")
    # Messages: errors are alerts, the rest status.
    expect(page.get_by_role("alert")).to_have_text("op_2 changed since you opened it.")
    expect(page.get_by_role("status")).to_have_text("Approved op_1.")
    # The header search box is there because the page set search_url.
    expect(page.get_by_role("search").get_by_label("Search")).to_be_visible()


def test_reveal_shows_invisible_characters_as_markers(page, site):
    page.goto("/__design__/")
    literal = page.locator("pre.literal")
    expect(literal).to_contain_text('pay_1"\u27e8U+202E\u27e9 005 <b>\u27e8U+200B\u27e9')
    expect(literal.locator(".visible-controls").first).to_have_attribute(
        "title", "U+202E RIGHT-TO-LEFT OVERRIDE"
    )
    assert literal.locator("b").count() == 0
    # No override character reached the page, so the digits read left to right.
    assert "\u202e" not in page.content()


def test_relative_times_keep_the_absolute_time_in_the_title(page, site):
    page.goto("/__design__/")
    created = page.locator("#ops tbody time").first
    expect(created).to_have_text("3 min ago")
    expect(created).to_have_attribute("title", re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$"))
    expect(created).to_have_attribute("data-past", "")
    expires = page.locator("#expires time")
    expect(expires).to_have_text("in 2 h")
    assert expires.get_attribute("data-past") is None


def test_j_k_and_enter_walk_the_list(page, site):
    page.goto("/__design__/")
    rows = page.locator("#ops tbody tr")

    page.keyboard.press("j")
    expect(rows.nth(0)).to_have_class(re.compile(r"\bis-current\b"))
    expect(rows.nth(0)).to_have_attribute("aria-current", "true")
    expect(rows.nth(0).get_by_role("link")).to_be_focused()

    page.keyboard.press("j")
    page.keyboard.press("j")
    page.keyboard.press("k")
    expect(rows.nth(1)).to_have_class(re.compile(r"\bis-current\b"))
    expect(page.locator("#ops tr.is-current")).to_have_count(1)

    # Typing in a field does not move the list.
    page.get_by_label("Comment").fill("")
    page.get_by_label("Comment").press("j")
    expect(rows.nth(1)).to_have_class(re.compile(r"\bis-current\b"))
    expect(page.get_by_label("Comment")).to_have_value("j")

    # Enter opens the current row's link, also when the focus left it.
    page.locator("h1").click()
    page.keyboard.press("Enter")
    page.wait_for_url("**/__design__/op/2")
    expect(page.get_by_role("heading", level=1)).to_have_text("Operation 2")


def test_slash_focuses_the_search_box(page, site):
    page.goto("/__design__/")
    page.locator("h1").click()
    page.keyboard.press("/")
    expect(page.get_by_role("search").get_by_label("Search")).to_be_focused()


def test_polling_pauses_while_the_tab_is_hidden(page, site):
    page.goto("/__design__/")
    expect(page.locator("#fast")).not_to_have_text("0")
    assert site.polls["slow"] == 0

    set_hidden(page, True)
    page.wait_for_timeout(300)  # a request in flight may still land
    before = site.polls["fast"]
    page.wait_for_timeout(1200)  # six ticks of "every 200ms"
    assert site.polls["fast"] == before
    assert site.polls["slow"] == 0

    set_hidden(page, False)
    # Visible again: "refresh" updates the slow region at once, not in 60 s.
    expect(page.locator("#slow")).to_have_text("1")
    expect(page.locator("#fast")).not_to_have_text(str(before))
    assert not site.errors
