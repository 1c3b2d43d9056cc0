"""People's policies in a real browser against a live server: one person writes a
forbid in the editor (Cedar refuses a wrong text, then says what the right one does),
saves it and shadows it but cannot activate it; a second person reads the diff,
simulates it over the registrations so far and activates it; the runner's next
registration is refused; the second person retires it."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from playwright.sync_api import expect

from operations.models import Policy
from operations.services import policies
from tests.conftest import contract, make_runner

from .conftest import axe, axe_summary, login, signed_in_page

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"
WRONG = """@id("no-huge")
@message("Nobody refunds more than 5000.00")
forbid(principal, action == Action::"register", resource)
when { context.arguments.amount_cent > 500000 };"""
RIGHT = """@id("no-huge")
@message("Nobody refunds more than 5000.00")
forbid(principal, action == Action::"register", resource)
when { context.arguments has amount_cents && context.arguments.amount_cents > 500000 };"""


@pytest.fixture(autouse=True)
def _fresh_policies():
    policies.forget()
    yield
    policies.forget()


def _steward(name: str):
    user = get_user_model().objects.create_user(name, password=PASSWORD)
    user.user_permissions.add(Permission.objects.get(codename="manage_policies"))
    return user


def test_write_shadow_simulate_and_activate_with_four_eyes_then_retire(page, browser, live_server):
    api = make_runner()
    api.tool("send_refund", contract("irreversible", approval={"mode": "never"}))
    run = api.run("user:alice")
    ann, bob = _steward("ann"), _steward("bob")
    # Before any policy: one registration the forbid would refuse, one it would not.
    huge = api.register(run, "send_refund", {"payment_id": "p0", "amount_cents": 700000})
    api.register(run, "send_refund", {"payment_id": "small", "amount_cents": 500})

    # Ann writes the policy: Cedar refuses a name the tool does not have, then says
    # what the corrected text does.
    login(page, ann, PASSWORD)
    page.get_by_role("link", name="Policies").click()
    page.get_by_role("link", name="Write a policy").click()
    text = page.get_by_label("Policy text")
    text.fill(WRONG)
    page.get_by_role("button", name="Validate").click()
    answer = page.locator("#validation")
    expect(answer).to_contain_text("Cedar refuses the policy")
    expect(answer).to_contain_text("for tool send_refund: attribute `arguments.amount_cent`")
    text.fill(RIGHT)
    page.get_by_role("button", name="Validate").click()
    expect(answer).to_contain_text("valid: forbid, applies to every tool")
    assert not Policy.objects.exists()
    violations = axe(page)
    assert not violations, axe_summary(violations)
    page.get_by_role("button", name="Save as draft").click()
    page.wait_for_url(re.compile(r"/policies/no-huge/$"))
    expect(page.get_by_role("heading", level=1)).to_contain_text("draft")

    # She shadows it; she may not activate what she wrote, and the page says why.
    page.get_by_role("button", name="Shadow v1").click()
    expect(page.get_by_role("status").first).to_contain_text("Version 1 of no-huge is in shadow")
    expect(page.get_by_role("heading", level=1)).to_contain_text("shadow")
    expect(page.get_by_role("button", name="Activate v1")).to_be_disabled()
    expect(page.locator("#activate-refusal")).to_contain_text(
        "You wrote version 1 of no-huge; another person who manages policies must activate it."
    )
    violations = axe(page)
    assert not violations, axe_summary(violations)
    # In shadow it enforces nothing.
    assert api.register(run, "send_refund", {"payment_id": "p1", "amount_cents": 600000})[
        "status"
    ] in ("ready", "executing")

    # Bob reads what activating changes and activates it.
    other = signed_in_page(browser, live_server, bob, PASSWORD)
    other.get_by_role("link", name="Policies").click()
    other.get_by_role("link", name="no-huge").click()
    diff = other.locator("#diff")
    expect(diff).to_contain_text('+@id("no-huge")')
    expect(diff).to_contain_text("+when { context.arguments has amount_cents")
    violations = axe(other)
    assert not violations, axe_summary(violations)

    # Before activating, he replays the registrations so far: the two large refunds
    # (one before the policy, one while in shadow) would have been forbidden.
    other.get_by_role("link", name="Simulate").click()
    other.wait_for_url(re.compile(r"/policies/no-huge/simulate\?version=1$"))
    totals = other.locator("#simulation-totals")
    expect(totals.locator("#count-newly_forbidden")).to_have_text(
        re.compile(r"newly forbidden\s*2")
    )
    expect(totals.locator("#count-newly_asking")).to_have_text(re.compile(r"newly asking\s*0"))
    expect(other.locator("#examples-newly_forbidden")).to_contain_text(huge["id"])
    expect(other.get_by_text("3 operations replayed.")).to_be_visible()
    other.get_by_label("Days").fill("1")
    other.get_by_role("button", name="Simulate").click()
    other.wait_for_url(re.compile(r"days=1"))
    expect(totals.locator("#count-newly_forbidden")).to_have_text(
        re.compile(r"newly forbidden\s*2")
    )
    violations = axe(other)
    assert not violations, axe_summary(violations)
    assert Policy.objects.get(pk="no-huge").state == "shadow"
    other.get_by_role("link", name="Back to the policy").click()

    other.get_by_role("button", name="Activate v1").click()
    expect(other.get_by_role("status").first).to_contain_text("Version 1 of no-huge is in force.")
    expect(other.get_by_role("heading", level=1)).to_contain_text("active")

    refused = api.register(
        run, "send_refund", {"payment_id": "p2", "amount_cents": 600000}, expect=403
    )
    assert refused["code"] == "forbidden_by_policy"
    assert refused["policy"] == "no-huge"

    # Bob retires it: the same registration goes through again.
    other.get_by_label("Why retire it?").fill("Limit moved to the provider")
    other.get_by_role("button", name="Retire policy").click()
    expect(other.get_by_role("status").first).to_contain_text("Policy no-huge is retired")
    expect(other.get_by_role("heading", level=1)).to_contain_text("retired")
    expect(other.get_by_role("button", name="Retire policy")).to_have_count(0)
    expect(other.get_by_text("policy_retired")).to_be_visible()
    assert api.register(run, "send_refund", {"payment_id": "p3", "amount_cents": 600000})[
        "status"
    ] in ("ready", "executing")
    other.context.close()
