"""Browser tests: Playwright driving Debian's chromium against pytest-django's live server.

Needs ``/usr/bin/chromium`` (``apt-get install chromium``) and axe-core from npm
(``npm ci`` at the repository root, see package.json). Every test here is marked
``@pytest.mark.browser`` and uses ``@pytest.mark.django_db(transaction=True)``: the live
server runs in another thread with its own database connection, so it sees only
committed data.
"""

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Playwright's sync API runs an asyncio event loop in the main thread, and because the
# `browser` fixture is session-scoped that loop stays "running" (asyncio's running loop is
# per thread, shared by Playwright's greenlets) until the session ends, so also during
# every test collected after the browser tests. Django sees the running loop and refuses
# ORM calls from that thread (SynchronousOnlyOperation), e.g. a test creating a user. No
# ORM call here runs inside a coroutine; they only share the thread with Playwright's
# idle loop, so switching the check off is safe. It is set when this conftest is
# imported, i.e. for the whole session whenever browser tests are collected.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import Browser, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-gpu",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
AXE_JS = Path(__file__).resolve().parents[2] / "node_modules" / "axe-core" / "axe.min.js"

# Violations at these impacts fail a test; "minor" and "moderate" are reported by
# axe() callers that want them, not enforced.
BLOCKING_IMPACTS = frozenset({"serious", "critical"})


# Per module, not per session: Playwright's sync API runs an asyncio loop on this thread
# for as long as it is started, and every later test of the process that calls
# asyncio.run() (the async client, the MCP and agent guards) would find a loop running.
# pytest ends the fixture when the next test is another module's.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests drive Debian's chromium "
            "(apt-get install -y chromium).",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser, live_server) -> Iterator[Page]:
    context = browser.new_context(base_url=live_server.url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    yield page
    context.close()


def login(page: Page, user: Any, password: str) -> None:
    """Sign in through the login form as ``user`` (a User or a username)."""
    username = user if isinstance(user, str) else user.get_username()
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()


def signed_in_page(browser: Browser, live_server: Any, user: Any, password: str) -> Page:
    """A second person's page: a browser context of its own, signed in as ``user``."""
    context = browser.new_context(base_url=live_server.url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    login(page, user, password)
    return page


def axe(page: Page, impacts: frozenset[str] = BLOCKING_IMPACTS) -> list[dict[str, Any]]:
    """Run axe-core on the current page and return violations of the given impacts.

    Each violation is axe's dict (id, impact, help, nodes...). Assert on a compact
    summary, e.g. ``assert not violations, axe_summary(violations)``.
    """
    if not AXE_JS.is_file():
        pytest.fail(
            f"{AXE_JS} is missing: run `npm ci` at the repository root to install "
            "axe-core (package.json) before the browser tests.",
            pytrace=False,
        )
    # Evaluated through the DevTools protocol, not added as a <script>: an inline script
    # would be blocked by the console's Content-Security-Policy, and fetching it would be
    # a request to another origin.
    if not page.evaluate("typeof window.axe === 'object'"):
        page.evaluate(AXE_JS.read_text(encoding="utf-8"))
    results = page.evaluate(
        """async () => await axe.run(document, {
            resultTypes: ["violations"],
            runOnly: {type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa",
                                            "wcag22aa", "best-practice"]},
        })"""
    )
    return [v for v in results["violations"] if v.get("impact") in impacts]


def axe_summary(violations: list[dict[str, Any]]) -> str:
    lines = []
    for violation in violations:
        lines.append(f"{violation['impact']}: {violation['id']}: {violation['help']}")
        for node in violation["nodes"][:5]:
            lines.append(f"    {' '.join(node['target'])}: {node.get('failureSummary', '')}")
    return "\n".join(lines)
