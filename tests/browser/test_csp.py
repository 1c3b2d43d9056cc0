"""In a real browser, no page of the console, the admin or the API docs trips the
Content-Security-Policy, and the Swagger UI still renders under it."""

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"

VIOLATION_WATCH = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolations.push(event.violatedDirective + " " + (event.blockedURI || "inline"));
});
"""


def test_no_page_violates_the_policy(page, live_server):
    get_user_model().objects.create_superuser("root", password=PASSWORD)
    messages: list[str] = []
    page.on("console", lambda message: messages.append(message.text))
    # Evaluated by the browser before each document's own scripts, outside the policy.
    page.context.add_init_script(VIOLATION_WATCH)

    login(page, "root", PASSWORD)
    seen = []
    for path in ("/", "/reconciliation/", "/dashboard/", "/runners/", "/account/", "/admin/"):
        page.goto(path)
        page.wait_for_load_state("networkidle")
        seen.append((path, page.evaluate("window.__cspViolations")))

    page.goto("/api/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Effectgate runner API")
    expect(page.locator(".opblock-tag-section").first).to_be_visible()
    seen.append(("/api/docs/", page.evaluate("window.__cspViolations")))

    assert all(not violations for _, violations in seen), seen
    assert not [text for text in messages if "Content Security Policy" in text], messages
