"""What a reviewer reads before deciding (issue 29, item 1): the reasons in words
(``contracts.explain``) and the risk signals (``selectors.approval_brief``)."""

import pytest
from guardian.shortcuts import assign_perm

from approvals.models import ApprovalRequest
from operations import selectors
from operations.contracts.explain import reasons_in_words, rule_in_words, runner_reason
from operations.models import Tool
from tests.approvals.conftest import person
from tests.conftest import EUR_CENTS, contract
from tests.support.world import Direct

MONEY = {"display": {"fields": {"/amount_cents": EUR_CENTS}}}

RULES = {"mode": "rules", "rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}]}


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        ({"path": "/amount_cents", "op": "gt", "value": 50000}, "Amount over €500.00"),
        ({"path": "/amount_cents", "op": "lte", "value": 100}, "Amount at most €1.00"),
        ({"path": "/payment_id", "op": "eq", "value": "pay_1"}, "Payment id is pay_1"),
        (
            {"path": "/payment_id", "op": "in", "value": ["a", "b", "c", "d", "e", "f", "g"]},
            "Payment id is one of a, b, c, d, e or 2 more",
        ),
    ],
)
def test_a_rule_in_words(rule, words):
    assert rule_in_words({**contract(), **MONEY}, rule) == words


def test_every_recorded_reason_in_words():
    context = {
        "policy_mode": "always",
        "matched_rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}],
        "policies": [
            {
                "policy": "big-refunds",
                "message": "Refunds over €500 need finance",
                "missing": False,
            },
            {"policy": "vip", "message": "", "missing": True, "figure": "3 of 2 today"},
        ],
    }
    assert reasons_in_words(
        {**contract(), **MONEY}, context, arguments={"payment_id": "p"}, tool="send_refund"
    ) == [
        "Every send_refund operation needs a person (the tool's contract)",
        "Amount is not given, so a person decides",
        "Policy big-refunds: Refunds over €500 need finance",
        "Policy vip: a person must approve (an argument it reads is not given, so a person "
        "decides) (3 of 2 today)",
    ]


def test_the_agents_reason_is_the_one_it_gave_else_its_reason_argument():
    body = contract()
    assert runner_reason({"runner_reason": "customer called"}, body, {"reason": "x"}) == (
        "customer called"
    )
    assert runner_reason({}, body, {"reason": "order never arrived"}) == "order never arrived"
    assert runner_reason({}, body, {"reason": 5}) == ""
    secret = contract(
        input_schema={
            "type": "object",
            "properties": {"reason": {"type": "string", "x-sensitive": True}},
        }
    )
    assert runner_reason({}, secret, {"reason": "hmac-sha256:k1:00"}) == ""


@pytest.fixture
def desk(api):
    direct = Direct(api)
    direct.tool("send_refund", {**contract("irreversible", approval=RULES), **MONEY})
    direct.tool("wipe", contract("irreversible"))
    reviewer = person(username="rev")
    assign_perm("operations.decide_tool", reviewer, Tool.objects.get(pk="send_refund"))
    return direct, reviewer


def _brief(op, reviewer):
    request = ApprovalRequest.objects.get(operation_id=op["id"])
    return selectors.approval_brief(request=request, user=reviewer)


@pytest.mark.django_db
def test_signals_name_the_runs_unknown_operation_and_a_first_principal(desk):
    direct, reviewer = desk
    run = direct.run("user:new")
    unknown = direct.register(run, "send_refund", {"payment_id": "p1", "amount_cents": 800})
    direct.claim(unknown["id"])
    direct.outcome(unknown["id"], 1, {"kind": "unknown", "code": "timeout"})
    # Another tool's unknown operation in the same run, on a tool the reviewer may not
    # see: never named.
    hidden = direct.register(run, "wipe")
    direct.claim(hidden["id"])
    direct.outcome(hidden["id"], 1, {"kind": "unknown", "code": "timeout"})
    big = direct.register(run, "send_refund", {"payment_id": "p2", "amount_cents": 75000})
    brief = _brief(big, reviewer)
    assert brief.amount == "€750.00"
    assert brief.reasons == ["Amount over €500.00"]
    bad = [s for s in brief.signals if s.tone == "bad"]
    assert [s.operation_id for s in bad] == [unknown["id"]]
    assert "still outcome unknown" in bad[0].text
    assert "€8.00" in bad[0].text
    # user:new had an operation before this one (the unknown refund): not a first.
    assert not any("first operation" in s.text for s in brief.signals)
    first = direct.register(
        direct.run("user:fresh"), "send_refund", {"payment_id": "p3", "amount_cents": 90000}
    )
    assert any(
        s.text == "The first operation for user:fresh" for s in _brief(first, reviewer).signals
    )


@pytest.mark.django_db
def test_the_amount_against_the_tools_usual_range(desk):
    direct, reviewer = desk
    run = direct.run("user:regular")
    for cents in range(1000, 11000, 1000):  # €10 to €100, ten refunds that succeeded
        op = direct.register(run, "send_refund", {"payment_id": "p", "amount_cents": cents})
        direct.claim(op["id"])
        direct.outcome(op["id"], 1, {"kind": "succeeded", "downstream_id": "re"})
    big = direct.register(run, "send_refund", {"payment_id": "p", "amount_cents": 75000})
    usual = [s for s in _brief(big, reviewer).signals if "usual range" in s.text]
    assert len(usual) == 1
    assert usual[0].tone == "warn"
    assert usual[0].text.startswith("Above this tool's usual range: €20.00 to €90.00")
    assert "last 10 succeeded" in usual[0].text


@pytest.mark.django_db
def test_too_few_earlier_amounts_say_nothing_of_a_usual_range(desk):
    direct, reviewer = desk
    big = direct.register(direct.run(), "send_refund", {"payment_id": "p", "amount_cents": 75000})
    assert not any("usual range" in s.text for s in _brief(big, reviewer).signals)


@pytest.mark.django_db
def test_an_earlier_approvers_edits_are_a_signal_on_the_copy(api):
    from operations import services
    from operations.models import Operation

    direct = Direct(api)
    direct.tool(
        "capped",
        {
            **contract(
                "irreversible",
                approval={"mode": "always", "editable": ["/amount_cents"], "approvals_required": 2},
            ),
            **MONEY,
        },
    )
    first, second = person(username="ed"), person(username="flo")
    for reviewer in (first, second):
        assign_perm("operations.decide_tool", reviewer, Tool.objects.get(pk="capped"))
    op = direct.register(direct.run(), "capped", {"payment_id": "p", "amount_cents": 75000})
    request = ApprovalRequest.objects.get(operation_id=op["id"])
    services.approval_decide(
        request_id=request.id,
        user=first,
        approve=True,
        comment="capped",
        edits={"/amount_cents": 50000},
    )
    copy = Operation.objects.get(previous_id=op["id"])
    brief = _brief({"id": copy.id}, second)
    assert "An earlier approver changed Amount: €750.00 → €500.00" in [
        s.text for s in brief.signals
    ]
    assert "A person changed the arguments when approving the original" in brief.reasons


@pytest.mark.django_db
def test_an_amount_a_runner_makes_huge_is_no_amount(api):
    """A string money field holding "1e9999999" (a finite Decimal whose int() takes
    minutes) is left out of the usual range, not computed."""
    direct = Direct(api)
    schema = {
        "type": "object",
        "properties": {"payment_id": {"type": "string"}, "amount": {"type": "string"}},
    }
    money = {"display": {"fields": {"/amount": {"format": "money", "currency": "EUR"}}}}
    body = contract("irreversible", approval={"mode": "never"}, input_schema=schema)
    direct.tool("payout", {**body, **money})
    reviewer = person(username="hugo")
    assign_perm("operations.decide_tool", reviewer, Tool.objects.get(pk="payout"))
    run = direct.run()
    for value in ["1e9999999"] * 5 + ["10", "20", "30", "40", "50"]:
        op = direct.register(run, "payout", {"payment_id": "p", "amount": value})
        direct.claim(op["id"])
        direct.outcome(op["id"], 1, {"kind": "succeeded", "downstream_id": "re"})
    direct.tool("payout", {**body, **money, "approval": {"mode": "always"}})
    direct.tool("payout", {**body, **money, "approval": {"mode": "always"}})
    big = direct.register(run, "payout", {"payment_id": "p", "amount": "900"})
    usual = [s.text for s in _brief(big, reviewer).signals if "usual range" in s.text]
    assert usual == [
        "Above this tool's usual range: €10.00 to €50.00 for 8 in 10 of its last 5 "
        "succeeded operations"
    ]
