"""The runner client against a live Effectgate (pytest-django's live server).

Each test drives ``Runner.execute`` or ``EffectgateClient`` over real HTTP and then
checks what Effectgate stored: operations, attempts and events. Every test that goes
through ``Setup`` runs twice: with ``Runner`` and with ``AsyncRunner`` (over
``AsyncEffectgateClient``, on an event loop in its own thread), which must behave alike.
"""

import asyncio
import json
import logging
import threading
import time

import httpx
import pytest
from django.db import connection, connections
from guardian.shortcuts import assign_perm

from effectgate_client import (
    AsyncEffectgateClient,
    AsyncPollingWaiter,
    AsyncRunner,
    EffectgateClient,
    Failed,
    IntentMismatch,
    InvalidArguments,
    NotAuthenticated,
    NotFound,
    NotSent,
    OutcomeNotRecorded,
    PollingWaiter,
    Runner,
    Succeeded,
    ToolForbidden,
    Unknown,
    UnknownTool,
)
from operations import services
from operations.models import Attempt, Event, Operation, Tool
from operations.models import Runner as RunnerAccount
from tests.approvals.conftest import person
from tests.client.support import LoopThread, LosingTransport, RecordingSleep
from tests.conftest import contract, make_runner

pytestmark = pytest.mark.django_db(transaction=True)

ARGS = {"payment_id": "pay_1", "amount_cents": 500}


class Setup:
    """A runner account, a run and a runner of the given flavor (``sync``: ``Runner``,
    ``async``: ``AsyncRunner``). The test's own calls go through ``client``, the
    blocking client, on the same transport as the runner's."""

    def __init__(self, live_server, flavor="sync", transport=None, **runner_options):
        self.api = make_runner()
        self.flavor = flavor
        self.transport = transport or LosingTransport()
        self.sleep = RecordingSleep()
        self.client = EffectgateClient(
            live_server.url, self.api.token, transport=self.transport, backoff_base_s=0.01
        )
        runner_options.setdefault("lease_s", 5)
        runner_options.setdefault("wait_s", 10)
        self.loop = None
        if flavor == "sync":
            self.runner = Runner(
                self.client,
                waiter=PollingWaiter(initial_s=0.05, max_s=0.2),
                sleep=self.sleep,
                **runner_options,
            )
        else:
            self.loop = LoopThread()
            self.async_client = AsyncEffectgateClient(
                live_server.url, self.api.token, transport=self.transport, backoff_base_s=0.01
            )
            self.runner = AsyncRunner(
                self.async_client,
                waiter=AsyncPollingWaiter(initial_s=0.05, max_s=0.2),
                sleep=self.sleep.wait,
                **runner_options,
            )
        self.run = self.client.create_run(principal="user:alice")["id"]

    def tool(self, name, effect_class="irreversible", **overrides):
        overrides.setdefault("approval", {"mode": "never"})
        self.client.put_tool(name, contract(effect_class, **overrides))

    def execute(self, tool, call, key="order-1:refund", arguments=ARGS, **kwargs):
        running = self.runner.execute(
            run=self.run, tool=tool, operation_key=key, arguments=arguments, call=call, **kwargs
        )
        return running if self.loop is None else self.loop.run(running)

    def close(self):
        self.client.close()
        if self.loop is not None:
            self.loop.run(self.async_client.aclose())
            self.loop.close()


class Calls:
    """A tool function that answers from a script and records what it was given."""

    def __init__(self, *script):
        self.script = list(script)
        self.contexts = []

    def __call__(self, ctx):
        self.contexts.append(ctx)
        step = self.script.pop(0) if self.script else Succeeded(downstream_id="re_ok")
        if isinstance(step, BaseException):
            raise step
        if callable(step):
            return step(ctx)
        return step


def _closing_connections(function):
    """A thread body that closes its own database connection when done."""

    def body():
        try:
            return function()
        finally:
            connections.close_all()

    return body


async def _off_loop(function):
    """``function()`` in a worker thread: Django refuses database queries on a thread
    that runs an event loop."""
    return await asyncio.to_thread(lambda: _closing_connections(function)())


def _events(op_id, kind=None):
    events = Event.objects.filter(stream=op_id)
    if kind:
        events = events.filter(kind=kind)
    return list(events.order_by("seq"))


@pytest.fixture(params=["sync", "async"])
def make_setup(live_server, request):
    """Setups whose HTTP clients are closed after the test: an open keep-alive
    connection would keep a live-server thread, and its database connection, alive."""
    made = []

    def make(**options):
        made.append(Setup(live_server, request.param, **options))
        return made[-1]

    yield make
    for item in made:
        item.close()


@pytest.fixture
def setup(make_setup):
    return make_setup()


def test_execute_registers_claims_in_one_round_trip_calls_with_key_and_succeeds(make_setup):
    transport = LosingTransport()
    setup = make_setup(transport=transport)
    setup.tool("refund")
    calls = Calls(Succeeded(result={"refund": "re_1"}, downstream_id="re_1", cost=0.25))
    result = setup.execute("refund", calls, call_id="call_abc", turn=1)

    op = Operation.objects.get(runner=setup.api.runner, operation_key="order-1:refund")
    assert [ctx.idempotency_key for ctx in calls.contexts] == [op.idempotency_key]
    assert calls.contexts[0].attempt == 1
    assert calls.contexts[0].arguments == ARGS
    assert result.status == "succeeded"
    assert result.envelope == {
        "status": "succeeded",
        "code": None,
        "logical_operation_id": op.id,
        "message": "The call to refund succeeded (reference re_1).",
        "allowed_next_actions": [],
    }
    assert result.for_model()["result"] == {"refund": "re_1"}
    assert result.attempts == [1]
    assert (op.status, op.downstream_id, op.call_id, op.result) == (
        "succeeded",
        "re_1",
        "call_abc",
        {"refund": "re_1"},
    )
    assert float(op.run.spend) == 0.25
    # register+claim, then the outcome, whose answer carries the tool-result: two
    # requests, no separate claim and no tool-result read.
    assert [line for line in transport.sent if "/api/v1/operations" in line] == [
        "POST /api/v1/operations",
        f"POST /api/v1/operations/{op.id}/attempts/1/outcome",
    ]
    assert "tool_result" not in result.operation
    assert [e.kind for e in _events(op.id)] == ["registered", "claimed", "outcome"]


def test_lost_registration_answer_gives_back_the_same_operation(make_setup):
    # The first registration commits (with its inline claim), its answer is lost; the
    # repeat answers 200 with the same operation and claims nothing, so the attempt
    # nobody saw runs out its lease. The tool is never called for it.
    transport = LosingTransport({r"POST /api/v1/operations": 1})
    setup = make_setup(transport=transport, lease_s=1)
    setup.tool("refund")
    calls = Calls()
    result = setup.execute("refund", calls)

    assert transport.lost == ["POST /api/v1/operations"]
    assert Operation.objects.filter(runner=setup.api.runner).count() == 1
    op = Operation.objects.get(runner=setup.api.runner)
    assert calls.contexts == []
    assert op.status == "outcome_unknown"
    assert op.error_code == "lease_expired"
    assert result.status == "outcome_unknown"
    assert result.envelope["allowed_next_actions"] == ["reconcile"]
    # The client waited out the unseen attempt's lease (retry_after_ms) instead of using
    # it or hammering the claim endpoint.
    assert Attempt.objects.get(operation=op).status == "lease_expired"
    assert 1 <= transport.sent.count(f"POST /api/v1/operations/{op.id}/attempts") <= 2
    assert setup.sleep.waits
    assert max(setup.sleep.waits) <= 1.05


def test_lost_registration_answer_for_a_repeatable_tool_retries_with_the_same_key(make_setup):
    transport = LosingTransport({r"POST /api/v1/operations": 1})
    setup = make_setup(transport=transport, lease_s=1)
    setup.tool("refund", "idempotent")
    calls = Calls()
    result = setup.execute("refund", calls)

    op = Operation.objects.get(runner=setup.api.runner)
    assert result.status == "succeeded"
    assert result.attempts == [2]
    assert [ctx.attempt for ctx in calls.contexts] == [2]
    assert calls.contexts[0].idempotency_key == op.idempotency_key
    assert list(op.attempt_set.values_list("number", "status")) == [
        (1, "lease_expired"),
        (2, "succeeded"),
    ]


def test_lost_outcome_answer_is_posted_again_and_recorded_once(make_setup):
    transport = LosingTransport({r"POST /api/v1/operations/[^/]+/attempts/1/outcome": 1})
    setup = make_setup(transport=transport)
    setup.tool("refund")
    calls = Calls()
    result = setup.execute("refund", calls)

    op = Operation.objects.get(runner=setup.api.runner)
    assert len(transport.lost) == 1
    assert transport.sent.count(f"POST /api/v1/operations/{op.id}/attempts/1/outcome") == 2
    assert len(calls.contexts) == 1
    assert result.status == "succeeded"
    assert len(_events(op.id, "outcome")) == 1
    assert not _events(op.id, "outcome_conflict")


def test_lost_claim_answer_never_runs_the_tool_on_an_unseen_attempt(make_setup):
    transport = LosingTransport({r"POST /api/v1/operations/[^/]+/attempts": 1})
    setup = make_setup(transport=transport, lease_s=1)
    setup.tool("refund", "idempotent")
    op = setup.client.register(
        run=setup.run, tool="refund", operation_key="k-claim", arguments=ARGS
    )
    calls = Calls()
    result = setup.execute("refund", calls, key="k-claim")

    assert len(transport.lost) == 1
    assert result.status == "succeeded"
    # Attempt 1 was claimed by the lost request and expired unused; the tool ran once,
    # for attempt 2, with the operation's one idempotency key.
    assert [ctx.attempt for ctx in calls.contexts] == [2]
    assert list(Attempt.objects.filter(operation_id=op["id"]).values_list("number", "status")) == [
        (1, "lease_expired"),
        (2, "succeeded"),
    ]


def test_retryable_failure_waits_for_retry_after_then_succeeds(setup):
    setup.tool("refund")
    calls = Calls(Failed("rate_limited", "slow down", retry_after_ms=400))
    result = setup.execute("refund", calls)

    op = Operation.objects.get(runner=setup.api.runner)
    assert result.status == "succeeded"
    assert result.attempts == [1, 2]
    assert [ctx.idempotency_key for ctx in calls.contexts] == [op.idempotency_key] * 2
    first, second = op.attempt_set.order_by("number")
    assert first.outcome == {
        "kind": "failed",
        "code": "rate_limited",
        "detail": "slow down",
        "retry_after_ms": 400,
    }
    assert (second.claimed_at - first.closed_at).total_seconds() >= 0.4
    # The client waited as long as the refusal said (never longer), then claimed once:
    # one refused claim at most, not a loop.
    claims = setup.transport.sent.count(f"POST /api/v1/operations/{op.id}/attempts")
    assert 1 <= claims <= 2
    assert all(wait <= 0.41 for wait in setup.sleep.waits)


def test_not_sent_is_retried_and_permanent_failure_ends_the_operation(setup):
    setup.tool("refund")
    calls = Calls(NotSent("connection refused"), Failed("card_declined", "declined"))
    result = setup.execute("refund", calls)
    op = Operation.objects.get(runner=setup.api.runner)
    assert result.attempts == [1, 2]
    assert result.status == "failed_permanent"
    assert result.envelope["code"] == "card_declined"
    assert op.status == "failed_permanent"


def test_unknown_outcome_of_irreversible_tool_is_never_retried(setup):
    setup.tool("refund")
    calls = Calls(Unknown("timeout_unknown", "no answer in 5 s"))
    result = setup.execute("refund", calls)
    assert result.status == "outcome_unknown"
    assert result.envelope["allowed_next_actions"] == ["reconcile"]
    assert len(calls.contexts) == 1

    # The job runs again (a redelivery, a restarted worker): same operation, no call.
    again = setup.execute("refund", calls)
    assert again.envelope["logical_operation_id"] == result.envelope["logical_operation_id"]
    assert again.status == "outcome_unknown"
    assert again.attempts == []
    assert len(calls.contexts) == 1
    assert Operation.objects.filter(runner=setup.api.runner).count() == 1


def test_any_other_exception_is_posted_as_unknown(setup):
    setup.tool("refund")
    result = setup.execute("refund", Calls(RuntimeError("socket exploded")))
    op = Operation.objects.get(runner=setup.api.runner)
    attempt = op.attempt_set.get()
    assert (attempt.status, attempt.outcome_code) == ("unknown", "runner_exception")
    assert "RuntimeError: socket exploded" in attempt.outcome["detail"]
    assert result.status == "outcome_unknown"


def test_a_tool_exceptions_secrets_are_neither_posted_nor_logged(setup, caplog):
    setup.tool("refund")
    secret_url = "https://user:sk_live_abc@host/x?token=secret"
    error = RuntimeError(f"POST {secret_url} failed: " + "x" * 1000)
    with caplog.at_level(logging.DEBUG):
        setup.execute("refund", Calls(error))
    op = Operation.objects.get(runner=setup.api.runner)
    outcome = op.attempt_set.get().outcome
    assert outcome["detail"].startswith("RuntimeError: POST https://host/x failed: xxx")
    assert len(outcome["detail"]) == 200
    stored = json.dumps([outcome, *(event.data for event in _events(op.id))])
    for secret in ("sk_live_abc", "token=secret", "user:sk"):
        assert secret not in stored
        assert secret not in caplog.text
    assert "https://host/x failed" in caplog.text


class AnswersOutcomeWith(LosingTransport):
    """The live server for every request but an outcome, which gets ``answer`` (a
    proxy in front of Effectgate that keeps failing) without reaching it."""

    def __init__(self, answer):
        super().__init__()
        self.answer = answer

    def handle_request(self, request):
        if request.url.path.endswith("/outcome"):
            self.sent.append(f"{request.method} {request.url.path}")
            return self.answer()
        return super().handle_request(request)

    async def handle_async_request(self, request):
        if request.url.path.endswith("/outcome"):
            self.sent.append(f"{request.method} {request.url.path}")
            return self.answer()
        return await super().handle_async_request(request)


@pytest.mark.parametrize(
    "answer",
    [
        lambda: httpx.Response(502, text="bad gateway", headers={"X-Request-Id": "req_last"}),
        lambda: httpx.Response(
            503,
            json={"code": "unavailable", "status": 503, "title": "t", "request_id": "req_last"},
        ),
    ],
    ids=["proxy-502", "problem-503"],
)
def test_an_outcome_still_refused_with_a_5xx_after_every_repeat_is_not_recorded(make_setup, answer):
    setup = make_setup(transport=AnswersOutcomeWith(answer))
    setup.tool("refund")
    calls = Calls(Succeeded(downstream_id="re_1"))
    with pytest.raises(OutcomeNotRecorded) as caught:
        setup.execute("refund", calls)
    op = Operation.objects.get(runner=setup.api.runner)
    assert caught.value.operation_id == op.id
    assert caught.value.attempt == 1
    assert caught.value.outcome["kind"] == "succeeded"
    assert caught.value.outcome["downstream_id"] == "re_1"
    assert caught.value.request_id == "req_last"
    outcome_line = f"POST /api/v1/operations/{op.id}/attempts/1/outcome"
    assert setup.transport.sent.count(outcome_line) == setup.client.max_retries + 1
    assert len(calls.contexts) == 1
    # Nothing was recorded: the outcome is the caller's to post again.
    assert op.attempt_set.get().status == "executing"
    with EffectgateClient(setup.client.base_url, setup.api.token) as direct:
        assert direct.post_outcome(op.id, 1, caught.value.outcome)["status"] == "succeeded"


def test_reconciliation_wait_returns_once_a_probe_or_person_answers(make_setup):
    setup = make_setup(reconciliation_wait_s=5)
    setup.tool("refund")
    calls = Calls(Unknown())

    def answer_later():
        for _ in range(100):
            op = Operation.objects.filter(status="outcome_unknown").first()
            if op is not None:
                services.operation_reconcile(
                    operation=op,
                    result="committed",
                    downstream_id="re_found",
                    actor=services.Actor.system("test"),
                )
                return
            time.sleep(0.05)

    thread = threading.Thread(target=_closing_connections(answer_later))
    thread.start()
    result = setup.execute("refund", calls)
    thread.join()
    assert result.status == "succeeded"
    assert result.operation["downstream_id"] == "re_found"
    assert len(calls.contexts) == 1


def test_heartbeat_keeps_the_lease_alive_during_a_long_call(make_setup):
    setup = make_setup(lease_s=2)
    setup.tool("refund")
    sweeps = []

    def slow(ctx):
        time.sleep(2.6)  # past the first lease
        sweeps.append(services.sweep().leases_expired)
        time.sleep(0.8)
        return Succeeded(downstream_id="re_slow")

    async def slow_async(ctx):
        # On the loop: the heartbeat task beats while this one awaits.
        await asyncio.sleep(2.6)
        sweeps.append(await _off_loop(lambda: services.sweep().leases_expired))
        await asyncio.sleep(0.8)
        return Succeeded(downstream_id="re_slow")

    result = setup.execute("refund", slow if setup.flavor == "sync" else slow_async)
    op = Operation.objects.get(runner=setup.api.runner)
    assert sweeps == [0]
    assert result.status == "succeeded"
    assert op.attempt_set.get().status == "succeeded"
    attempt = op.attempt_set.get()
    assert attempt.heartbeats >= 4
    # Bounded history: the first heartbeat, then one event per HEARTBEAT_EVENT_EVERY.
    assert 1 <= len(_events(op.id, "heartbeat")) <= 1 + attempt.heartbeats // 10


class Crash(BaseException):
    """The runner process dies (modelled in-thread): nothing after it runs."""


def test_runner_crash_after_send_posts_nothing_and_the_sweep_classifies_it(make_setup):
    setup = make_setup(lease_s=1)
    setup.tool("refund")
    sent = []

    def crash(ctx):
        sent.append(ctx.idempotency_key)
        raise Crash

    with pytest.raises(Crash):
        setup.execute("refund", crash)
    op = Operation.objects.get(runner=setup.api.runner)
    assert sent == [op.idempotency_key]
    beats = op.attempt_set.get().heartbeats
    time.sleep(1.3)
    assert op.attempt_set.get().heartbeats == beats  # the heartbeat died with it
    assert not _events(op.id, "outcome")
    assert services.sweep().leases_expired == 1
    op.refresh_from_db()
    assert (op.status, op.error_code) == ("outcome_unknown", "lease_expired")


def test_attempt_in_progress_waits_for_the_lease_then_goes_on(setup):
    setup.tool("refund", "idempotent")
    op = setup.client.register(run=setup.run, tool="refund", operation_key="k", arguments=ARGS)
    setup.client.claim(op["id"], lease_s=1)  # another worker holds it, then vanishes
    calls = Calls()
    result = setup.execute("refund", calls, key="k")
    assert result.status == "succeeded"
    assert [ctx.attempt for ctx in calls.contexts] == [2]
    # It slept out the other lease (retry_after_ms), claiming once or twice, not in a loop.
    assert 1 <= setup.transport.sent.count(f"POST /api/v1/operations/{op['id']}/attempts") <= 3
    assert setup.sleep.waits
    assert max(setup.sleep.waits) <= 1.05


def _approver(tool):
    user = person()
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk=tool))
    return user


def _decide_when_pending(tool, approve, comment="", when=lambda: True):
    user = _approver(tool)

    def decide():
        for _ in range(200):
            if when():
                break
            time.sleep(0.05)
        for _ in range(100):
            op = Operation.objects.filter(tool_id=tool, status="awaiting_approval").first()
            if op is not None:
                request = op.approval_requests.get(status="pending")
                services.approval_decide(
                    request_id=request.id, user=user, approve=approve, comment=comment
                )
                return
            time.sleep(0.05)

    thread = threading.Thread(target=_closing_connections(decide))
    thread.start()
    return thread


def test_waits_for_approval_by_polling_then_claims(setup):
    setup.tool("refund", approval={"mode": "always"})
    # The person decides once the runner is waiting (it has polled once).
    thread = _decide_when_pending("refund", approve=True, when=lambda: setup.runner.waiter.polls)
    calls = Calls()
    result = setup.execute("refund", calls)
    thread.join()
    assert result.status == "succeeded"
    assert len(calls.contexts) == 1
    assert setup.runner.waiter.polls >= 2
    op = Operation.objects.get(runner=setup.api.runner)
    kinds = [e.kind for e in _events(op.id)]
    assert kinds[:3] == ["registered", "approval_requested", "decision"]
    assert "granted" in kinds


def test_an_approval_with_changes_runs_the_successor_with_the_edited_arguments(setup):
    setup.tool("refund", approval={"mode": "always", "editable": ["/amount_cents"]})
    user = _approver("refund")

    def edit():
        for _ in range(200):
            op = Operation.objects.filter(tool_id="refund", status="awaiting_approval").first()
            if op is not None and setup.runner.waiter.polls:
                request = op.approval_requests.get(status="pending")
                services.approval_decide(
                    request_id=request.id,
                    user=user,
                    approve=True,
                    comment="half",
                    edits={"/amount_cents": ARGS["amount_cents"] // 2},
                )
                return
            time.sleep(0.05)

    thread = threading.Thread(target=_closing_connections(edit))
    thread.start()
    calls = Calls()
    result = setup.execute("refund", calls)
    thread.join()
    assert result.status == "succeeded"
    # The tool ran once, for the successor, with the approver's amount.
    assert len(calls.contexts) == 1
    original = Operation.objects.get(operation_key="order-1:refund")
    successor = Operation.objects.get(operation_key="order-1:refund~edit-1")
    assert original.status == "superseded"
    assert calls.contexts[0].operation_id == successor.id
    assert calls.contexts[0].idempotency_key == successor.idempotency_key
    assert calls.contexts[0].arguments == {**ARGS, "amount_cents": ARGS["amount_cents"] // 2}
    assert result.operation["id"] == successor.id


def test_rejection_ends_the_call_with_the_reason_and_no_attempt(setup):
    setup.tool("refund", approval={"mode": "always"})
    thread = _decide_when_pending("refund", approve=False, comment="duplicate refund")
    calls = Calls()
    result = setup.execute("refund", calls)
    thread.join()
    assert calls.contexts == []
    assert result.status == "rejected"
    assert result.envelope["code"] == "approval_rejected"
    assert "duplicate refund" in result.envelope["message"]
    assert not Attempt.objects.exists()


def test_approval_wait_runs_out_and_returns_the_waiting_envelope(make_setup):
    setup = make_setup(wait_s=0.5)
    setup.tool("refund", approval={"mode": "always"})
    result = setup.execute("refund", Calls())
    assert result.refusal == "approval_required"
    assert result.status == "awaiting_approval"
    assert result.envelope["allowed_next_actions"] == ["wait_for_approval"]


def test_revoked_grant_is_refused_at_claim_and_a_new_approval_is_awaited(make_setup):
    setup = make_setup(wait_s=0.6)
    setup.tool("refund", approval={"mode": "always"})
    op = setup.client.register(run=setup.run, tool="refund", operation_key="k", arguments=ARGS)
    user = _approver("refund")
    request_id = op["approval"]["id"]
    services.approval_decide(request_id=request_id, user=user, approve=True, comment="ok")
    services.approval_revoke(request_id=request_id, user=user, reason="customer called")
    calls = Calls()
    result = setup.execute("refund", calls, key="k")
    assert calls.contexts == []
    assert result.status == "awaiting_approval"
    assert result.refusal == "approval_required"
    assert _events(op["id"], "grant_invalid")
    assert result.operation["approval"]["id"] != request_id


def test_tool_forbidden_at_claim_is_raised(setup):
    setup.tool("refund")
    setup.client.register(run=setup.run, tool="refund", operation_key="k", arguments=ARGS)
    RunnerAccount.objects.filter(pk=setup.api.runner.pk).update(restrict_tools=True)
    with pytest.raises(ToolForbidden) as caught:
        setup.execute("refund", Calls(), key="k")
    assert caught.value.status == 403
    assert Operation.objects.get(runner=setup.api.runner).status == "ready"


def test_deadline_passed_at_claim_ends_in_budget_exhausted(setup):
    setup.tool(
        "refund",
        retry={"max_attempts": 3, "base_delay_ms": 0, "max_delay_ms": 0, "deadline_s": 1},
    )
    setup.client.register(run=setup.run, tool="refund", operation_key="k", arguments=ARGS)
    time.sleep(1.1)
    calls = Calls()
    result = setup.execute("refund", calls, key="k")
    assert calls.contexts == []
    assert result.status == "budget_exhausted"
    assert result.envelope["code"] == "budget_exhausted"


def test_closed_operation_is_answered_without_calling_again(setup):
    setup.tool("refund")
    calls = Calls()
    first = setup.execute("refund", calls)
    second = setup.execute("refund", calls)
    assert first.status == second.status == "succeeded"
    assert len(calls.contexts) == 1
    assert second.attempts == []


def test_concurrency_conflict_backs_off_until_the_wait_runs_out(make_setup):
    setup = make_setup(wait_s=0.8, conflict_backoff_s=(0.05, 0.2))
    setup.tool("refund", concurrency_key="/payment_id")
    busy = setup.client.register(run=setup.run, tool="refund", operation_key="busy", arguments=ARGS)
    setup.client.claim(busy["id"], lease_s=60)
    calls = Calls()
    result = setup.execute("refund", calls, key="second", arguments={**ARGS, "amount_cents": 7})
    assert calls.contexts == []
    assert result.refusal == "concurrency_conflict"
    assert result.status == "ready"
    conflict_waits = [w for w in setup.sleep.waits if w <= 0.2]
    assert len(conflict_waits) >= 2


def test_compensable_unknown_runs_the_undo_with_the_undo_key(setup):
    setup.tool("refund", "compensable")
    undone = []

    def undo(ctx):
        undone.append(ctx.idempotency_key)
        return {"reversal": "rv_1"}

    result = setup.execute("refund", Calls(Unknown()), undo=undo)
    op = Operation.objects.get(runner=setup.api.runner)
    assert undone == [f"{op.idempotency_key}:undo"]
    assert result.status == "compensated"
    assert _events(op.id, "compensation")[0].data["evidence"] == {"reversal": "rv_1"}


def test_problems_are_typed(setup):
    setup.tool("refund")
    with pytest.raises(UnknownTool):
        setup.execute("nope", Calls())
    with pytest.raises(InvalidArguments) as caught:
        setup.execute("refund", Calls(), arguments={"payment_id": "pay_1"})
    assert caught.value.errors
    assert caught.value.for_model()["code"] == "invalid_arguments"
    setup.execute("refund", Calls(), key="same")
    with pytest.raises(IntentMismatch):
        setup.execute("refund", Calls(), key="same", arguments={**ARGS, "amount_cents": 9})
    with pytest.raises(NotFound):
        setup.client.get_operation("op_missing")
    with (
        EffectgateClient(setup.client.base_url, "egr_wrong") as bad,
        pytest.raises(NotAuthenticated),
    ):
        bad.get_operation("op_x")


def test_reconcile_posted_again_after_a_lost_answer_returns_the_operation(make_setup):
    transport = LosingTransport({r"POST /api/v1/operations/[^/]+/reconciliations": 1})
    setup = make_setup(transport=transport)
    setup.tool("refund")
    result = setup.execute("refund", Calls(Unknown()))
    op_id = result.envelope["logical_operation_id"]
    body = setup.client.reconcile(op_id, result="committed", downstream_id="re_7")
    assert body["status"] == "succeeded"
    assert len(_events(op_id, "reconciled")) == 1


def test_a_result_that_is_not_json_is_still_recorded_as_success(setup):
    setup.tool("refund")
    result = setup.execute("refund", Calls({"at": object()}))
    op = Operation.objects.get(runner=setup.api.runner)
    assert result.status == "succeeded"
    assert op.status == "succeeded"
    assert "object object" in op.result["repr"]


def test_a_claim_answered_too_late_is_not_used_for_the_call(make_setup):
    # The claim's answer arrives when most of the 1 s lease is gone: a request sent now
    # could reach the provider after the lease expired and a probe found nothing.
    transport = LosingTransport(delay={r"POST /api/v1/operations": 0.9})
    setup = make_setup(transport=transport, lease_s=1)
    setup.tool("refund")
    calls = Calls()
    result = setup.execute("refund", calls)
    op = Operation.objects.get(runner=setup.api.runner)
    assert result.status == "succeeded"
    assert [ctx.attempt for ctx in calls.contexts] == [2]
    first = op.attempt_set.get(number=1)
    assert (first.status, first.outcome_code) == ("failed", "not_sent")
    assert "lease" in first.outcome["detail"]


# --- AsyncRunner only: many calls on one loop, and cancellation ----------------------------


@pytest.fixture
def async_setup(live_server):
    made = Setup(live_server, "async", lease_s=2, wait_s=15)
    yield made
    made.close()


def test_concurrent_executes_of_one_operation_key_call_the_tool_once(async_setup):
    setup = async_setup
    setup.tool("refund")
    calls = []
    seen = {}

    async def refund(ctx):
        calls.append(ctx.idempotency_key)
        seen["threads"] = [t.name for t in threading.enumerate() if t.name.startswith("heart")]
        seen["heartbeats"] = [
            task.get_name()
            for task in asyncio.all_tasks()
            if task.get_name().startswith("heartbeat-")
        ]
        await asyncio.sleep(0.5)
        return Succeeded(result={"refund": "re_1"}, downstream_id="re_1")

    async def many():
        return await asyncio.gather(
            *(
                setup.runner.execute(
                    run=setup.run,
                    tool="refund",
                    operation_key="order-1:refund",
                    arguments=ARGS,
                    call=refund,
                )
                for _ in range(8)
            )
        )

    results = setup.loop.run(many())
    op = Operation.objects.get(runner=setup.api.runner)
    assert calls == [op.idempotency_key]
    assert [result.status for result in results] == ["succeeded"] * 8
    assert {result.envelope["logical_operation_id"] for result in results} == {op.id}
    assert sorted(len(result.attempts) for result in results) == [0] * 7 + [1]
    assert list(op.attempt_set.values_list("number", "status")) == [(1, "succeeded")]
    assert len(_events(op.id, "outcome")) == 1
    # The heartbeat is a task on the loop, not a thread (the live server's threads that
    # serve the eight connections make a count of threads meaningless here).
    assert seen["threads"] == []
    assert seen["heartbeats"] == [f"heartbeat-{op.id}-1"]


def _heartbeats_of(runner) -> int:
    try:
        return sum(
            Attempt.objects.filter(operation__runner=runner).values_list("heartbeats", flat=True)
        )
    finally:
        connection.close()


def test_a_cancellation_during_the_call_posts_nothing_and_the_lease_expires(async_setup):
    setup = async_setup
    setup.tool("refund")
    sent = []

    async def scenario():
        started = asyncio.Event()

        async def hangs(ctx):
            sent.append(ctx.idempotency_key)
            started.set()
            await asyncio.Event().wait()  # the provider never answers

        task = asyncio.ensure_future(
            setup.runner.execute(
                run=setup.run,
                tool="refund",
                operation_key="order-1:refund",
                arguments=ARGS,
                call=hangs,
            )
        )
        await started.wait()
        # Until a heartbeat (every 2/3 s) has reached Effectgate, however loaded the
        # machine: read from a thread of its own, as the loop must keep running.
        for _ in range(300):
            await asyncio.sleep(0.1)
            if await asyncio.to_thread(_heartbeats_of, setup.api.runner):
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The heartbeat was cancelled with the call: it ends (at once, or once the
        # request it had in flight unwinds), cancelled, and nothing runs on for the runner.
        beating = [t for t in asyncio.all_tasks() if t.get_name().startswith("heart")]
        if beating:
            await asyncio.wait(beating, timeout=10)
        return [(t.get_name(), t.done() and t.cancelled()) for t in beating]

    left = setup.loop.run(scenario())
    assert all(cancelled for _, cancelled in left), left
    op = Operation.objects.get(runner=setup.api.runner)
    assert sent == [op.idempotency_key]
    beats = op.attempt_set.get().heartbeats
    assert beats >= 1
    time.sleep(2.3)  # past the lease, had it been extended once more
    assert op.attempt_set.get().heartbeats == beats  # the heartbeat was cancelled with it
    assert not _events(op.id, "outcome")
    assert services.sweep().leases_expired == 1
    op.refresh_from_db()
    assert (op.status, op.error_code) == ("outcome_unknown", "lease_expired")
    assert op.attempt_set.get().status == "lease_expired"
