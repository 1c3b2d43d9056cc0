"""The lean hot path (issue 14): register+claim and outcome in their essential statements,
answered from what the transaction wrote, with nothing lost on the way.

The statement counts hold on PostgreSQL, where the attempt and the events of a
registration go in one statement (SQLite takes one per table); they count what reaches
the database, ``BEGIN`` and ``COMMIT`` included, as the bench does.
"""

import io
import threading
import time

import pytest
from django.conf import settings
from django.core.cache import cache
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from operations import payloads, services
from operations.audit.chains import chains_verify
from operations.audit.state import state_verify
from operations.http.serializers import AttemptOut, OperationOut
from operations.http.throttling import WindowRateThrottle
from operations.models import (
    Attempt,
    Event,
    Operation,
    OutboxMessage,
    Run,
    Runner,
    RunnerToken,
    WebhookEndpoint,
)
from tests.conftest import contract, make_runner, throttle_count

POSTGRES = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


def _claimed(api, run: str, **extra):
    body = api.register(run, "t", claim={"lease_s": 30}, **extra)
    assert body["status"] == "executing", body
    return body


def _without(body: dict, *keys: str) -> dict:
    # allowed_next_actions depends on the clock and updated_at on the write, both the
    # same here; nothing else may differ between the answer and a later read.
    return {key: value for key, value in body.items() if key not in keys}


def test_the_answers_are_what_a_later_read_returns(api):
    api.tool("t")
    run = api.run()
    registered = _claimed(api, run)
    assert registered["attempt"]["attempt"] == 1
    assert registered["attempt"]["idempotency_key"] == registered["idempotency_key"]
    assert _without(registered, "attempt") == api.operation(registered["id"])
    done = api.outcome(registered["id"], 1, {"kind": "succeeded", "downstream_id": "re_1"})
    envelope = done.pop("tool_result")
    assert done == api.operation(registered["id"])
    assert envelope == api.get(f"/api/v1/operations/{registered['id']}/tool-result").json()
    assert envelope["message"] == "The call to t succeeded (reference re_1)."
    assert done["status"] == "succeeded"
    assert done["approval"] is None


def test_the_chain_head_lives_on_the_operation_and_every_chain_verifies(api):
    api.tool("t")
    run = api.run()
    op = _claimed(api, run)
    api.outcome(op["id"], 1, {"kind": "failed", "code": "provider_unavailable"})
    api.claim(op["id"], expect=409)  # retry_later: backoff; recorded nowhere
    stored = Operation.objects.get(pk=op["id"])
    events = list(Event.objects.filter(stream=op["id"]).order_by("seq"))
    assert [event.kind for event in events] == ["registered", "claimed", "outcome"]
    assert (stored.event_seq, stored.event_head) == (3, events[-1].hash)
    assert chains_verify().ok


def test_budgets_are_counted_last_and_a_refusal_writes_nothing(api):
    api.tool("t")
    run = api.run(max_tool_calls=1, max_turns=3)
    _claimed(api, run, turn=2)
    assert Run.objects.get(pk=run).turns == 2
    events = Event.objects.count()
    refused = api.register(run, "t", expect=409, claim={"lease_s": 30})
    assert refused["code"] == "budget_exhausted"
    assert refused["budget"] == "max_tool_calls"
    assert Operation.objects.filter(run_id=run).count() == 1
    assert Event.objects.count() == events
    assert Run.objects.get(pk=run).tool_calls == 1

    turns = api.run(max_turns=3)
    assert api.register(turns, "t", turn=4, expect=409)["budget"] == "max_turns"
    assert Run.objects.get(pk=turns).tool_calls == 0


def test_a_replay_takes_no_budget_and_claims_nothing(api):
    api.tool("t")
    run = api.run(max_tool_calls=1)
    first = _claimed(api, run, operation_key="k")
    again = api.post(
        "/api/v1/operations",
        {
            "run": run,
            "tool": "t",
            "operation_key": "k",
            "arguments": {"payment_id": "pay_1", "amount_cents": 500},
            "claim": {"lease_s": 30},
        },
    )
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert "attempt" not in again.json()
    assert Run.objects.get(pk=run).tool_calls == 1


def test_an_inline_claim_the_concurrency_key_refuses_leaves_the_operation_ready_and_clean(api):
    """The lean path inserts the operation already executing; when the concurrency key's
    index refuses that row, the operation is registered ready on the general path as if
    the lean attempt had never been made: no attempt, no lease, one event."""
    api.tool(
        "refund",
        contract("irreversible", approval={"mode": "never"}, concurrency_key="/payment_id"),
    )
    run = api.run()
    holder = api.register(
        run, "refund", {"payment_id": "pay_1", "amount_cents": 1}, claim={"lease_s": 30}
    )
    assert holder["status"] == "executing"

    blocked = api.register(
        run, "refund", {"payment_id": "pay_1", "amount_cents": 2}, claim={"lease_s": 30}
    )
    assert blocked["status"] == "ready"
    assert (blocked["attempts"], blocked["lease_until"], blocked["attempt"]) == (0, None, None)
    assert blocked["claim_error"]["code"] == "concurrency_conflict"
    assert _without(blocked, "attempt", "claim_error") == api.operation(blocked["id"])

    stored = Operation.objects.get(pk=blocked["id"])
    assert (stored.status, stored.attempts, stored.lease_until) == ("ready", 0, None)
    events = list(Event.objects.filter(stream=blocked["id"]).order_by("seq"))
    assert [(event.seq, event.kind, event.to_status) for event in events] == [
        (1, "registered", "ready")
    ]
    assert (stored.event_seq, stored.event_head) == (1, events[0].hash)
    assert not Attempt.objects.filter(operation_id=blocked["id"]).exists()
    assert Run.objects.get(pk=run).tool_calls == 2
    assert chains_verify().ok
    assert list(state_verify()) == []


def test_webhook_patterns_follow_the_endpoints_and_subscribers_get_every_message(api, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    api.tool("t")
    created = api.post(
        "/api/v1/webhook-endpoints",
        {"url": "http://127.0.0.1:9/in", "events": ["operation.ready", "operation.exec*"]},
    )
    assert created.status_code == 201, created.json()
    runner = Runner.objects.get(pk=api.runner.pk)
    assert runner.webhook_events == ["operation.exec*", "operation.ready"]
    op = _claimed(api, api.run())
    assert sorted(
        OutboxMessage.objects.filter(operation_id=op["id"]).values_list("event_type", flat=True)
    ) == ["operation.executing", "operation.ready"]

    assert api.client.delete(f"/api/v1/webhook-endpoints/{created.json()['id']}").status_code in (
        200,
        204,
    )
    assert Runner.objects.get(pk=api.runner.pk).webhook_events == []
    quiet = _claimed(api, api.run())
    assert not OutboxMessage.objects.filter(operation_id=quiet["id"]).exists()


def test_another_runner_cannot_post_an_outcome_to_an_operation(api):
    api.tool("t")
    op = _claimed(api, api.run())
    other = make_runner()
    response = other.post(
        f"/api/v1/operations/{op['id']}/attempts/1/outcome", {"kind": "succeeded"}
    )
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    missing = api.post(f"/api/v1/operations/{op['id']}/attempts/2/outcome", {"kind": "succeeded"})
    assert missing.status_code == 404
    assert "no attempt 2" in missing.json()["detail"]
    assert Operation.objects.get(pk=op["id"]).status == "executing"


def _lifecycle_statements() -> tuple[list[str], list[str], Runner]:
    """The first word of each statement a register+claim and an outcome send, once the
    token is remembered and the throttle's count for this minute exists."""
    api = make_runner()
    api.tool("t")
    run = api.run()
    _claimed(api, run)  # the token is remembered from here on
    with CaptureQueriesContext(connection) as register:
        op = _claimed(api, run)
    with CaptureQueriesContext(connection) as outcome:
        api.outcome(op["id"], 1, {"kind": "succeeded"})
    assert not any("SAVEPOINT" in query["sql"] for query in register.captured_queries)
    return (
        [query["sql"].split()[0].upper() for query in register.captured_queries],
        [query["sql"].split()[0].upper() for query in outcome.captured_queries],
        api.runner,
    )


@pytest.fixture
def frozen_throttle_clock(monkeypatch):
    """Half-way through a minute for the whole test: between the warm-up and the
    measure no throttle window starts, and on the database cache no deletion of old
    counters falls due (the warm-up's first request made it)."""
    monkeypatch.setattr(WindowRateThrottle, "timer", staticmethod(lambda: 1_800_000_030.0))


@pytest.mark.skipif(
    not POSTGRES, reason="the counts are PostgreSQL's (one INSERT for rows of two tables)"
)
@pytest.mark.django_db(transaction=True)
def test_a_lifecycle_sends_its_essential_statements_only(redis_cache, frozen_throttle_clock):
    # Outside a test transaction: the transactions' own BEGIN and COMMIT are counted.
    register, outcome, runner = _lifecycle_statements()
    # generation read, run+tool read, BEGIN, INSERT operation, INSERT attempt+events,
    # UPDATE run, COMMIT
    assert register == ["SELECT", "SELECT", "BEGIN", "INSERT", "WITH", "UPDATE", "COMMIT"]
    # generation read, BEGIN, locking read, UPDATE attempt, INSERT event, UPDATE
    # operation, COMMIT
    assert outcome == ["SELECT", "BEGIN", "SELECT", "UPDATE", "INSERT", "UPDATE", "COMMIT"]
    # Throttled all the same, on Redis: tool, run, two registrations, the outcome.
    token = RunnerToken.objects.get(runner=runner)
    assert cache.get(f"throttle:runner:{token.pk}:{1_800_000_030 // 60}") == 5


@pytest.mark.skipif(
    not POSTGRES, reason="the counts are PostgreSQL's (one INSERT for rows of two tables)"
)
@pytest.mark.django_db(transaction=True)
def test_on_the_database_cache_the_throttle_adds_one_statement_per_request(
    database_cache, frozen_throttle_clock
):
    """Without Redis the throttle's count is a row of its table in the database: one
    upsert (``INSERT ... ON CONFLICT DO UPDATE``), in autocommit, after the token's
    generation read."""
    register, outcome, runner = _lifecycle_statements()
    assert register == [
        *["SELECT", "INSERT"],
        *["SELECT", "BEGIN", "INSERT", "WITH", "UPDATE", "COMMIT"],
    ]
    assert outcome == [
        *["SELECT", "INSERT"],
        *["BEGIN", "SELECT", "UPDATE", "INSERT", "UPDATE", "COMMIT"],
    ]
    token = RunnerToken.objects.get(runner=runner)
    assert throttle_count(f"throttle:runner:{token.pk}:{1_800_000_030 // 60}") == 5


def test_the_bodies_built_without_serializers_have_the_declared_fields(api):
    """The answers are built by ``payloads`` (no serializer per request); the serializers
    declare the same fields for the OpenAPI document."""
    api.tool("t")
    op = _claimed(api, api.run())
    assert set(op) - {"attempt"} == set(OperationOut().fields)
    assert set(op["attempt"]) == set(AttemptOut().fields)
    stored = Attempt.objects.select_related("operation").get(operation_id=op["id"])
    assert payloads.attempt(stored) == op["attempt"]


# --- what the review of the lean path found, kept from coming back -----------------------


def _in_thread(target, results, name):
    def body():
        try:
            results[name] = target()
        except Exception as exc:  # the test reports what each thread met
            results[name] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=body, name=name)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_an_outcome_racing_a_lease_holder_takes_the_locks_in_the_same_order():
    """Heartbeats, the sweep and claims lock the operation, then its attempt; the
    outcome's one locking read must too, or the two deadlock (PostgreSQL aborts one)."""
    api = make_runner()
    api.tool("t")
    op = _claimed(api, api.run())
    runner = Runner.objects.get(pk=api.runner.pk)
    results: dict = {}
    holding = threading.Event()

    def heartbeat_like():
        with transaction.atomic():
            locked = services.core.lock(op["id"])
            holding.set()
            time.sleep(0.7)  # the outcome has started its locking read meanwhile
            services.core.current_attempt(locked)
        return "ok"

    def outcome():
        holding.wait(10)
        time.sleep(0.2)
        services.attempt_record_outcome(
            operation_id=op["id"], number=1, body={"kind": "succeeded"}, runner=runner
        )
        return "ok"

    threads = [_in_thread(heartbeat_like, results, "hb"), _in_thread(outcome, results, "out")]
    for thread in threads:
        thread.join(30)
    assert results == {"hb": "ok", "out": "ok"}
    assert Operation.objects.get(pk=op["id"]).status == "succeeded"


@pytest.mark.django_db(transaction=True)
def test_endpoint_changes_racing_each_other_keep_every_pattern(monkeypatch, settings):
    """A rotation racing a registration for the same runner: the second to run reads
    the endpoints after the first committed (the runner's row is locked first)."""
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    api = make_runner()
    runner = Runner.objects.get(pk=api.runner.pk)
    first, _ = services.webhook_endpoint_create(
        runner=runner, url="http://127.0.0.1:9/a", events=["operation.*"]
    )
    paused, release = threading.Event(), threading.Event()
    real_append = services.endpoints.event_append

    def slow_append(**kwargs):
        if threading.current_thread().name == "create":
            paused.set()
            release.wait(10)
        return real_append(**kwargs)

    monkeypatch.setattr(services.endpoints, "event_append", slow_append)
    results: dict = {}

    def create():
        services.webhook_endpoint_create(
            runner=Runner.objects.get(pk=runner.pk),
            url="http://127.0.0.1:9/b",
            events=["approval.decided"],
        )
        return "ok"

    def rotate():
        services.webhook_endpoint_rotate(endpoint=first, actor=services.Actor.system("test"))
        return "ok"

    creating = _in_thread(create, results, "create")
    paused.wait(10)
    rotating = _in_thread(rotate, results, "rotate")
    time.sleep(0.5)
    release.set()
    creating.join(30)
    rotating.join(30)
    assert results == {"create": "ok", "rotate": "ok"}
    assert Runner.objects.get(pk=runner.pk).webhook_events == ["approval.decided", "operation.*"]


@pytest.mark.django_db(transaction=True)
def test_what_the_previous_release_writes_during_an_upgrade_is_taken_up(api):
    """While 0007 is applied the previous release still serves: it inserts operations
    without the new columns (database defaults), appends events without moving the head
    on the row, and registers endpoints without the signal. The new release appends
    after the stream's real last event, and ``lean_fill`` catches up the rest."""
    api.tool("t")
    op = _claimed(api, api.run())
    stored = Operation.objects.get(pk=op["id"])
    # The previous release's event_append: the stream's last event read, the row untouched.
    services.core.event_append(
        stream=op["id"], kind="heartbeat", actor=services.Actor.system("old"), tool_name="t"
    )
    assert Operation.objects.get(pk=op["id"]).event_seq == stored.event_seq
    done = api.outcome(op["id"], 1, {"kind": "succeeded"})
    assert done["status"] == "succeeded"
    kinds = list(Event.objects.filter(stream=op["id"]).order_by("seq").values_list("kind", "seq"))
    assert kinds == [("registered", 1), ("claimed", 2), ("heartbeat", 3), ("outcome", 4)]
    healed = Operation.objects.get(pk=op["id"])
    fourth = Event.objects.get(stream=op["id"], seq=4)
    assert (healed.event_seq, healed.event_head) == (4, fourth.hash)
    assert chains_verify().ok

    # A row inserted without the new columns takes their database defaults.
    columns = [
        field.column
        for field in Operation._meta.concrete_fields
        if field.column not in {"event_seq", "event_head"}
    ]
    fresh = ("id", "operation_key", "idempotency_key")
    copied = ", ".join("%s" if column in fresh else column for column in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO operations_operation ({', '.join(columns)}) "  # noqa: S608
            f"SELECT {copied} FROM operations_operation WHERE id = %s",
            ["op_old", "old-key", "ik_old", op["id"]],
        )
    assert Operation.objects.filter(pk="op_old").values_list("event_seq", "event_head").get() == (
        0,
        "",
    )

    # An endpoint written without the signal (bulk_create sends none), then lean_fill.
    WebhookEndpoint.objects.bulk_create(
        [
            WebhookEndpoint(
                runner_id=api.runner.pk,
                url="https://hooks.example.com/in",
                events=["operation.*"],
                secret_encrypted="x",
            )
        ]
    )
    assert Runner.objects.get(pk=api.runner.pk).webhook_events == []
    out = io.StringIO()
    call_command("lean_fill", stdout=out)
    assert Runner.objects.get(pk=api.runner.pk).webhook_events == ["operation.*"]
    assert "1 runners' webhook patterns" in out.getvalue()


@pytest.mark.skipif(
    not POSTGRES, reason="the counts are PostgreSQL's (one INSERT for rows of two tables)"
)
@pytest.mark.django_db(transaction=True)
def test_policies_in_force_that_do_not_apply_cost_no_statement(redis_cache, frozen_throttle_clock):
    """People's policies are remembered under the policy generation, read with the token
    generation: 100 active policies, none matching, leave the 7 statements as they are."""
    from operations.services import policies
    from tests.operations.test_policies import steward

    author, second = steward(), steward()
    for number in range(100):
        text = (
            f'@id("p{number}")\n@approval("required")\n'
            f'permit(principal, action == Action::"register", resource == Tool::"other{number}");'
        )
        services.policies.policy_write(user=author, text=text)
        services.policies.policy_activate(user=second, policy_id=f"p{number}")
    policies.forget()
    register, outcome, _runner = _lifecycle_statements()
    assert register == ["SELECT", "SELECT", "BEGIN", "INSERT", "WITH", "UPDATE", "COMMIT"]
    assert outcome == ["SELECT", "BEGIN", "SELECT", "UPDATE", "INSERT", "UPDATE", "COMMIT"]
    assert len(policies.in_force().active) == 100


@pytest.mark.skipif(
    not POSTGRES, reason="the counts are PostgreSQL's (one INSERT for rows of two tables)"
)
@pytest.mark.django_db(transaction=True)
def test_a_limit_over_time_below_its_bound_adds_its_lock_read_and_entry_only(
    redis_cache, frozen_throttle_clock
):
    """Still the lean path (claimed inline, no approval): the advisory lock, the
    window's read and the entry are the only statements added, and a windowed policy
    that does not match adds none."""
    from operations.services import policies
    from tests.operations.test_policies import in_force

    for tool in ("t", "other"):
        in_force(
            f'@id("window-{tool}")\n@approval("required")\n@window("1h")\n@max_count("100")\n'
            f'permit(principal, action == Action::"register", resource == Tool::"{tool}");'
        )
    policies.forget()
    register, _outcome, _runner = _lifecycle_statements()
    assert register == [
        *("SELECT", "SELECT", "BEGIN"),
        *("SELECT", "SELECT"),  # pg_advisory_xact_lock, the window's count and sum
        *("INSERT", "WITH"),
        "INSERT",  # the window's entry
        *("UPDATE", "COMMIT"),
    ]
