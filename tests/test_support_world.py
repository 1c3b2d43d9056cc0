"""The services world (tests/support/world.py) answers what the runner API answers and
stores what it stores, so the fixtures that build with it test the same world."""

from operations.models import Attempt, Event, Operation, Run
from tests.conftest import contract, make_runner
from tests.support.world import Direct


def _shape(value):
    """A body's keys, all the way down, with the type of each value."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_shape(item) for item in value]
    return type(value).__name__


def _build(maker, tool: str) -> dict:
    answers = {"tool": maker.tool(tool, contract("irreversible", approval={"mode": "never"}))}
    run = maker.run("user:alice", max_tool_calls=5)
    answers["registered"] = maker.register(run, tool, call_id="c1")
    op = answers["registered"]["id"]
    answers["claimed"] = maker.claim(op)
    answers["unknown"] = maker.outcome(op, 1, {"kind": "unknown", "code": "timeout"})
    answers["inline"] = maker.register(
        run, tool, {"payment_id": "p2", "amount_cents": 2}, claim={"lease_s": 30}
    )
    answers["done"] = maker.outcome(answers["inline"]["id"], 1, {"kind": "succeeded"})
    answers["run"] = run
    return answers


def _stored(answers: dict) -> dict:
    ops = [answers["registered"]["id"], answers["inline"]["id"]]
    return {
        "operations": [
            (op.status, op.attempts, op.call_id) for op in Operation.objects.filter(pk__in=ops)
        ],
        "attempts": sorted(
            (a.number, a.status, a.outcome_code) for a in Attempt.objects.filter(operation__in=ops)
        ),
        "events": [
            list(Event.objects.filter(stream=op).order_by("seq").values_list("kind", flat=True))
            for op in ops
        ],
        "run": Run.objects.values_list("status", "tool_calls").get(pk=answers["run"]),
    }


def test_the_services_world_answers_and_stores_what_the_api_does(db):
    over_http = _build(make_runner(), "refund_over_http")
    direct = _build(Direct(make_runner()), "refund_direct")

    for step in ("tool", "registered", "claimed", "unknown", "inline", "done"):
        assert _shape(direct[step]) == _shape(over_http[step]), step
    assert direct["unknown"]["status"] == over_http["unknown"]["status"] == "outcome_unknown"
    assert direct["inline"]["attempt"]["attempt"] == over_http["inline"]["attempt"]["attempt"]
    assert direct["done"]["status"] == over_http["done"]["status"] == "succeeded"
    assert _stored(direct) == _stored(over_http)
