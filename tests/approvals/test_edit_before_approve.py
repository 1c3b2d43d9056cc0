"""Edit before approve (contract ``approval.editable``): a person changes listed fields
when approving; a successor operation runs instead and the original ends superseded."""

import pytest

from approvals.errors import PermissionRefused
from approvals.models import ApprovalRequest
from operations import errors, services
from operations.audit.chains import chains_verify
from operations.audit.state import state_verify
from operations.contracts import normalize_contract
from operations.models import Event, Operation, OutboxMessage
from tests.approvals.conftest import person
from tests.conftest import REFUND_SCHEMA, contract

SCHEMA = {
    **REFUND_SCHEMA,
    "properties": {
        **REFUND_SCHEMA["properties"],
        "note": {"type": "string", "maxLength": 20},
        "card": {"type": "string", "x-sensitive": True},
    },
}


def _pending(api, *, approvals_required=1, editable=("/amount_cents", "/note"), key="refund-551"):
    api.tool(
        "refund",
        contract(
            "irreversible",
            input_schema=SCHEMA,
            approval={
                "mode": "always",
                "approvals_required": approvals_required,
                "editable": list(editable),
            },
        ),
    )
    op = api.register(
        api.run(principal="user:alice"),
        "refund",
        {"payment_id": "pay_1", "amount_cents": 75000, "card": "4111 1111 1111 1111"},
        operation_key=key,
    )
    assert op["status"] == "awaiting_approval"
    return op


def _edit(op, user, edits, comment=""):
    return services.approval_decide(
        request_id=op["approval"]["id"], user=user, approve=True, comment=comment, edits=edits
    )


def test_an_edit_registers_an_approved_successor_and_supersedes_the_original(api):
    op = _pending(api)
    approver = person(decide_on="refund")
    successor = _edit(op, approver, {"/amount_cents": 50000}, comment="half, per policy")

    original = api.operation(op["id"])
    assert original["status"] == "superseded"
    assert original["superseded_by"] == successor.id
    assert original["approval"]["status"] == "superseded"
    assert original["allowed_next_actions"] == []

    body = api.operation(successor.id)
    assert body["status"] == "ready"
    assert body["operation_key"] == "refund-551~edit-1"
    assert body["previous_operation"] == op["id"]
    assert body["run"] == op["run"]
    assert body["arguments"]["amount_cents"] == 50000
    # The sensitive value stays a digest, the same as the original's.
    assert body["arguments"]["card"] == op["arguments"]["card"]
    assert body["intent_hash"] != op["intent_hash"]
    assert body["edits"] == [{"path": "/amount_cents", "from": 75000, "to": 50000}]
    assert body["approval"]["grant"]["intent_hash"] == body["intent_hash"]
    assert body["approval"]["grant"]["decided_by"] == [approver.username]
    assert body["approval"]["decisions"][0]["comment"] == "half, per policy"

    # Claiming the original answers where to go; the successor claims normally.
    problem = api.claim(op["id"], expect=409)
    assert problem["code"] == "superseded"
    assert problem["successor"] == successor.id
    assert api.claim(successor.id)["attempt"] == 1

    # Both streams are audited, and each step is one event.
    assert list(Event.objects.filter(stream=op["id"]).values_list("kind", flat=True)) == [
        "registered",
        "approval_requested",
        "superseded",
    ]
    assert list(Event.objects.filter(stream=successor.id).values_list("kind", flat=True)) == [
        "registered",
        "approval_requested",
        "decision",
        "granted",
        "claimed",
    ]
    superseded = Event.objects.get(stream=op["id"], kind="superseded")
    assert superseded.actor == f"user:{approver.username}"
    assert superseded.data["successor"] == successor.id
    # The audit finds every row explained by its events, both chains intact.
    assert list(state_verify()) == []
    assert chains_verify().ok


def test_the_tool_result_tells_the_model_where_the_call_went(api):
    op = _pending(api)
    successor = _edit(op, person(decide_on="refund"), {"/note": "goodwill"})
    envelope = api.get(f"/api/v1/operations/{op['id']}/tool-result").json()
    assert envelope["status"] == "superseded"
    assert successor.id in envelope["message"]


def test_quorum_counts_distinct_people_on_the_successor(api):
    op = _pending(api, approvals_required=2)
    first, second = person(decide_on="refund"), person(decide_on="refund")
    # An approval of the original does not carry over: it approved another intent.
    services.approval_decide(request_id=op["approval"]["id"], user=first, approve=True, comment="")
    successor = _edit(op, second, {"/amount_cents": 1000})
    body = api.operation(successor.id)
    assert body["status"] == "awaiting_approval"
    assert [d["by"] for d in body["approval"]["decisions"]] == [second.username]
    with pytest.raises(PermissionRefused, match="already decided"):
        services.approval_decide(
            request_id=body["approval"]["id"], user=second, approve=True, comment=""
        )
    services.approval_decide(
        request_id=body["approval"]["id"], user=first, approve=True, comment=""
    )
    assert api.operation(successor.id)["status"] == "ready"


def test_a_second_edit_supersedes_the_successor(api):
    op = _pending(api, approvals_required=2)
    first, second = person(decide_on="refund"), person(decide_on="refund")
    successor = _edit(op, first, {"/amount_cents": 1000})
    later = services.approval_decide(
        request_id=api.operation(successor.id)["approval"]["id"],
        user=second,
        approve=True,
        comment="",
        edits={"/amount_cents": 900},
    )
    assert later.operation_key == "refund-551~edit-2"
    assert later.previous_id == successor.id
    assert Operation.objects.get(pk=successor.id).status == "superseded"


def test_an_edit_suffix_in_other_digits_is_part_of_the_original_key(api):
    """Only ASCII digits count edits: "~edit-\u0661" is a runner's own key, not edit 1."""
    op = _pending(api, key="refund-551~edit-\u0661")
    successor = _edit(op, person(decide_on="refund"), {"/amount_cents": 1000})
    assert successor.operation_key == "refund-551~edit-\u0661~edit-1"
    assert Operation.objects.filter(operation_key="refund-551~edit-2").count() == 0


def test_an_edit_suffix_before_a_final_newline_is_part_of_the_original_key(api):
    """The API trims a key's final newline; a key stored with one (by another path)
    still names no edit: the suffix counts only at the very end."""
    from operations.services.decisions import _successor_key

    op = Operation(runner_id=api.runner.pk, operation_key="refund-551~edit-1\n")
    assert _successor_key(op) == "refund-551~edit-1\n~edit-1"


@pytest.mark.parametrize(
    ("edits", "refusal"),
    [
        ({"/note": "a\x00b"}, errors.InvalidArguments),  # PostgreSQL stores no U+0000
        ({"/note": "\ud800"}, errors.InvalidArguments),  # no UTF-8 for a lone surrogate
        ({"/amount_cents": 1e300}, errors.NumberOutOfRange),  # an integer past 2**53
        ({"/amount_cents": 2.0**60}, errors.NumberOutOfRange),
    ],
)
def test_an_edit_that_a_runner_could_not_send_is_refused_and_writes_nothing(api, edits, refusal):
    """A person's edit obeys the rules of a runner's body: on PostgreSQL U+0000 failed
    the insert (500), and 1e300 came back from jsonb as an integer no hash can cover."""
    op = _pending(api)
    events = Event.objects.count()
    with pytest.raises(refusal):
        _edit(op, person(decide_on="refund"), edits)
    assert Operation.objects.count() == 1
    assert Operation.objects.get(pk=op["id"]).status == "awaiting_approval"
    assert Event.objects.count() == events


def test_refusals_write_nothing(api):
    op = _pending(api)
    approver = person(decide_on="refund")
    before = (Operation.objects.count(), Event.objects.count())
    with pytest.raises(errors.InvalidArguments, match="may be changed") as not_editable:
        _edit(op, approver, {"/payment_id": "pay_2"})
    assert not_editable.value.extra["errors"] == [
        {"path": "/arguments/payment_id", "message": "not editable"}
    ]
    with pytest.raises(errors.InvalidArguments) as invalid:
        _edit(op, approver, {"/amount_cents": 0})
    assert invalid.value.extra["errors"][0]["path"] == "/arguments/amount_cents"
    with pytest.raises(errors.InvalidArguments):
        _edit(op, approver, {"/note": "x" * 21})
    # Separation of duties holds for edits as for any decision.
    principal = person(decide_on="refund", username="alice")
    with pytest.raises(PermissionRefused, match="principal"):
        _edit(op, principal, {"/amount_cents": 10})
    assert (Operation.objects.count(), Event.objects.count()) == before
    assert ApprovalRequest.objects.get(pk=op["approval"]["id"]).status == "pending"


def test_an_edit_equal_to_the_value_is_a_plain_approval(api):
    op = _pending(api)
    result = _edit(op, person(decide_on="refund"), {"/amount_cents": 75000})
    assert result.id == op["id"]
    assert api.operation(op["id"])["status"] == "ready"


def test_the_runner_that_replays_the_original_key_is_told_of_the_successor(api):
    op = _pending(api)
    successor = _edit(op, person(decide_on="refund"), {"/amount_cents": 100})
    replay = api.register(
        op["run"],
        "refund",
        {"payment_id": "pay_1", "amount_cents": 75000, "card": "4111 1111 1111 1111"},
        operation_key="refund-551",
        expect=200,
    )
    assert replay["id"] == op["id"]
    assert replay["superseded_by"] == successor.id


def test_webhooks_report_the_supersession(api, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    response = api.post(
        "/api/v1/webhook-endpoints",
        {"url": "http://127.0.0.1:9/eg", "events": ["operation.*", "approval.decided"]},
    )
    assert response.status_code == 201, response.json()
    op = _pending(api)
    successor = _edit(op, person(decide_on="refund"), {"/amount_cents": 100})
    sent = list(OutboxMessage.objects.order_by("id").values_list("event_type", "operation_id"))
    assert ("operation.superseded", op["id"]) in sent
    assert ("approval.decided", op["id"]) in sent
    assert ("operation.ready", successor.id) in sent
    message = OutboxMessage.objects.get(event_type="operation.superseded")
    assert message.payload["data"]["operation"]["superseded_by"] == successor.id


@pytest.mark.parametrize(
    ("editable", "message"),
    [
        (["/card"], "sensitive field cannot be editable"),
        (["/nowhere"], "is not declared"),
    ],
)
def test_the_contract_refuses_editable_fields_a_person_cannot_read(editable, message):
    body = contract("irreversible", input_schema=SCHEMA, approval={"mode": "always"})
    body["approval"]["editable"] = editable
    with pytest.raises(errors.InvalidContract) as refused:
        normalize_contract(body)
    assert message in refused.value.extra["errors"][0]["message"]


def test_more_editable_fields_is_a_weakening_a_person_activates(api):
    first = contract("irreversible", input_schema=SCHEMA, approval={"mode": "always"})
    api.tool("refund", first)
    second = contract(
        "irreversible", input_schema=SCHEMA, approval={"mode": "always", "editable": ["/note"]}
    )
    answer = api.tool("refund", second)
    assert answer["active"] is False
    assert "more fields a person may edit when approving" in answer["weakens"]


def test_the_audit_finds_forged_edits(api):
    op = _pending(api)
    successor = _edit(op, person(decide_on="refund"), {"/amount_cents": 100})
    Operation.objects.filter(pk=successor.id).update(
        edits=[{"path": "/amount_cents", "from": 75000, "to": 99999}]
    )
    [problem] = [p for p in state_verify() if p.pk == successor.id]
    assert "differ from its registered event" in problem.problem


def test_a_number_json_cannot_carry_is_refused(api):
    op = _pending(api)
    with pytest.raises(errors.NumberOutOfRange):
        _edit(op, person(decide_on="refund"), {"/amount_cents": 2**60})
    assert Operation.objects.count() == 1
