"""A scripted person in Debian's chromium, for the console benchmarks: keystrokes, mouse
clicks and seconds (``bench.decide_speed``, ``bench.review_speed``).

A ``Person`` drives one signed-in page and counts what a person would do: every key
pressed and every character typed is a keystroke, every mouse click a click, and every
move of the hand from the keyboard to the mouse or back a homing. ``Figure.person_s``
estimates a person's time with the keystroke-level model (Card, Moran and Newell 1980):
the machine's time (the browser acting at once: round trips and page loads only) plus
0.28 s per keystroke (the average typist), 1.3 s per click (1.1 s to point, 0.2 s to
press and release the button) and 0.4 s per homing. Reading and thinking are not
modelled.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from playwright.sync_api import Browser, Locator, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
KEYSTROKE_S = 0.28
CLICK_S = 1.3
HOMING_S = 0.4


@dataclass
class Figure:
    keys: int = 0
    clicks: int = 0
    homings: int = 0
    seconds: float = 0.0

    @property
    def person_s(self) -> float:
        return (
            self.seconds + self.keys * KEYSTROKE_S + self.clicks * CLICK_S + self.homings * HOMING_S
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "keystrokes": self.keys,
            "clicks": self.clicks,
            "homings": self.homings,
            "machine_s": round(self.seconds, 2),
            "person_s_estimate": round(self.person_s, 1),
        }


class Person:
    """One person at one page; their keystrokes, clicks and time add up in ``figure``."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.figure = Figure()
        self._hand = "keyboard"

    def _use(self, device: str) -> None:
        if device != self._hand:
            self.figure.homings += 1
            self._hand = device

    def press(self, key: str) -> None:
        self._use("keyboard")
        self.page.keyboard.press(key)
        self.figure.keys += 1

    def type(self, text: str) -> None:
        """Type ``text`` into the focused field: a keystroke per character."""
        self._use("keyboard")
        self.page.keyboard.type(text)
        self.figure.keys += len(text)

    def click(self, target: Locator) -> None:
        self._use("mouse")
        target.click()
        self.figure.clicks += 1

    def tab_to(self, target: Locator, limit: int = 200) -> None:
        """Press Tab until ``target`` has the focus (each Tab a keystroke)."""
        target.wait_for()
        for _ in range(limit):
            self.press("Tab")
            if target.evaluate("element => element === document.activeElement"):
                return
        raise RuntimeError(f"{target} is not reachable with Tab")

    @contextmanager
    def timed(self) -> Iterator[Figure]:
        """Add the time the block takes to the figure's machine seconds."""
        started = time.perf_counter()
        try:
            yield self.figure
        finally:
            self.figure.seconds += time.perf_counter() - started


@contextmanager
def chromium() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless"])
        try:
            yield browser
        finally:
            browser.close()


def signed_in(browser: Browser, base_url: str, username: str, password: str) -> Page:
    """A page of a browser context of its own, signed in through the login form."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1366, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()
    return page


def create_person(username: str, password: str, *, grants: dict[str, list[str]]) -> str:
    """Python for ``manage.py shell -c``: a console user with a password and, per tool,
    object permissions (``{"bench_refund": ["operations.decide_tool"]}``)."""
    lines = [
        "from django.contrib.auth import get_user_model",
        "from guardian.shortcuts import assign_perm",
        "from operations.models import Tool",
        f"u = get_user_model().objects.create_user({username!r}, password={password!r})",
    ]
    for tool, perms in grants.items():
        lines += [f"assign_perm({perm!r}, u, Tool.objects.get(pk={tool!r}))" for perm in perms]
    return "\n".join(lines)


def table(rows: list[tuple[str, Figure]], *, clicks: bool = True) -> list[str]:
    """The figures as a plain table, one row per task."""
    width = max(len(label) for label, _ in rows) + 2
    header = f"{'':{width}}{'keys':>6}" + (f"{'clicks':>8}" if clicks else "")
    lines = [f"{header}{'machine s':>11}{'person s (est.)':>17}"]
    for label, figure in rows:
        line = f"{label:{width}}{figure.keys:>6}" + (f"{figure.clicks:>8}" if clicks else "")
        lines.append(f"{line}{figure.seconds:>11.2f}{figure.person_s:>17.1f}")
    return lines
