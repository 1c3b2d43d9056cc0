"""Keystrokes and seconds for one approval and for ten, before and after issue 15.

``python -m bench.decide_speed`` (``make bench-decide``) serves Effectgate with
gunicorn on a fresh database, registers refunds that need approval, and drives Debian's
chromium with Playwright as an approver who uses only the keyboard:

- **before**: what the console offered before the keys existed. From the inbox, Tab to
  the request's link and press Enter, Tab to Approve and press Enter; after each
  decision the console went back to the top of the inbox.
- **after**: ``j`` then ``Enter`` opens the first request from the inbox; ``a`` then
  ``Enter`` approves it and the next request opens by itself.

It prints the keystrokes each way needs and two times: the machine's (the browser typing
at once: round trips and page loads only) and a person's estimate, the machine's time
plus 0.28 s per keystroke (the keystroke-level model's average typist, Card, Moran and
Newell 1980). Figures of one run, measured against each other.
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from dataclasses import dataclass

import httpx
from playwright.sync_api import Page, sync_playwright

from .stack import Stack, fresh_database

CHROMIUM = "/usr/bin/chromium"
KEYSTROKE_S = 0.28
# A fresh password per run, for a person on a throwaway database.
PASSWORD = secrets.token_urlsafe(16)
CREATE_APPROVER = (
    "from django.contrib.auth import get_user_model;"
    "from guardian.shortcuts import assign_perm;"
    "from operations.models import Tool;"
    "u = get_user_model().objects.create_user('approver', password='" + PASSWORD + "');"
    "assign_perm('operations.decide_tool', u, Tool.objects.get(pk='bench_refund'))"
)


@dataclass
class Figure:
    keys: int = 0
    seconds: float = 0.0

    @property
    def person_s(self) -> float:
        return self.seconds + self.keys * KEYSTROKE_S


def _register(base_url: str, token: str, count: int, tag: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"{base_url}/api/v1", headers=headers) as client:
        run = client.post("/runs", json={"principal": "user:customer"}).json()["id"]
        for index in range(count):
            answer = client.post(
                "/operations",
                json={
                    "run": run,
                    "tool": "bench_refund",
                    "operation_key": f"{tag}-{index}",
                    "arguments": {"payment_id": f"pay_{tag}_{index}", "amount_cents": 75000},
                },
            )
            answer.raise_for_status()


def _press(page: Page, figure: Figure, key: str) -> None:
    page.keyboard.press(key)
    figure.keys += 1


def _tab_to(page: Page, figure: Figure, selector: str, limit: int = 200) -> None:
    """Tab until the focused element matches ``selector`` (each Tab a keystroke)."""
    for _ in range(limit):
        _press(page, figure, "Tab")
        if page.evaluate(f"document.activeElement.matches({selector!r})"):
            return
    raise RuntimeError(f"{selector} is not reachable with Tab")


def _wait_decided(page: Page) -> None:
    page.wait_for_selector(".message-success, [role=status]:has-text('Approved')")


def before(page: Page, count: int) -> Figure:
    figure = Figure()
    started = time.perf_counter()
    for _ in range(count):
        page.goto("/")  # the console went back to the top of the inbox
        _tab_to(page, figure, "#inbox-rows tr a[href^='/approvals/']")
        _press(page, figure, "Enter")
        page.wait_for_url("**/approvals/**")
        _tab_to(page, figure, "form[data-decide] button[value='approve']")
        _press(page, figure, "Enter")
        _wait_decided(page)
    figure.seconds = time.perf_counter() - started
    return figure


def after(page: Page, count: int) -> Figure:
    figure = Figure()
    started = time.perf_counter()
    page.goto("/")
    _press(page, figure, "j")
    _press(page, figure, "Enter")
    page.wait_for_url("**/approvals/**")
    for _ in range(count):
        page.wait_for_selector("form[data-decide] button[value='approve']")
        _press(page, figure, "a")
        _press(page, figure, "Enter")
        _wait_decided(page)
    figure.seconds = time.perf_counter() - started
    return figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    url = fresh_database("effectgate_decide", base_url=os.environ.get("DATABASE_URL"))
    with Stack(url, workers=1, threads=4, loops=False, env={"DEBUG": "1"}) as stack:
        headers = {"Authorization": f"Bearer {stack.token}"}
        httpx.put(
            f"{stack.base_url}/api/v1/tools/bench_refund",
            headers=headers,
            json={
                "effect_class": "irreversible",
                "input_schema": {
                    "type": "object",
                    "properties": {
                        "payment_id": {"type": "string"},
                        "amount_cents": {"type": "integer"},
                    },
                },
                "approval": {"mode": "always"},
                "display": {"summary": "Refund {/amount_cents} to {/payment_id}"},
            },
        ).raise_for_status()
        stack.manage("shell", "-c", CREATE_APPROVER)
        results = {}
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--headless"])
            context = browser.new_context(base_url=stack.base_url)
            context.set_default_timeout(15_000)
            page = context.new_page()
            page.goto("/login/")
            page.get_by_label("Username").fill("approver")
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_load_state()
            for name, flow in (("before", before), ("after", after)):
                for count in (1, 10):
                    _register(stack.base_url, stack.token, count, f"{name}{count}")
                    results[(name, count)] = flow(page, count)
            browser.close()
    print(f"{'':22}{'keys':>6}{'machine s':>11}{'person s (est.)':>17}")
    for (name, count), figure in results.items():
        label = f"{name}, {count} approval{'s' if count > 1 else ''}"
        print(f"{label:22}{figure.keys:>6}{figure.seconds:>11.2f}{figure.person_s:>17.1f}")
    for count in (1, 10):
        b, a = results[("before", count)], results[("after", count)]
        print(
            f"{count} approval(s): {b.keys / a.keys:.1f}x fewer keystrokes, "
            f"{b.person_s / a.person_s:.1f}x less of a person's time (est.)"
        )


if __name__ == "__main__":
    main()
