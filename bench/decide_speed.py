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
Newell 1980; ``bench.person``). Figures of one run, measured against each other.
"""

from __future__ import annotations

import argparse
import os
import secrets

import httpx
from playwright.sync_api import Page

from .person import Figure, Person, chromium, create_person, signed_in, table
from .stack import Stack, fresh_database

# A fresh password per run, for a person on a throwaway database.
PASSWORD = secrets.token_urlsafe(16)
TOOL = "bench_refund"
DECIDE = "operations.decide_tool"
# A refund every operation of which waits for a person (bench.review_speed uses it too).
CONTRACT = {
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
}


def register_refunds(base_url: str, token: str, count: int, tag: str) -> list[str]:
    """``count`` refunds of one run, each waiting for approval; their operation ids."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"{base_url}/api/v1", headers=headers) as client:
        run = client.post("/runs", json={"principal": "user:customer"}).json()["id"]
        ids = []
        for index in range(count):
            answer = client.post(
                "/operations",
                json={
                    "run": run,
                    "tool": TOOL,
                    "operation_key": f"{tag}-{index}",
                    "arguments": {"payment_id": f"pay_{tag}_{index}", "amount_cents": 75000},
                },
            )
            answer.raise_for_status()
            ids.append(answer.json()["id"])
    return ids


def approve_focused(person: Person) -> None:
    """Enter on the focused Approve button; the decision's page (the next request, or the
    inbox after the last) says it is recorded."""
    with person.page.expect_navigation():
        person.press("Enter")
    decided(person.page, "Approved")


def decided(page: Page, text: str) -> None:
    """Wait for the console's success message that contains ``text``."""
    page.locator("#messages").get_by_role("status").filter(has_text=text).first.wait_for()


def before(page: Page, count: int) -> Figure:
    person = Person(page)
    with person.timed():
        for _ in range(count):
            page.goto("/")  # the console went back to the top of the inbox
            person.tab_to(page.locator("#inbox-rows tr a[href^='/approvals/']").first)
            with page.expect_navigation():
                person.press("Enter")
            person.tab_to(page.get_by_role("button", name="Approve", exact=True))
            approve_focused(person)
    return person.figure


def after(page: Page, count: int) -> Figure:
    person = Person(page)
    with person.timed():
        page.goto("/")
        person.press("j")
        with page.expect_navigation():
            person.press("Enter")
        for _ in range(count):
            page.get_by_role("button", name="Approve", exact=True).wait_for()
            person.press("a")
            approve_focused(person)
    return person.figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    url = fresh_database("effectgate_decide", base_url=os.environ.get("DATABASE_URL"))
    with Stack(url, workers=1, threads=4, loops=False, env={"DEBUG": "1"}) as stack:
        httpx.put(
            f"{stack.base_url}/api/v1/tools/{TOOL}",
            headers={"Authorization": f"Bearer {stack.token}"},
            json=CONTRACT,
        ).raise_for_status()
        stack.manage("shell", "-c", create_person("approver", PASSWORD, grants={TOOL: [DECIDE]}))
        results = {}
        with chromium() as browser:
            page = signed_in(browser, stack.base_url, "approver", PASSWORD)
            for name, flow in (("before", before), ("after", after)):
                for count in (1, 10):
                    register_refunds(stack.base_url, stack.token, count, f"{name}{count}")
                    results[(name, count)] = flow(page, count)
    rows = [
        (f"{name}, {count} approval{'s' if count > 1 else ''}", figure)
        for (name, count), figure in results.items()
    ]
    print("\n".join(table(rows, clicks=False)))
    for count in (1, 10):
        b, a = results[("before", count)], results[("after", count)]
        print(
            f"{count} approval(s): {b.keys / a.keys:.1f}x fewer keystrokes, "
            f"{b.person_s / a.person_s:.1f}x less of a person's time (est.)"
        )


if __name__ == "__main__":
    main()
