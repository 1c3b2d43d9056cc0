"""Keystrokes, clicks and seconds of three console tasks, from the inbox and the queue.

``python -m bench.review_speed`` (``make bench-review``; ``make bench BENCH_ARGS='--only
review'``) serves Effectgate with gunicorn on a fresh database, sets each task up over
the runner API and drives Debian's chromium with Playwright as two people:

- **reviewer, one by one**: 10 refunds waiting for approval. From the inbox ``j`` then
  ``Enter`` opens the first; on each request ``a`` then ``Enter`` approves it and the
  next one opens by itself.
- **reviewer, in bulk**: 10 more. In the inbox ``j`` then ``x`` ticks each row; ``a``
  focuses "Approve selected" in the bar that appears, ``Enter`` approves them together.
- **support**: 5 payouts whose outcome is unknown (registered, claimed, and answered
  ``unknown`` over the API). From the reconciliation queue ``j`` then ``Enter`` opens the
  oldest; ``h`` chooses "It happened" and focuses the downstream reference, typed (the
  provider's payout id, the answer's evidence), and ``Enter`` records the answer and
  opens the next unknown outcome.

Before issue 29 (measured at 0d7bad0, the pages of 4ee69bc) the bulk flow Tabbed to
"Approve selected", and support clicked "It happened", Tabbed to the reference and,
after each answer, Tabbed to "Reconciliation" in the navigation to go back to the queue.

The flows are small functions with role and label locators, one per task, so that they
follow the console's pages as these change. After each task the runner API must show
every request approved and every unknown outcome resolved as the person answered,
otherwise the run fails. Figures (``bench.person``: keystrokes, clicks, machine seconds
and a person's estimate) go to stdout and ``var/bench-review.json``. One run on a shared
machine: the seconds are indicative, the keystrokes and clicks exact.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from playwright.sync_api import Page

from effectgate_client import EffectgateClient

from . import decide_speed
from .decide_speed import CONTRACT as REFUND_CONTRACT
from .decide_speed import DECIDE, decided, register_refunds
from .decide_speed import TOOL as REFUND_TOOL
from .person import Figure, Person, chromium, create_person, signed_in, table
from .stack import ROOT, VAR, Stack, fresh_database

PAYOUT_TOOL = "bench_payout"
RECONCILE = "operations.reconcile_tool"
# An irreversible payout that needs no approval and has no lookup: an unknown outcome
# waits in the reconciliation queue for a person.
PAYOUT_CONTRACT = {
    **REFUND_CONTRACT,
    "approval": {"mode": "never"},
    "display": {"summary": "Pay out {/amount_cents} for {/payment_id}"},
}
TASKS = {
    "one_by_one": "reviewer, one by one",
    "bulk": "reviewer, in bulk",
    "support": "support, unknown outcomes",
}


# --- setting the scene over the runner API ---------------------------------------------------


def leave_unknown(client: EffectgateClient, count: int, tag: str) -> list[str]:
    """``count`` payouts whose attempt was claimed and answered ``unknown``: each waits in
    the reconciliation queue. Their operation ids."""
    run = client.create_run(principal="user:customer")["id"]
    ids = []
    for index in range(count):
        op = client.register(
            run=run,
            tool=PAYOUT_TOOL,
            operation_key=f"{tag}-{index}",
            arguments={"payment_id": f"pay_{tag}_{index}", "amount_cents": 12_000 + index},
        )
        attempt = client.claim(op["id"])["attempt"]
        after = client.post_outcome(
            op["id"], attempt, {"kind": "unknown", "code": "timeout", "detail": "read timeout"}
        )
        if after["status"] != "outcome_unknown":
            raise RuntimeError(f"{op['id']} is {after['status']}, not outcome_unknown")
        ids.append(op["id"])
    return ids


def reference(index: int) -> str:
    """The provider's reference support finds for the ``index``-th payout."""
    return f"po_{index + 1:08d}"


# --- the scripted people: one function per task ----------------------------------------------


def reviewer_one_by_one(page: Page, count: int) -> Figure:
    """``j`` ``Enter`` from the inbox, then ``a`` ``Enter`` on each request: the keys of
    ``bench.decide_speed``'s *after*."""
    return decide_speed.after(page, count)


def reviewer_in_bulk(page: Page, count: int) -> Figure:
    """``j`` ``x`` on each of the inbox's rows, then ``a`` (it focuses "Approve
    selected") and ``Enter``. Before issue 29: Tab to "Approve selected", then Enter."""
    person = Person(page)
    with person.timed():
        page.goto("/")
        for _ in range(count):
            person.press("j")
            person.press("x")
        if page.get_by_role("checkbox", checked=True).count() != count:
            raise RuntimeError("x did not tick every request")
        # Once rows are ticked, "a" focuses "Approve selected" (issue 29).
        person.press("a")
        with page.expect_navigation():
            person.press("Enter")
        decided(page, f"Approved {count}")
    return person.figure


def support_resolves(page: Page, count: int) -> Figure:
    """From the queue, oldest first: ``j`` ``Enter`` opens the first; on each, ``h``
    chooses "It happened" and focuses the reference, type it, ``Enter``: the answer is
    recorded and the next unknown outcome opens (issue 29). Before issue 29: click "It
    happened", Tab to the reference, type, Enter, then Tab to the navigation's queue
    link and Enter for the next."""
    person = Person(page)
    with person.timed():
        page.goto("/reconciliation/")
        person.press("j")
        with page.expect_navigation():
            person.press("Enter")
        for index in range(count):
            person.press("h")
            person.type(reference(index))
            with page.expect_navigation():
                person.press("Enter")  # a text field's Enter submits its form
            decided(page, "Recorded")
    return person.figure


# --- what the tasks left, over the runner API ------------------------------------------------


def not_approved(client: EffectgateClient, ids: list[str]) -> list[str]:
    """Those of ``ids`` not ``ready`` (approved, and no runner has claimed them since)."""
    return [op_id for op_id in ids if client.get_operation(op_id)["status"] != "ready"]


def not_resolved(client: EffectgateClient, ids: list[str]) -> list[str]:
    """Those of ``ids`` not ``succeeded`` with the reference support typed."""
    wrong = []
    for index, op_id in enumerate(ids):
        op = client.get_operation(op_id)
        if (op["status"], op.get("downstream_id")) != ("succeeded", reference(index)):
            wrong.append(op_id)
    return wrong


# --- the run -------------------------------------------------------------------------------------


def measure(*, database_url: str, requests: int, unknowns: int) -> dict[str, Any]:
    """Serve Effectgate on ``database_url`` (fresh), run the three tasks; the figures."""
    password = secrets.token_urlsafe(16)
    with (
        Stack(
            database_url,
            workers=1,
            threads=4,
            loops=False,
            runner_name="bench-review",
            log_dir=VAR / "bench" / "review",
            env={"DEBUG": "1"},
        ) as stack,
        EffectgateClient(stack.base_url, stack.token) as client,
    ):
        client.put_tool(REFUND_TOOL, REFUND_CONTRACT)
        client.put_tool(PAYOUT_TOOL, PAYOUT_CONTRACT)
        for name, grants in (
            ("reviewer", {REFUND_TOOL: [DECIDE]}),
            ("support", {PAYOUT_TOOL: [RECONCILE]}),
        ):
            stack.manage("shell", "-c", create_person(name, password, grants=grants))
        figures: dict[str, Figure] = {}
        left: dict[str, list[str]] = {}
        with chromium() as browser:
            reviewer = signed_in(browser, stack.base_url, "reviewer", password)
            for task, flow in (("one_by_one", reviewer_one_by_one), ("bulk", reviewer_in_bulk)):
                ids = register_refunds(stack.base_url, stack.token, requests, task)
                figures[task] = flow(reviewer, requests)
                left[task] = not_approved(client, ids)
            support = signed_in(browser, stack.base_url, "support", password)
            ids = leave_unknown(client, unknowns, "support")
            figures["support"] = support_resolves(support, unknowns)
            left["support"] = not_resolved(client, ids)
    counts = {"one_by_one": requests, "bulk": requests, "support": unknowns}
    return {
        "tasks": {
            task: {
                "label": TASKS[task],
                "items": counts[task],
                "done": counts[task] - len(left[task]),
                "not_done": left[task],
                **figures[task].as_dict(),
            }
            for task in TASKS
        },
        "ok": not any(left.values()),
    }


def summary(review: dict[str, Any]) -> list[str]:
    rows = []
    for task in review["tasks"].values():
        figure = Figure(
            keys=task["keystrokes"],
            clicks=task["clicks"],
            homings=task["homings"],
            seconds=task["machine_s"],
        )
        rows.append((f"{task['label']} ({task['done']} of {task['items']} done)", figure))
    return table(rows)


def _commit() -> str | None:
    """The commit measured, to tell the runs before and after a change apart."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.review_speed", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--requests", type=int, default=10, help="approval requests per way")
    parser.add_argument("--unknowns", type=int, default=5, help="unknown outcomes to resolve")
    parser.add_argument(
        "--database",
        default="effectgate_review",
        help="the database to drop and create (on DATABASE_URL's server, else SQLite)",
    )
    parser.add_argument("--json", type=Path, default=VAR / "bench-review.json")
    args = parser.parse_args(argv)
    url = fresh_database(args.database, base_url=os.environ.get("DATABASE_URL"))
    review = {
        "commit": _commit(),
        "database": url.rsplit("@", 1)[-1],
        "load_average_at_start": [round(load, 2) for load in os.getloadavg()],
        "python": platform.python_version(),
        **measure(database_url=url, requests=args.requests, unknowns=args.unknowns),
        "load_average_at_end": [round(load, 2) for load in os.getloadavg()],
    }
    print("\n".join(summary(review)))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(review, indent=2) + "\n")
    print(f"written to {args.json}")
    return 0 if review["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
