"""``python manage.py seed_demo``: demo data a newcomer can walk through in the console.

Everything is written through the real services (``operations.services``), so the
events, hash chains, approvals and budgets are what production would hold. Two weeks
of history are played in time order: with time-machine (a development dependency,
installed by ``make run``) the clock is moved to each moment before the service is
called, so the dashboard has days to show; without it everything happens now.

Idempotent: the demo people, groups and permissions are made if missing, and the data
only once (the runner ``demo-agent`` marks it). The demo passwords are fixed and
printed on every run: they are for a local demo database only.
"""

import heapq
import itertools
import random
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext, suppress
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals.errors import Refusal
from approvals.models import ApprovalRequest
from operations import services
from operations.errors import DomainError
from operations.models import Operation, Run, Runner, Tool

MARKER_RUNNER = "demo-agent"
HISTORY_DAYS = 14

PEOPLE = {
    # username: (password, what they do)
    "approver": ("approver-demo", "decides approvals (send_refund, delete_account, send_email)"),
    "approver2": ("approver2-demo", "second approver, for quorums"),
    "support": ("support-demo", "reconciles send_refund, issue_voucher, send_email, lookup_order"),
    "operator": (
        "operator-demo",
        "reconciles every demo tool, activates contract versions, cancels runs",
    ),
}
GROUPS = {
    "Approvers": ("operations.decide_tool", ["send_refund", "delete_account", "send_email"]),
    "Support": (
        "operations.reconcile_tool",
        ["send_refund", "issue_voucher", "send_email", "lookup_order"],
    ),
}


def _schema(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": required,
        "properties": properties,
        "additionalProperties": False,
    }


REFUND: dict[str, Any] = {
    "effect_class": "irreversible",
    "description": "Refund a card payment through the payment provider.",
    "input_schema": _schema(
        ["payment_id", "amount_cents"],
        {
            "payment_id": {"type": "string"},
            "amount_cents": {"type": "integer", "minimum": 1},
            "reason": {"type": "string"},
        },
    ),
    "retry": {
        "max_attempts": 3,
        "retryable_codes": ["rate_limited"],
        "base_delay_ms": 500,
        "max_delay_ms": 30_000,
    },
    "approval": {
        "mode": "rules",
        "rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}],
        # An approver may lower (or raise) the amount: an edited copy then runs.
        "editable": ["/amount_cents"],
    },
    # Support opens the provider's record of a refund from the reconciliation pages.
    "reconcile": {
        "mode": "manual",
        "console_url": "https://pay.example.com/refunds?idempotency_key={idempotency_key}",
    },
    "concurrency_key": "/payment_id",
    "display": {
        "summary": "Refund {/amount_cents} to payment {/payment_id}",
        "fields": {
            "/amount_cents": {
                "label": "Amount",
                "format": "money",
                "currency": "EUR",
                "minor_units": True,
            }
        },
    },
}
# v2 lets a grant be used for an hour instead of 15 minutes: a weakening, so it waits
# for a person allowed to activate it.
REFUND_V2 = {**REFUND, "approval": {**REFUND["approval"], "grant_ttl_s": 3600}}
EMAIL = {
    "effect_class": "deduplicated",
    "description": "Send an email to a customer; the provider deduplicates by key.",
    "input_schema": _schema(
        ["to", "subject", "body"],
        {
            "to": {"type": "string"},
            "subject": {"type": "string"},
            "body": {"type": "string", "x-sensitive": True},
        },
    ),
    "approval": {"mode": "never"},
    "display": {"summary": "Email {/to}: {/subject}", "fields": {"/to": {"format": "email"}}},
}
VOUCHER = {
    "effect_class": "compensable",
    "input_schema": _schema(
        ["customer_id", "amount_cents"],
        {"customer_id": {"type": "string"}, "amount_cents": {"type": "integer", "minimum": 1}},
    ),
    "retry": {
        "max_attempts": 2,
        "retryable_codes": ["rate_limited"],
        "base_delay_ms": 500,
        "max_delay_ms": 1000,
    },
    "approval": {"mode": "never"},
}
VOUCHER_V2 = {**VOUCHER, "description": "Issue a store-credit voucher; undone by voiding it."}
LOOKUP = {
    "effect_class": "read_only",
    "description": "Read an order from the shop.",
    "input_schema": _schema(["order_id"], {"order_id": {"type": "string"}}),
    "approval": {"mode": "never"},
}
DELETE_ACCOUNT = {
    "effect_class": "irreversible",
    "description": "Delete a customer account and its data.",
    "input_schema": _schema(["customer_id"], {"customer_id": {"type": "string"}}),
    "approval": {"mode": "always", "approvals_required": 2, "request_ttl_s": 3 * 86_400},
    "reconcile": {"mode": "manual"},
    "display": {"summary": "Delete the account of customer {/customer_id} and its data"},
}


class Clock:
    """Runs scheduled actions in time order, with the clock moved to each moment."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self._queue: list[tuple[datetime, int, Callable[[], object]]] = []
        self._order = itertools.count()
        try:
            import time_machine
        except ImportError:  # a production install: everything happens now
            self._travel: AbstractContextManager[Any] = nullcontext()
            self._shifts = False
        else:
            self._travel = time_machine.travel(now, tick=False)
            self._shifts = True

    def at(self, moment: datetime, action: Callable[[], object]) -> None:
        """Do ``action`` at ``moment``; a moment after now has not come yet: dropped."""
        if moment <= self.now:
            heapq.heappush(self._queue, (moment, next(self._order), action))

    def run(self) -> None:
        with self._travel as traveller:
            while self._queue:
                moment, _, action = heapq.heappop(self._queue)
                if self._shifts:
                    traveller.move_to(moment)
                action()


class Demo:
    def __init__(self, now: datetime, people: dict[str, Any]) -> None:
        self.now = now
        self.clock = Clock(now)
        self.people = people
        self.rng = random.Random(7)  # noqa: S311 (demo data, not a secret)
        self.counter = itertools.count(1)
        self.runner: Runner | None = None
        self.state_run = ""

    # --- small helpers around the services -------------------------------------------

    def key(self, prefix: str) -> str:
        return f"{prefix}-{next(self.counter):04d}"

    def register(self, run_id: str, tool: str, arguments: dict[str, Any], turn: int) -> Operation:
        assert self.runner is not None
        return services.operation_register(
            runner=self.runner,
            run_id=run_id,
            tool_name=tool,
            operation_key=self.key(f"{run_id[-6:]}:{tool}"),
            arguments=arguments,
            call_id=self.key("call"),
            turn=turn,
        ).operation

    def claim(self, op: Operation) -> int:
        assert self.runner is not None
        return services.attempt_claim(operation=op, runner=self.runner, lease_s=30).number

    def outcome(self, op: Operation, number: int, **body: Any) -> Operation:
        assert self.runner is not None
        return services.attempt_record_outcome(
            operation_id=op.pk, number=number, body=body, runner=self.runner
        )

    def request_id(self, op: Operation) -> str:
        request = ApprovalRequest.objects.filter(operation=op).order_by("-created_at").first()
        assert request is not None
        return request.id

    def decide(self, op: Operation, who: str, approve: bool, comment: str) -> Operation:
        return services.approval_decide(
            request_id=self.request_id(op),
            user=self.people[who],
            approve=approve,
            comment=comment,
        )

    def later(self, moment: datetime, action: Callable[[], Any]) -> None:
        self.clock.at(moment, lambda: self._quietly(action))

    @staticmethod
    def _quietly(action: Callable[[], Any]) -> None:
        # A step the ledger refuses (e.g. a run that ran out of budget) is part of the
        # story, not a reason to stop seeding.
        with suppress(DomainError, Refusal):
            action()

    # --- the story -------------------------------------------------------------------

    def setup(self) -> None:
        runner, _ = services.runner_create(
            name=MARKER_RUNNER, owner=None, actor=services.Actor.system("seed_demo")
        )
        self.runner = runner
        start = self.now - timedelta(days=HISTORY_DAYS, hours=2)
        self.clock.at(start, self.register_tools)
        self.clock.at(
            self.now - timedelta(days=3, hours=5),
            lambda: services.tool_register(name="send_refund", body=REFUND_V2, runner=runner),
        )
        self.clock.at(
            self.now - timedelta(days=6),
            lambda: services.tool_register(name="issue_voucher", body=VOUCHER_V2, runner=runner),
        )
        for days_ago in range(HISTORY_DAYS - 1, -1, -1):
            self.clock.at(
                self.now - timedelta(days=days_ago, hours=self.rng.randint(3, 9)),
                partial(self.day, days_ago),
            )
        self.current_states()

    def register_tools(self) -> None:
        assert self.runner is not None
        for name, body in (
            ("send_refund", REFUND),
            ("send_email", EMAIL),
            ("issue_voucher", VOUCHER),
            ("lookup_order", LOOKUP),
            ("delete_account", DELETE_ACCOUNT),
        ):
            services.tool_register(name=name, body=body, runner=self.runner)
        grant_permissions(self.people)

    def run(self, principal: str, **budgets: Any) -> str:
        assert self.runner is not None
        return services.run_create(
            runner=self.runner,
            principal=principal,
            external_id=self.key("conversation"),
            budgets=budgets,
        ).id

    def day(self, days_ago: int) -> None:
        """One day of an agent's work: lookups, emails, refunds, vouchers, approvals."""
        now = timezone.now()
        rng = self.rng
        for _ in range(rng.randint(2, 4)):
            customer = f"cus_{rng.randint(1000, 9999)}"
            run_id = self.run(f"user:{customer}", max_tool_calls=8, max_spend=0.5, max_turns=12)
            order = self.register(run_id, "lookup_order", {"order_id": f"ord_{customer}"}, 1)
            self.outcome(order, self.claim(order), kind="succeeded", result={"total": 4200})
            refund_amount = rng.choice([1500, 4200, 12000, 30000, 64000, 120000])
            payment = f"pay_{rng.randint(10**6, 10**7)}"
            refund = self.register(
                run_id,
                "send_refund",
                {"payment_id": payment, "amount_cents": refund_amount, "reason": "damaged item"},
                2,
            )
            when = now + timedelta(seconds=rng.randint(5, 60))
            if refund.status == "awaiting_approval":
                wait = timedelta(minutes=rng.choice([3, 8, 15, 25, 45, 90, 240]))
                approve = rng.random() < 0.85
                self.later(when + wait, partial(self.approval, refund, approve))
            else:
                self.later(when, partial(self.attempt, refund))
            if rng.random() < 0.6:
                email = self.register(
                    run_id,
                    "send_email",
                    {"to": f"{customer}@example.com", "subject": "Your refund", "body": "Hi!"},
                    3,
                )
                self.later(
                    when + timedelta(minutes=1),
                    partial(self.email, email),
                )
            if rng.random() < 0.4:
                voucher = self.register(
                    run_id, "issue_voucher", {"customer_id": customer, "amount_cents": 500}, 3
                )
                self.later(when + timedelta(minutes=2), partial(self.voucher, voucher))
        if days_ago == 9:
            self.cancelled_run()
        if days_ago == 5:
            self.exhausted_run()

    def attempt(self, op: Operation) -> None:
        """Claim a refund and report; one in four times the provider times out."""
        number = self.claim(op)
        if self.rng.random() < 0.25:
            op = self.outcome(op, number, kind="unknown", code="timeout", detail="504 after send")
            self.reconcile_later(op)
        else:
            self.outcome(op, number, kind="succeeded", downstream_id=f"re_{op.id[-8:]}", cost=0.01)

    def approval(self, op: Operation, approve: bool) -> None:
        if not approve:
            self.decide(op, "approver", False, "Refund exceeds the order total; ask the customer.")
            return
        self.decide(op, "approver", True, "Matches the support ticket.")
        self.later(
            timezone.now() + timedelta(seconds=self.rng.randint(5, 90)),
            lambda: self.attempt(op),
        )

    def reconcile_later(self, op: Operation) -> None:
        """Support (or the runner's own lookup) answers some hours later."""
        delay = timedelta(hours=self.rng.choice([1, 2, 5, 9, 20, 30]))
        by_person = self.rng.random() < 0.5
        runner = self.runner
        assert runner is not None

        def action() -> None:
            if by_person:
                services.operation_resolve(
                    operation=op,
                    user=self.people["support"],
                    result="committed",
                    downstream_id=f"re_{op.id[-8:]}",
                    note="Found the refund in the provider dashboard by idempotency key.",
                )
            else:
                services.operation_reconcile(
                    operation=op,
                    result="committed",
                    actor=services.Actor.of_runner(runner),
                    downstream_id=f"re_{op.id[-8:]}",
                    evidence={"lookup": "GET /refunds?idempotency_key=...", "status": 200},
                )

        self.later(timezone.now() + delay, action)

    def email(self, op: Operation) -> None:
        number = self.claim(op)
        if self.rng.random() < 0.1:
            self.outcome(
                op, number, kind="failed", code="invalid_recipient", detail="550 no such user"
            )
        else:
            self.outcome(
                op, number, kind="succeeded", downstream_id=f"msg_{op.id[-8:]}", cost=0.001
            )

    def voucher(self, op: Operation) -> None:
        number = self.claim(op)
        if self.rng.random() < 0.2:
            op = self.outcome(op, number, kind="unknown", code="timeout")
            assert self.runner is not None
            runner = self.runner
            self.later(
                timezone.now() + timedelta(minutes=10),
                lambda: services.operation_compensate(
                    operation=op,
                    result="committed",
                    actor=services.Actor.of_runner(runner),
                    evidence={"voided": True},
                ),
            )
        else:
            self.outcome(
                op, number, kind="succeeded", downstream_id=f"vch_{op.id[-8:]}", cost=0.002
            )

    def cancelled_run(self) -> None:
        run_id = self.run("user:cus_4711", max_tool_calls=8)
        self.register(
            run_id, "send_email", {"to": "cus_4711@example.com", "subject": "Hello", "body": "…"}, 1
        )
        self.later(
            timezone.now() + timedelta(minutes=4),
            lambda: services.run_cancel(
                run=Run.objects.get(pk=run_id),
                actor=services.Actor.of_user(self.people["operator"]),
            ),
        )

    def exhausted_run(self) -> None:
        """A voucher that is rate-limited on both of its attempts ends budget_exhausted."""
        run_id = self.run("user:cus_5150", max_tool_calls=3)
        op = self.register(
            run_id, "issue_voucher", {"customer_id": "cus_5150", "amount_cents": 900}, 1
        )
        self.outcome(op, self.claim(op), kind="failed", code="rate_limited")

        def second() -> None:
            self.outcome(op, self.claim(op), kind="failed", code="rate_limited")

        self.later(timezone.now() + timedelta(seconds=5), second)

    def current_states(self) -> None:
        """What waits for people right now: one operation in every interesting state."""
        now = self.now
        ago = lambda **kw: now - timedelta(**kw)  # noqa: E731

        def setup_now() -> None:
            run_id = self.run(
                "user:cus_2024", max_tool_calls=10, max_spend=0.05, max_turns=6, deadline_s=8 * 3600
            )
            self.state_run = run_id

        self.clock.at(ago(hours=6), setup_now)

        def unknown_with_proposal() -> None:
            op = self.register(
                self.state_run,
                "send_refund",
                {"payment_id": "pay_9001", "amount_cents": 25000, "reason": "late delivery"},
                1,
            )
            op = self.outcome(
                op, self.claim(op), kind="unknown", code="timeout", detail="read timeout"
            )
            self.later(
                ago(hours=4),
                lambda: services.operation_resolve(
                    operation=op,
                    user=self.people["support"],
                    result="not_found",
                    note="No refund with this key in the provider dashboard.",
                ),
            )

        self.clock.at(ago(hours=5, minutes=30), unknown_with_proposal)

        def unknown() -> None:
            op = self.register(
                self.state_run,
                "send_refund",
                {"payment_id": "pay_9002", "amount_cents": 8000, "reason": "wrong size"},
                2,
            )
            self.outcome(op, self.claim(op), kind="unknown", code="connection_reset")

        self.clock.at(ago(hours=2), unknown)

        def compensating() -> None:
            op = self.register(
                self.state_run, "issue_voucher", {"customer_id": "cus_2024", "amount_cents": 700}, 3
            )
            self.outcome(op, self.claim(op), kind="unknown", code="timeout", cost=0.04)

        self.clock.at(ago(minutes=50), compensating)

        def pending_refund() -> None:
            self.register(
                self.state_run,
                "send_refund",
                {"payment_id": "pay_9003", "amount_cents": 75000, "reason": "order never arrived"},
                4,
            )

        self.clock.at(ago(minutes=40), pending_refund)

        def approved_unclaimed() -> None:
            run_id = self.run("user:cus_3141")
            op = self.register(
                run_id, "send_refund", {"payment_id": "pay_9004", "amount_cents": 90000}, 1
            )
            self.later(
                ago(minutes=30), lambda: self.decide(op, "approver", True, "Checked the ticket.")
            )

        self.clock.at(ago(minutes=45), approved_unclaimed)

        def quorum() -> None:
            run_id = self.run("user:cus_2718")
            op = self.register(run_id, "delete_account", {"customer_id": "cus_2718"}, 1)
            self.later(
                ago(hours=2),
                lambda: self.decide(op, "approver2", True, "GDPR erasure request #881 verified."),
            )

        self.clock.at(ago(hours=3), quorum)

        def old_request() -> None:
            run_id = self.run("user:cus_1618")
            self.register(run_id, "delete_account", {"customer_id": "cus_1618"}, 1)

        self.clock.at(ago(hours=27), old_request)

        def ready_and_executing() -> None:
            run_id = self.run("user:cus_1414", max_tool_calls=4)
            self.register(
                run_id,
                "send_email",
                {"to": "cus_1414@example.com", "subject": "Order update", "body": "…"},
                1,
            )
            lookup = self.register(run_id, "lookup_order", {"order_id": "ord_1414"}, 2)
            assert self.runner is not None
            services.attempt_claim(operation=lookup, runner=self.runner, lease_s=3600)

        self.clock.at(ago(minutes=3), ready_and_executing)


def demo_people() -> dict[str, Any]:
    users = get_user_model()
    people = {}
    for username, (password, _) in PEOPLE.items():
        user = users.objects.filter(username=username).first()
        if user is None:
            user = users.objects.create_user(username, password=password)
        people[username] = user
    return people


def grant_permissions(people: dict[str, Any]) -> None:
    """Groups and object permissions of the demo people (made only if missing)."""
    for name, (perm, tools) in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=name)
        for tool in Tool.objects.filter(pk__in=tools):
            assign_perm(perm, group, tool)
    people["approver"].groups.add(Group.objects.get(name="Approvers"))
    people["approver2"].groups.add(Group.objects.get(name="Approvers"))
    people["support"].groups.add(Group.objects.get(name="Support"))
    operator = people["operator"]
    for tool in Tool.objects.filter(
        pk__in=["send_refund", "send_email", "issue_voucher", "lookup_order", "delete_account"]
    ):
        assign_perm("operations.reconcile_tool", operator, tool)
        assign_perm("operations.activate_tool", operator, tool)
    operator.user_permissions.add(
        Permission.objects.get(content_type__app_label="operations", codename="change_run")
    )


class Command(BaseCommand):
    help = "Create demo tools, runs, operations and console users (once)."

    def handle(self, *args: Any, **options: Any) -> None:
        # Not one transaction: the services commit each registration, claim and outcome
        # on its own (durable transactions), as they do for a real runner. A seed that
        # stops half-way leaves a demo database to delete (var/), never a wrong ledger.
        with transaction.atomic():
            people = demo_people()
        if Runner.objects.filter(name=MARKER_RUNNER).exists():
            grant_permissions(people)
            self.stdout.write("Demo data exists (runner demo-agent); nothing added.")
        else:
            demo = Demo(timezone.now().astimezone(UTC), people)
            demo.setup()
            demo.clock.run()
            self.stdout.write(
                f"Demo data created: {Operation.objects.filter(runner=demo.runner).count()} "
                "operations over two weeks."
            )
        self.stdout.write("Demo console users (local demo only; these passwords are fixed):")
        for username, (password, role) in PEOPLE.items():
            self.stdout.write(f"  {username:<10} password {password:<15} {role}")
