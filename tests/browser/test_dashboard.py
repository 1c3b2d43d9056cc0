"""The dashboard in a real browser, in both colour schemes, on a desktop and a phone:
each chart drawn for the eye with its table for assistive technology only (never both
on screen), p50 and p95 as two series told apart, money at stake, axe-clean."""

import io
import re

import pytest
from django.core.management import call_command
from playwright.sync_api import Page, expect

from .conftest import axe, axe_summary, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

VIEWPORTS = [{"width": 1366, "height": 768}, {"width": 390, "height": 844}]


def _luminance(rgb: str) -> float:
    channels = []
    for value in (int(part) / 255 for part in re.findall(r"\d+", rgb)[:3]):
        channels.append(value / 12.92 if value <= 0.04045 else ((value + 0.055) / 1.055) ** 2.4)
    red, green, blue = channels
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def _contrast(one: str, other: str) -> float:
    light, dark = sorted((_luminance(one), _luminance(other)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def charts_are_for_the_eye_and_tables_for_assistive_technology(page: Page) -> None:
    charts = page.locator("#dashboard-panels svg.chart")
    expect(charts).to_have_count(4)
    for index in range(4):
        chart = charts.nth(index)
        expect(chart).to_have_attribute("aria-hidden", "true")
        assert chart.bounding_box()["height"] > 50
        # The table right after it is in the accessibility tree, not on screen.
        hidden = chart.locator("xpath=following-sibling::div[1]")
        expect(hidden).to_have_class("visually-hidden")
        box = hidden.bounding_box()
        assert box["width"] <= 1
        assert box["height"] <= 1
    expect(page.get_by_role("img")).to_have_count(0)
    for name in (
        "Pending approvals by age",
        "Approval latency",
        "Unknown-outcome rate per day",
        "Reconciliation backlog per day",
    ):
        expect(page.get_by_role("table", name=name, exact=True)).to_have_count(1)


def latency_reads_as_two_series(page: Page) -> None:
    chart = page.locator("#latency-h ~ svg.chart")
    p50 = chart.locator("rect.tone-info:not([width='10'])")
    p95 = chart.locator("rect.tone-attention:not([width='10'])")
    expect(p50).to_have_count(3)
    expect(p95).to_have_count(3)
    background = page.locator("#latency-h").evaluate(
        "h => getComputedStyle(h.closest('.card')).backgroundColor"
    )
    fills = []
    for bars in (p50, p95):
        fill = bars.first.evaluate("bar => getComputedStyle(bar).fill")
        fills.append(fill)
        # Non-text contrast (WCAG 1.4.11) against the card.
        assert _contrast(fill, background) >= 3, (fill, background)
        # The demo decided requests in every window: no bar of a value is invisible.
        for index in range(3):
            assert bars.nth(index).bounding_box()["height"] >= 2
    assert fills[0] != fills[1]
    labels = chart.locator("text.chart-label").all_text_contents()
    assert labels.count("p50") == 4  # under each bar, and the legend
    assert labels.count("p95") == 4


def money_at_stake_is_on_screen(page: Page) -> None:
    card = page.locator("section", has=page.get_by_role("heading", name="Money at stake"))
    expect(card.get_by_text("Tools without a money field are not counted.")).to_be_visible()
    by_state = card.get_by_role("table", name="By state")
    expect(by_state.get_by_role("row", name=re.compile("^Awaiting approval"))).to_contain_text(
        "€750.00"
    )
    expect(card.get_by_role("table", name="By tool")).to_contain_text("send_refund")
    expect(card.get_by_text(re.compile("Not counted, no money field:"))).to_contain_text(
        "issue_voucher"
    )


def test_the_dashboard_in_both_schemes_on_a_desktop_and_a_phone(page, db):
    call_command("seed_demo", stdout=io.StringIO())
    login(page, "operator", "operator-demo")
    for scheme in ("light", "dark"):
        page.emulate_media(color_scheme=scheme)
        for viewport in VIEWPORTS:
            page.set_viewport_size(viewport)
            page.goto("/dashboard/")
            expect(page.get_by_role("heading", level=1)).to_contain_text("Dashboard")
            violations = axe(page)
            assert not violations, f"{scheme} {viewport}\n{axe_summary(violations)}"
            charts_are_for_the_eye_and_tables_for_assistive_technology(page)
            latency_reads_as_two_series(page)
            money_at_stake_is_on_screen(page)
