"""Random sequences of API calls, with time travel, checked against the ledger's
invariants after every step (hypothesis RuleBasedStateMachine).

A runner registers operations of tools of every effect class (one with a concurrency
key, one that asks for approval above an amount), claims, heartbeats, posts every kind
of outcome (also for old attempts: late outcomes), reconciles, compensates, cancels
runs; people approve or reject through ``services.approval_decide``; time jumps and the
sweep runs. After each step:

1. at most one attempt is in flight per operation, and per concurrency-key value;
2. no transition leaves a terminal state (except cancelled -> succeeded, a late
   success), and an attempt in flight belongs to an executing operation;
3. every transition has its event: each event starts where the previous one ended and
   the operation's status is its last event's ``to``;
4. every hash chain verifies (``operations.audit.chains_verify``), and every state row
   follows from the events (``operations.audit.state_verify``);
5. no request is answered 5xx;
6. an operation that the original approval rule of ``pay`` matches (an amount above
   500, under whatever field name) never gets an attempt without a grant, however the
   runner rewrites the contract (renamed or retyped fields, dropped rules, a weaker
   mode or threshold): only a person could lower the guard, and no person activates
   anything here;
7. people's policies and standing grants: two stewards put one of a few fixed policies
   in force (a forbid above an amount on ``undo``, a require above another on ``idem``,
   a plain permit; the author alone is refused) and retire them; people issue standing
   grants for ``pay`` and ``idem`` pinned to an amount and revoke them; registrations
   fall around the bounds. The machine keeps its own record of what was in force and
   which standing grants were live at each registration, and checks against it that
   nothing an active forbid matched was written (403 ``forbidden_by_policy``, no
   operation); that every claimed operation that needed approval (by its contract, a
   policy in force, or the runner's asking) holds a grant for its exact intent hash,
   from a person's decision or from a standing grant that was live, covers its family
   and had a use left; and that an operation an active require matched waited for a
   person unless such a standing grant covered it.

Each example runs inside a savepoint that is rolled back, so examples are independent.
STATEFUL_EXAMPLES (default 30) and STATEFUL_STEPS (default 25) bound the work; runs are
derandomized (the same sequences every time, so CI is stable) unless FUZZ_RANDOM is set.
"""

import contextlib
import itertools
import os
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Count, F, Q
from guardian.shortcuts import assign_perm
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from approvals.errors import PermissionRefused, Refusal
from approvals.models import ApprovalRequest, Decision, Grant, StandingGrant
from operations import audit, services
from operations.machine import BLOCKING, TERMINAL, EventKind, Status
from operations.models import Attempt, Event, Operation, Tool
from operations.policies.errors import PolicyInvalid
from operations.services import policies
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner
from tests.security.conftest import steward

from .conftest import count

# Minutes of random sequences: in `make test` and CI, not in `make check`.
pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("STATEFUL_EXAMPLES", "30"))
STEPS = int(os.environ.get("STATEFUL_STEPS", "25"))
START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

LEADS = "Fuzz leads"
TOOLS = {
    "idem": contract("idempotent", concurrency_key="/payment_id"),
    "dedup": contract(
        "deduplicated",
        retry={
            "max_attempts": 2,
            "retryable_codes": ["rate_limited"],
            "base_delay_ms": 0,
            "max_delay_ms": 0,
            "deadline_s": 600,
        },
    ),
    "undo": contract("compensable"),
    "pay": contract(
        "irreversible",
        approval={
            "mode": "rules",
            "rules": [{"path": "/amount_cents", "op": "gt", "value": 500}],
            "request_ttl_s": 900,
            "grant_ttl_s": 300,
            "editable": ["/amount_cents"],
            "escalate_after_s": 60,
            "escalate_to": LEADS,
        },
        concurrency_key="/payment_id",
    ),
    "look": contract("read_only"),
}
PAY_APPROVAL = TOOLS["pay"]["approval"]
PAY_SCHEMA = TOOLS["pay"]["input_schema"]


def _pay(**changes) -> dict:
    return {**TOOLS["pay"], **changes}


def _schema(properties: dict, required: list[str]) -> dict:
    return {**PAY_SCHEMA, "properties": properties, "required": required}


# What a runner with a leaked token may try on the tool that guards money.
PAY_REWRITES = [
    TOOLS["pay"],
    _pay(  # the amount renamed; the rule follows it
        input_schema=_schema(
            {"payment_id": {"type": "string"}, "amount": {"type": "integer", "minimum": 1}},
            ["payment_id", "amount"],
        ),
        approval={
            **PAY_APPROVAL,
            "rules": [{"path": "/amount", "op": "gt", "value": 500}],
            "editable": ["/amount"],
        },
    ),
    _pay(  # the amount renamed, the rule left on a path the schema no longer has
        input_schema=_schema(
            {"payment_id": {"type": "string"}, "amount": {"type": "integer", "minimum": 1}},
            ["payment_id", "amount"],
        ),
    ),
    _pay(  # the amount optional
        input_schema=_schema(PAY_SCHEMA["properties"], ["payment_id"]),
    ),
    _pay(approval={"mode": "never"}),
    _pay(
        approval={**PAY_APPROVAL, "rules": [{"path": "/amount_cents", "op": "gt", "value": 5000}]}
    ),
    _pay(  # stronger: one more optional field
        input_schema=_schema(
            {**PAY_SCHEMA["properties"], "memo": {"type": "string"}}, PAY_SCHEMA["required"]
        ),
    ),
]
# The policies stewards put in force, by id: what each says, and of which registrations
# (tool, amount) the machine's own record says it speaks.
FORBID_ABOVE, REQUIRE_ABOVE = 700, 300
POLICIES = {
    "fz-forbid": f"""@id("fz-forbid")
@message("No undoable change above {FORBID_ABOVE}")
forbid(principal, action == Action::"register", resource == Tool::"undo")
when {{ context.arguments.amount_cents > {FORBID_ABOVE} }};""",
    "fz-require": f"""@id("fz-require")
@message("Idempotent calls above {REQUIRE_ABOVE} need two people")
@approval("required")
@approvals_required("2")
permit(principal, action == Action::"register", resource == Tool::"idem")
when {{ context.arguments has amount_cents &&
       context.arguments.amount_cents > {REQUIRE_ABOVE} }};""",
    "fz-permit": """@id("fz-permit")
permit(principal, action == Action::"register", resource);""",
}
AMOUNTS = [100, REQUIRE_ABOVE, REQUIRE_ABOVE + 1, 500, 501, FORBID_ABOVE, FORBID_ABOVE + 1, 900]
# Standing grants: for the tool a contract rule guards and the one a policy does, each
# pinned to an amount at most this.
STANDING_TOOLS = ["pay", "idem"]
STANDING_PINS = [REQUIRE_ABOVE + 1, FORBID_ABOVE]


def _forbidden(tool: str, arguments: dict, in_force: frozenset[str]) -> bool:
    return (
        "fz-forbid" in in_force
        and tool == "undo"
        and arguments.get("amount_cents", 0) > FORBID_ABOVE
    )


# The quorum fz-require asks for; the contracts ask for one.
POLICY_QUORUM = 2


def _required_by_policy(tool: str, arguments: dict, in_force: frozenset[str]) -> bool:
    return (
        "fz-require" in in_force
        and tool == "idem"
        and arguments.get("amount_cents", 0) > REQUIRE_ABOVE
    )


OUTCOMES = [
    {"kind": "succeeded", "downstream_id": "re_1", "cost": 0.5},
    {"kind": "failed", "code": "not_sent"},
    {"kind": "failed", "code": "rate_limited", "retry_after_ms": 100},
    {"kind": "failed", "code": "invalid_arguments", "detail": "bad"},
    {"kind": "unknown", "code": "timeout_unknown"},
]


class World:
    """What every example shares: made once per test, outside the examples' savepoints."""

    def __init__(self) -> None:
        self.api = make_runner()
        for name, body in TOOLS.items():
            self.api.tool(name, body)
        self.approvers = [person(), person()]
        for user in self.approvers:
            for name in TOOLS:
                assign_perm("operations.decide_tool", user, Tool.objects.get(pk=name))
        # Holds no permission: decides only what was escalated to the group.
        self.lead = person()
        self.lead.groups.add(Group.objects.create(name=LEADS))
        self.stewards = [steward(), steward()]


class Ledger(RuleBasedStateMachine):
    world: World

    def __init__(self) -> None:
        super().__init__()
        self.atomic = transaction.atomic()
        # Each example rolls back like a Django TestCase, whose blocks the hot path's
        # durable transactions accept as the outermost (Atomic._from_testcase).
        self.atomic._from_testcase = True
        self.atomic.__enter__()
        self.clock = time_machine.travel(START, tick=False)
        self.traveller = self.clock.start()
        self.api = self.world.api
        self.run_id = ""
        self.keys = 0
        self.op_ids: list[str] = []
        # The machine's own record: the policies in force, the standing grants live
        # (id -> tool, pinned amount, uses), and each registration it sent with what was
        # in force and live then.
        self.in_force: set[str] = set()
        self.standing: dict[str, dict] = {}
        self.quorums: dict[str, int] = {}
        self.attempts: list[dict] = []
        policies.forget()

    def teardown(self) -> None:
        self.clock.stop()
        transaction.set_rollback(True)
        self.atomic.__exit__(None, None, None)

    def _ok(self, response) -> dict:
        count("stateful requests")
        assert response.status_code < 500, response.content[:500]
        return response.json() if response.content else {}

    @initialize()
    def start_run(self) -> None:
        self.run_id = self._ok(self.api.post("/api/v1/runs", {"principal": "user:somebody"}))["id"]

    def _pick(self, data, *statuses: str) -> str | None:
        """An operation of this example: usually one in ``statuses`` (where the rule
        means something), sometimes any (where it must be refused)."""
        # In registration order: ids are random, and a replayed example must see the
        # same choices in the same order.
        current = dict(Operation.objects.filter(pk__in=self.op_ids).values_list("id", "status"))
        wanted = [op for op in self.op_ids if current[op] in statuses]
        if not wanted or data.draw(st.integers(0, 3), label="any operation") == 0:
            wanted = self.op_ids
        if not wanted:
            return None
        return data.draw(st.sampled_from(wanted), label="operation")

    def _attempt(self, data, op: str) -> int:
        latest = Operation.objects.get(pk=op).attempts
        return max(1, latest - data.draw(st.integers(0, 2), label="attempts back"))

    @rule(data=st.data())
    def register(self, data) -> None:
        self._register(data)

    @rule(data=st.data())
    def register_another(self, data) -> None:
        # A second door to the same step: registrations are what everything else needs.
        self._register(data)

    @staticmethod
    def _amount_field(tool: str) -> str:
        """The amount's name in the tool's active schema (a rewrite may rename it)."""
        properties = Tool.objects.get(pk=tool).active_version.contract["input_schema"]["properties"]
        return "amount" if "amount" in properties else "amount_cents"

    @rule(data=st.data())
    def register_a_payment(self, data) -> None:
        # The tool whose contract the runner rewrites: registered often enough that a
        # rewrite is followed by payments under it.
        self._register(data, tool="pay")

    def _register(self, data, tool: str | None = None, amounts: list[int] = AMOUNTS) -> None:
        tool = tool or data.draw(st.sampled_from(sorted(TOOLS)), label="tool")
        body = {
            "run": self.run_id,
            "tool": tool,
            "operation_key": f"k{self.keys}",
            "arguments": {
                "payment_id": data.draw(st.sampled_from(["p1", "p2"]), label="payment"),
                self._amount_field(tool): data.draw(st.sampled_from(amounts), label="amount"),
            },
        }
        self.keys += 1
        if data.draw(st.booleans(), label="claim at once"):
            body["claim"] = {"lease_s": data.draw(st.sampled_from([5, 60]), label="lease")}
        asked = data.draw(st.integers(0, 9), label="ask") == 0
        if asked:
            body["approval"] = {"require": True, "reason": "the agent is unsure"}
        now = datetime.now(UTC)
        live = frozenset(g for g, known in self.standing.items() if known["expires_at"] > now)
        # Alone, or as a batch (api.md, Batches) whose item answers as the single call.
        if data.draw(st.integers(0, 3), label="in a batch") == 0:
            repeat = data.draw(st.booleans(), label="twice in the batch")
            batch = self._ok(
                self.api.post("/api/v1/operations", [body, body] if repeat else [body])
            )
            item = batch["results"][0]
            status_code, answer = item["status"], item.get("operation") or item["problem"]
            if repeat:  # the same key and intent again: the same operation or refusal
                again = batch["results"][1]
                if "id" in answer:
                    assert (again["status"], again["operation"]["id"]) == (200, answer["id"])
                else:
                    assert again["problem"]["code"] == answer["code"], batch
        else:
            response = self.api.post("/api/v1/operations", body)
            status_code, answer = response.status_code, self._ok(response)
        self.attempts.append(
            {
                "tool": tool,
                "key": body["operation_key"],
                "arguments": body["arguments"],
                "asked": asked,
                "in_force": frozenset(self.in_force),
                "live": live,
                "status_code": status_code,
                "answer": answer,
            }
        )
        if "id" in answer and answer["id"] not in self.op_ids:
            self.op_ids.append(answer["id"])

    @rule(rewrite=st.sampled_from(PAY_REWRITES))
    def runner_rewrites_the_pay_contract(self, rewrite) -> None:
        count("contract changes")
        self._ok(self.api.put("/api/v1/tools/pay", rewrite))

    @initialize(absent=st.sampled_from([None, *sorted(POLICIES)]), quorum=st.integers(1, 2))
    def people_start_with_policies_and_standing_grants(self, absent, quorum) -> None:
        # Every example starts with policies in force (all, or all but one) and a
        # standing grant for each guarded tool: the registrations under them are what
        # the invariants of both need, and a derandomized run must meet them every time.
        # The rules then retire, activate, issue and revoke. Signed by one person, the
        # grant for idem must not cover what fz-require asks two people for.
        for policy in sorted(POLICIES):
            if policy != absent:
                self.stewards_put_a_policy_in_force(policy, author=0, activator=1)
        # The first to expire, so the first a use would take: revoked at once, it must
        # cover nothing.
        self.people_issue_a_standing_grant("idem", REQUIRE_ABOVE + 1, uses=3, quorum=2, who=1)
        revoked = next(iter(self.standing))
        services.standing_grant_revoke(
            grant_id=revoked, user=self.world.approvers[0], reason="stale"
        )
        del self.standing[revoked]
        self.people_issue_a_standing_grant("idem", REQUIRE_ABOVE + 1, uses=3, quorum=quorum, who=0)
        self.people_issue_a_standing_grant("pay", FORBID_ABOVE, uses=2, quorum=1, who=1)

    @rule(data=st.data(), burst=st.integers(1, 3))
    def register_around_the_policy_bounds(self, data, burst) -> None:
        # A few registrations at once, at and just past the bound of the tool's policy.
        for _ in range(burst):
            tool = data.draw(st.sampled_from(["undo", "idem"]), label="tool")
            bound = FORBID_ABOVE if tool == "undo" else REQUIRE_ABOVE
            self._register(data, tool=tool, amounts=[bound, bound + 1, 900])

    @rule(
        policy=st.sampled_from(sorted(POLICIES)),
        author=st.integers(0, 1),
        activator=st.integers(0, 1),
    )
    def stewards_put_a_policy_in_force(self, policy, author, activator) -> None:
        """One steward writes, another (or, refused, the same) activates."""
        count("policy activations tried")
        stewards = self.world.stewards
        version = services.policies.policy_write(user=stewards[author], text=POLICIES[policy])
        try:
            services.policies.policy_activate(user=stewards[activator], policy_id=policy)
        except PermissionRefused:
            # Four eyes: the text's author may not put it in force alone.
            assert version.written_by_id == stewards[activator].pk
            return
        except PolicyInvalid:
            assert policy in self.in_force  # already in force
            return
        assert version.written_by_id != stewards[activator].pk
        self.in_force.add(policy)

    @rule(policy=st.sampled_from(sorted(POLICIES)), who=st.integers(0, 1))
    def a_steward_retires_a_policy(self, policy, who) -> None:
        with contextlib.suppress(PolicyInvalid):  # never written in this example
            services.policies.policy_retire(user=self.world.stewards[who], policy_id=policy)
            self.in_force.discard(policy)

    @rule(
        tool=st.sampled_from(STANDING_TOOLS),
        most=st.sampled_from(STANDING_PINS),
        uses=st.integers(1, 3),
        quorum=st.integers(1, 2),
        who=st.integers(0, 1),
    )
    def people_issue_a_standing_grant(self, tool, most, uses, quorum, who) -> None:
        """One person issues, and with a quorum of two the other signs."""
        count("standing grants issued")
        # A second passes for each: grants that expire at the same time are used in the
        # order of their random ids, which a replayed example must not depend on.
        self.traveller.shift(timedelta(seconds=1))
        expires_at = datetime.now(UTC) + timedelta(hours=1)
        issuer, other = self.world.approvers[who], self.world.approvers[1 - who]
        grant = services.standing_grant_issue(
            services.StandingTerms(
                tool=tool,
                max_uses=uses,
                expires_at=expires_at,
                pins=[{"path": "/amount_cents", "op": "lte", "value": most}],
                approvals_required=quorum,
            ),
            user=issuer,
            otp_verified=True,
        )
        if quorum == 2:
            assert grant.status == "proposed"
            services.standing_grant_sign(grant_id=grant.id, user=other, otp_verified=True)
        assert StandingGrant.objects.get(pk=grant.id).status == "active"
        self.quorums[grant.id] = quorum
        self.standing[grant.id] = {
            "tool": tool,
            "most": most,
            "uses": uses,
            "expires_at": expires_at,
        }

    @rule(data=st.data(), who=st.integers(0, 1))
    def a_person_revokes_a_standing_grant(self, data, who) -> None:
        if not self.standing:
            return
        # In the order they were issued: ids are random, and a replayed example must
        # make the same choice.
        grant = data.draw(st.sampled_from(list(self.standing)), label="standing grant")
        services.standing_grant_revoke(
            grant_id=grant, user=self.world.approvers[who], reason="enough"
        )
        del self.standing[grant]

    @rule(data=st.data(), lease=st.sampled_from([5, 60]))
    def claim(self, data, lease) -> None:
        op = self._pick(data, Status.READY, Status.EXECUTING)
        if op:
            self._ok(self.api.post(f"/api/v1/operations/{op}/attempts", {"lease_s": lease}))

    @rule(data=st.data())
    def heartbeat(self, data) -> None:
        op = self._pick(data, Status.EXECUTING)
        if op:
            number = self._attempt(data, op)
            path = f"/api/v1/operations/{op}/attempts/{number}/heartbeat"
            self._ok(self.api.post(path, {"lease_s": 60}))

    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def outcome(self, data, outcome) -> None:
        op = self._pick(data, Status.EXECUTING)
        if op:
            number = self._attempt(data, op)
            if data.draw(st.booleans(), label="in an outcome batch"):
                item = {"operation": op, "attempt": number, **outcome}
                batch = self._ok(self.api.post(f"/api/v1/runs/{self.run_id}/outcomes", [item]))
                assert batch["results"][0]["status"] < 500, batch
            else:
                path = f"/api/v1/operations/{op}/attempts/{number}/outcome"
                self._ok(self.api.post(path, outcome))

    @rule(data=st.data(), size=st.integers(2, 4))
    def outcomes_of_several_in_one_batch(self, data, size) -> None:
        """Several outcomes in one batch (the set-based write on PostgreSQL): the
        operations picked as a single outcome picks them, the same one possibly twice,
        each item with its own outcome; every item answers without a server error, and
        the invariants hold after."""
        items = []
        for _ in range(size):
            op = self._pick(data, Status.EXECUTING)
            if op is None:
                return
            outcome = data.draw(st.sampled_from(OUTCOMES), label="outcome")
            items.append({"operation": op, "attempt": self._attempt(data, op), **outcome})
        batch = self._ok(self.api.post(f"/api/v1/runs/{self.run_id}/outcomes", items))
        assert len(batch["results"]) == size, batch
        assert all(item["status"] < 500 for item in batch["results"]), batch

    @rule(data=st.data(), result=st.sampled_from(["committed", "not_found", "still_unknown"]))
    def reconcile(self, data, result) -> None:
        op = self._pick(data, Status.OUTCOME_UNKNOWN)
        if op:
            body = {"result": result, "downstream_id": "re_2", "evidence": {"looked": True}}
            self._ok(self.api.post(f"/api/v1/operations/{op}/reconciliations", body))

    @rule(data=st.data(), result=st.sampled_from(["committed", "failed"]))
    def compensate(self, data, result) -> None:
        op = self._pick(data, Status.COMPENSATING)
        if op:
            body = {"result": result}
            self._ok(self.api.post(f"/api/v1/operations/{op}/compensations", body))

    def _pending_request(self) -> ApprovalRequest | None:
        return ApprovalRequest.objects.filter(
            status="pending", operation__runner=self.api.runner
        ).first()

    @rule(approve=st.booleans(), who=st.integers(0, 1))
    def decide(self, approve, who) -> None:
        pending = self._pending_request()
        if pending is None:
            return
        # An expired request or a second decision by the same person is refused.
        with contextlib.suppress(Refusal):
            services.approval_decide(
                request_id=pending.id,
                user=self.world.approvers[who],
                approve=approve,
                comment="" if approve else "not this one",
            )

    @rule(amount=st.sampled_from([0, 1, 400, 501, 90000]), who=st.integers(0, 1))
    def approve_with_a_changed_amount(self, amount, who) -> None:
        pending = self._pending_request()
        if pending is None:
            return
        # Refused when not editable there, out of the schema (0), expired or decided.
        with contextlib.suppress(Refusal):
            decided = services.approval_decide(
                request_id=pending.id,
                user=self.world.approvers[who],
                approve=True,
                comment="changed",
                edits={"/amount_cents": amount},
            )
            if decided.id != pending.operation_id:
                count("stateful edits approved")
        successors = Operation.objects.filter(runner=self.api.runner).exclude(pk__in=self.op_ids)
        self.op_ids.extend(successors.order_by("id").values_list("id", flat=True))

    @rule()
    def a_lead_decides_what_was_escalated(self) -> None:
        pending = self._pending_request()
        if pending is None:
            return
        # Refused unless the request was escalated to the lead's group.
        with contextlib.suppress(Refusal):
            services.approval_decide(
                request_id=pending.id, user=self.world.lead, approve=True, comment=""
            )
            assert pending.escalate_to == LEADS
            pending.refresh_from_db()
            assert pending.escalated_at is not None
            count("stateful escalated decisions")

    @rule(data=st.data())
    def cancel_run(self, data) -> None:
        # Hypothesis favours rules without arguments; a cancelled run ends everything
        # waiting, so let only one draw in five cancel.
        if data.draw(st.integers(0, 4), label="cancel") == 0:
            self._ok(self.api.post(f"/api/v1/runs/{self.run_id}/cancel", {}))
            self.start_run()

    @rule(seconds=st.sampled_from([1, 10, 61, 400, 1000, 4000]))
    def time_passes_and_the_sweep_runs(self, seconds) -> None:
        self.traveller.shift(timedelta(seconds=seconds))
        services.sweep()

    # --- invariants -----------------------------------------------------------------

    @invariant()
    def one_attempt_in_flight_per_operation_and_key(self) -> None:
        count("stateful checks")
        in_flight = Attempt.objects.filter(status=Attempt.AttemptStatus.EXECUTING)
        doubled = in_flight.values("operation").annotate(n=Count("id")).filter(n__gt=1)
        assert not doubled.exists(), list(doubled)
        per_key = (
            in_flight.exclude(operation__concurrency_value=None)
            .values("operation__tool", "operation__concurrency_value")
            .annotate(n=Count("id"))
            .filter(n__gt=1)
        )
        assert not per_key.exists(), list(per_key)
        blocking = (
            Operation.objects.filter(status__in=[s.value for s in BLOCKING])
            .exclude(concurrency_value=None)
            .values("tool", "concurrency_value")
            .annotate(n=Count("id"))
            .filter(n__gt=1)
        )
        assert not blocking.exists(), list(blocking)
        stray = in_flight.exclude(operation__status=Status.EXECUTING)
        assert not stray.exists(), list(stray.values("operation_id", "operation__status"))

    @invariant()
    def nothing_leaves_a_terminal_state(self) -> None:
        terminal = [s.value for s in TERMINAL]
        escaped = Event.objects.filter(from_status__in=terminal).exclude(
            Q(to_status=F("from_status"))
            | Q(from_status=Status.CANCELLED, to_status=Status.SUCCEEDED)
        )
        assert not escaped.exists(), list(
            escaped.values_list("stream", "seq", "kind", "from_status", "to_status")
        )

    @invariant()
    def every_transition_has_its_event(self) -> None:
        for op in Operation.objects.filter(runner=self.api.runner):
            events = list(
                Event.objects.filter(stream=op.id)
                .order_by("seq")
                .values_list("kind", "from_status", "to_status")
            )
            assert events, op.id
            for previous, current in itertools.pairwise(events):
                assert current[1] == previous[2], (op.id, previous, current)
            assert events[-1][2] == op.status, (op.id, events[-1], op.status)

    @invariant()
    def a_large_payment_never_runs_unapproved(self) -> None:
        claimed = Operation.objects.filter(runner=self.api.runner, tool_id="pay", attempts__gt=0)
        for op in claimed:
            amounts = [value for value in op.arguments.values() if isinstance(value, int)]
            if max(amounts, default=0) > 500:
                assert Grant.objects.filter(request__operation=op).exists(), (
                    op.id,
                    op.arguments,
                    op.tool_version.number,
                )

    @invariant()
    def nothing_an_active_forbid_matched_was_written(self) -> None:
        keys = set(
            Operation.objects.filter(runner=self.api.runner).values_list("operation_key", flat=True)
        )
        for attempt in self.attempts:
            refused = (
                attempt["status_code"] == 403
                and attempt["answer"].get("code") == "forbidden_by_policy"
            )
            if _forbidden(attempt["tool"], attempt["arguments"], attempt["in_force"]):
                count("stateful forbidden registrations")
                assert refused, attempt
                assert attempt["answer"]["policy"] == "fz-forbid", attempt
                assert attempt["key"] not in keys, attempt
            else:
                assert not refused, attempt

    @invariant()
    def every_use_of_a_standing_grant_was_one_people_signed_for(self) -> None:
        # Claimed or not: the use itself approved the intent.
        by_key = {attempt["key"]: attempt for attempt in self.attempts}
        used = Grant.objects.filter(
            request__operation__runner=self.api.runner,
            request__operation__operation_key__in=list(by_key),
            standing_grant__isnull=False,
        ).select_related("request__operation")
        for grant in used:
            op = grant.request.operation
            count("stateful standing grant uses")
            self._covering_grant(op, by_key[op.operation_key], grant=grant)

    def _covering_grant(
        self, op: Operation, attempt: dict, grant: Grant | None = None
    ) -> Grant | None:
        """The grant for ``op``'s exact intent, if one was given on the quorum the
        policies in force asked for, by people or by a standing grant that was live at
        the registration, covers the intent and was signed by as many."""
        quorum = (
            POLICY_QUORUM
            if _required_by_policy(op.tool_id, attempt["arguments"], attempt["in_force"])
            else 1
        )
        grant = grant or (
            Grant.objects.filter(request__operation=op, intent_hash=op.intent_hash)
            .order_by("created_at")
            .first()
        )
        if grant is None:
            return None
        if grant.standing_grant_id is None:
            # A person's grant: as many people as the quorum approved this request.
            approving = Decision.objects.filter(
                request_id=grant.request_id, decision=Decision.Verdict.APPROVE
            )
            assert approving.count() >= quorum, (op.id, grant.id, quorum)
            return grant
        assert grant.intent_hash == op.intent_hash, (op.id, grant.id)
        standing = StandingGrant.objects.get(pk=grant.standing_grant_id)
        assert not attempt["asked"], ("the runner asked for a person", op.id, standing.id)
        assert standing.id in attempt["live"], ("not live at registration", op.id, standing.id)
        assert standing.family.includes(
            tool=op.tool_id, principal=op.principal, run_id=op.run_id, arguments=op.arguments
        ), ("outside its family", op.id, op.arguments, standing.pins)
        assert self.quorums[standing.id] >= quorum, ("signed by fewer", op.id, standing.id)
        return grant

    @invariant()
    def what_needed_approval_ran_only_on_a_grant_for_its_intent(self) -> None:
        by_key = {attempt["key"]: attempt for attempt in self.attempts}
        ops = Operation.objects.filter(
            runner=self.api.runner, operation_key__in=list(by_key), attempts__gt=0
        )
        for op in ops:
            attempt = by_key[op.operation_key]
            amounts = [value for value in attempt["arguments"].values() if isinstance(value, int)]
            needed = (
                attempt["asked"]
                or (op.tool_id == "pay" and max(amounts, default=0) > 500)
                or _required_by_policy(op.tool_id, attempt["arguments"], attempt["in_force"])
            )
            if needed:
                count("stateful approved claims")
                assert self._covering_grant(op, attempt) is not None, (op.id, attempt)

    @invariant()
    def an_active_require_made_it_wait_unless_a_standing_grant_covered_it(self) -> None:
        for attempt in self.attempts:
            if "id" not in attempt["answer"] or not _required_by_policy(
                attempt["tool"], attempt["arguments"], attempt["in_force"]
            ):
                continue
            count("stateful registrations a policy asked for")
            if attempt["answer"]["status"] == Status.AWAITING_APPROVAL:
                continue
            op = Operation.objects.get(pk=attempt["answer"]["id"])
            grant = self._covering_grant(op, attempt)
            assert grant is not None, attempt
            assert grant.standing_grant_id is not None, attempt

    @invariant()
    def no_standing_grant_gave_more_than_its_uses(self) -> None:
        for standing in StandingGrant.objects.filter(pk__in=list(self.standing)):
            given = Grant.objects.filter(standing_grant=standing).count()
            assert given <= self.standing[standing.id]["uses"], (standing.id, given)

    @invariant()
    def a_superseded_operation_never_runs_and_names_its_successor(self) -> None:
        for op in Operation.objects.filter(runner=self.api.runner, status=Status.SUPERSEDED):
            # It may have run before a person edited it: an irreversible call found not
            # to have happened asks a person again, who may change the arguments.
            kinds = list(
                Event.objects.filter(stream=op.id).order_by("seq").values_list("kind", flat=True)
            )
            after = kinds[kinds.index(EventKind.SUPERSEDED) :]
            assert EventKind.CLAIMED not in after, (op.id, kinds)
            assert op.attempts == 0 or EventKind.RECONCILED in kinds, (op.id, kinds)
            successor = Operation.objects.get(pk=op.superseded_by_id)
            assert successor.previous_id == op.id
            assert successor.run_id == op.run_id
            assert successor.operation_key.startswith(op.operation_key.split("~edit-")[0])

    @invariant()
    def the_ledger_state_follows_from_the_events(self) -> None:
        unexplained = next(iter(audit.state_verify()), None)
        assert unexplained is None, unexplained.describe()

    @invariant()
    def the_chains_verify(self) -> None:
        report = audit.chains_verify()
        assert report.ok, report.first_break.describe()


def test_random_api_sequences_keep_the_ledger_invariants(db):
    Ledger.world = World()
    Ledger.TestCase.settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=not os.environ.get("FUZZ_RANDOM"),
    )
    Ledger.TestCase().runTest()
