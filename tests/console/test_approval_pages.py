"""The inbox and the approval page, rendered by Django's test client."""

import pytest
from django.test import Client
from guardian.shortcuts import assign_perm

from approvals.models import ApprovalRequest
from operations import services
from operations.models import Operation, Tool
from tests.approvals.conftest import person
from tests.conftest import contract


def _pending(api, amount=60000, key=None):
    rules = {"mode": "rules", "rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}]}
    api.tool("refund", contract("irreversible", approval=rules))
    extra = {"operation_key": key} if key else {}
    return api.register(
        api.run(), "refund", {"payment_id": "pay\u202eevil", "amount_cents": amount}, **extra
    )


@pytest.fixture
def approver(api):
    api.tool("refund", contract("irreversible"))
    user = person(username="ann")
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk="refund"))
    client = Client()
    client.force_login(user)
    return user, client


def test_inbox_lists_pending_requests_for_tools_the_user_decides(api, approver):
    _, client = approver
    op = _pending(api)
    response = client.get("/")
    assert response.status_code == 200
    html = response.content.decode()
    assert op["id"] in html
    # Why, in words: the rule's label and its limit as the contract reads them.
    assert "Amount over 50,000 cents" in html
    outsider = Client()
    outsider.force_login(person())
    assert op["id"] not in outsider.get("/").content.decode()


def test_inbox_partial_for_htmx_polling(api, approver):
    _, client = approver
    op = _pending(api)
    response = client.get("/", {"partial": "1"}, HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith("<tbody")
    assert op["id"] in html
    assert "<h1>" not in html


def test_inbox_filters(api, approver):
    _, client = approver
    op = _pending(api)
    assert op["id"] in client.get("/", {"effect_class": "irreversible"}).content.decode()
    assert op["id"] not in client.get("/", {"effect_class": "read_only"}).content.decode()


def test_approval_page_shows_the_exact_intent_with_controls_revealed(api, approver):
    _, client = approver
    op = _pending(api)
    html = client.get(f"/approvals/{op['approval']['id']}/").content.decode()
    assert op["intent_hash"] in html
    assert "U+202E" in html  # the right-to-left override is shown, not obeyed
    assert "\u202e" not in html
    assert "0 of 1 approval" in html
    assert 'value="approve"' in html


def test_approving_in_the_console_lets_the_runner_claim(api, approver):
    _, client = approver
    op = _pending(api)
    url = f"/approvals/{op['approval']['id']}/decide"
    response = client.post(url, {"decision": "approve", "comment": "ok"})
    assert response.status_code == 302
    assert Operation.objects.get(pk=op["id"]).status == "ready"
    assert api.claim(op["id"])["attempt"] == 1


def test_rejecting_without_a_reason_shows_a_message_and_changes_nothing(api, approver):
    _, client = approver
    op = _pending(api)
    url = f"/approvals/{op['approval']['id']}/decide"
    response = client.post(url, {"decision": "reject", "comment": ""}, follow=True)
    assert "A rejection needs a reason" in response.content.decode()
    assert Operation.objects.get(pk=op["id"]).status == "awaiting_approval"


def test_the_principal_sees_why_they_cannot_decide(api):
    alice = person(username="alice")
    api.tool("refund", contract("irreversible"))
    assign_perm("operations.decide_tool", alice, Tool.objects.get(pk="refund"))
    op = _pending(api)  # the run's principal is user:alice
    client = Client()
    client.force_login(alice)
    html = client.get(f"/approvals/{op['approval']['id']}/").content.decode()
    assert "you are its principal" in html
    assert 'value="approve"' not in html
    client.post(f"/approvals/{op['approval']['id']}/decide", {"decision": "approve"})
    assert ApprovalRequest.objects.get(pk=op["approval"]["id"]).status == "pending"


def test_what_changed_since_the_previous_call(api, approver):
    _, client = approver
    _pending(api, amount=60000)
    run = Operation.objects.get().run_id
    second = api.register(run, "refund", {"payment_id": "pay_2", "amount_cents": 90000})
    html = client.get(f"/approvals/{second['approval']['id']}/").content.decode()
    assert "What differs from the previous refund call in this run" in html
    changed = html[html.index('id="changed"') :]
    changed = changed[: changed.index("</section>")]
    # Each change by its label, both values as they read and as they were written.
    assert "Amount" in changed
    assert "60,000 cents" in changed
    assert "90,000 cents" in changed
    assert '<span class="literal small">90000</span>' in changed
    assert "pay_2" in changed


def test_user_without_permission_gets_404_on_the_approval_page(api):
    op = _pending(api)
    client = Client()
    client.force_login(person())
    assert client.get(f"/approvals/{op['approval']['id']}/").status_code == 404
    response = client.post(f"/approvals/{op['approval']['id']}/decide", {"decision": "approve"})
    assert response.status_code == 404


def test_revoking_a_grant_from_the_console(api, approver):
    _, client = approver
    op = _pending(api)
    client.post(f"/approvals/{op['approval']['id']}/decide", {"decision": "approve"})
    client.post(f"/approvals/{op['approval']['id']}/revoke", {"reason": "wrong customer"})
    assert api.claim(op["id"], expect=403)["code"] == "grant_invalid"


def test_after_a_decision_the_next_request_this_person_may_decide_opens(api, approver):
    """Inbox order, skipping the requests the person may not decide (here, the one whose
    principal they are); the inbox once none is left."""
    user, client = approver
    first = _pending(api, key="a")
    barred = api.register(
        api.run(principal=f"user:{user.get_username()}"),
        "refund",
        {"payment_id": "pay_2", "amount_cents": 70000},
    )
    third = _pending(api, amount=80000, key="c")
    response = client.post(f"/approvals/{first['approval']['id']}/decide", {"decision": "approve"})
    assert response.status_code == 302
    assert response["Location"] == f"/approvals/{third['approval']['id']}/"
    assert barred["status"] == "awaiting_approval"
    response = client.post(f"/approvals/{third['approval']['id']}/decide", {"decision": "approve"})
    assert response["Location"] == "/"


def test_deciding_on_several_requests_at_once_decides_each_as_if_alone(api, approver):
    """Each selected request goes through the decision service on its own; one whose
    intent is not the one the inbox showed, one already decided and one the person may
    not decide are listed with why, and the rest are approved."""
    user, client = approver
    first = _pending(api, key="a")
    second = _pending(api, amount=70000, key="b")
    gone = _pending(api, amount=80000, key="c")
    barred = api.register(
        api.run(principal=f"user:{user.get_username()}"),
        "refund",
        {"payment_id": "pay_2", "amount_cents": 90000},
    )
    html = client.get("/").content.decode()
    assert 'form="decide-many"' in html
    assert "Approve selected" in html
    client.post(f"/approvals/{gone['approval']['id']}/decide", {"decision": "approve"})

    def value(op, intent=None):
        return f"{op['approval']['id']}:{intent or op['intent_hash']}"

    response = client.post(
        "/approvals/decide",
        {
            "decision": "approve",
            "request": [
                value(first),
                value(second, intent="0" * 64),
                value(gone),
                value(barred),
            ],
        },
        follow=True,
    )
    shown = [str(message) for message in response.context["messages"]]
    assert f"Approved 1: {first['id']}." in shown
    assert f"Not decided, {second['id']}: its intent is not the one the inbox showed" in shown
    assert f"Not decided, {gone['id']}: already approved" in shown
    assert any(line.startswith(f"Not decided, {barred['id']}: ") for line in shown)
    statuses = {
        key: ApprovalRequest.objects.get(pk=op["approval"]["id"]).status
        for key, op in {"first": first, "second": second, "barred": barred}.items()
    }
    assert statuses == {"first": "approved", "second": "pending", "barred": "pending"}


def test_rejecting_several_without_a_reason_changes_nothing(api, approver):
    _, client = approver
    op = _pending(api)
    response = client.post(
        "/approvals/decide",
        {"decision": "reject", "request": [f"{op['approval']['id']}:{op['intent_hash']}"]},
        follow=True,
    )
    assert "Write why, to reject" in response.content.decode()
    assert ApprovalRequest.objects.get(pk=op["approval"]["id"]).status == "pending"


def test_rows_and_the_approval_page_lead_with_what_will_happen(api, approver):
    """The contract's display, with hidden characters revealed; the reason once."""
    user, client = approver
    rules = {"mode": "rules", "rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}]}
    display = {
        "summary": "Refund {/amount_cents} to {/payment_id}",
        "fields": {"/amount_cents": {"format": "money", "currency": "EUR", "minor_units": True}},
    }
    api.tool("payout", {**contract("irreversible", approval=rules), "display": display})
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk="payout"))
    op = api.register(api.run(), "payout", {"payment_id": "pay\u202eevil", "amount_cents": 75000})
    inbox = client.get("/").content.decode()
    assert "Refund €750.00 to pay" in inbox
    assert "\u202e" not in inbox
    assert "U+202E" in inbox
    # In the checkbox's label too, as plain text: no markup inside an attribute.
    assert 'aria-label="Select Refund €750.00 to pay[U+202E]evil"' in inbox
    page = client.get(f"/approvals/{op['approval']['id']}/").content.decode()
    assert '<h1 class="lead">Refund €750.00 to pay' in page
    # The rule in words, in the currency of the display; the recorded sentence once,
    # folded with the identifiers.
    assert "Amount over €500.00" in page
    assert page.count("/amount_cents gt 50000") == 1


def _editable(api, user, amount=60000):
    api.tool(
        "capped_refund",
        contract(
            "irreversible",
            approval={"mode": "always", "editable": ["/amount_cents"]},
            display={"fields": {"/amount_cents": {"label": "Amount in cents"}}},
        ),
    )
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk="capped_refund"))
    return api.register(api.run(), "capped_refund", {"payment_id": "pay_1", "amount_cents": amount})


def test_a_person_changes_an_editable_field_when_approving(api, approver):
    user, client = approver
    op = _editable(api, user)
    page = client.get(f"/approvals/{op['approval']['id']}/").content.decode()
    assert "Change before approving" in page
    assert 'name="edit-0"' in page
    assert 'value="60000"' in page
    assert "Amount in cents" in page
    response = client.post(
        f"/approvals/{op['approval']['id']}/decide",
        {"decision": "approve", "comment": "capped", "edit-0": "50000"},
        follow=True,
    )
    html = response.content.decode()
    successor = Operation.objects.get(previous_id=op["id"])
    assert f"with your changes as {successor.id}" in html
    assert successor.arguments["amount_cents"] == 50000
    assert successor.status == "ready"
    assert Operation.objects.get(pk=op["id"]).status == "superseded"
    # The original's page says where the call went.
    original = client.get(f"/approvals/{op['approval']['id']}/").content.decode()
    assert "it runs as" in original
    assert successor.id in original


def test_an_unchanged_editable_field_approves_as_is(api, approver):
    user, client = approver
    op = _editable(api, user)
    client.post(
        f"/approvals/{op['approval']['id']}/decide", {"decision": "approve", "edit-0": "60000"}
    )
    assert Operation.objects.get(pk=op["id"]).status == "ready"
    assert not Operation.objects.filter(previous_id=op["id"]).exists()


@pytest.mark.parametrize(("text", "message"), [("ten", "is not a valid integer"), ("0", "minimum")])
def test_an_edit_that_cannot_be_read_or_breaks_the_schema_decides_nothing(
    api, approver, text, message
):
    user, client = approver
    op = _editable(api, user)
    response = client.post(
        f"/approvals/{op['approval']['id']}/decide",
        {"decision": "approve", "edit-0": text},
        follow=True,
    )
    html = response.content.decode()
    assert "Nothing was decided." in html
    assert message in html
    assert Operation.objects.get(pk=op["id"]).status == "awaiting_approval"
    assert ApprovalRequest.objects.get(pk=op["approval"]["id"]).status == "pending"


def test_the_operation_page_polls_its_state_and_names_who_changed_it(api, approver):
    user, client = approver
    op = _editable(api, user)
    page = client.get(f"/operations/{op['id']}/").content.decode()
    assert 'id="operation-opened" data-state="awaiting_approval:2"' in page
    assert 'hx-trigger="every 5s"' in page
    services.approval_decide(
        request_id=op["approval"]["id"], user=user, approve=True, comment="", edits=None
    )
    live = client.get(
        f"/operations/{op['id']}/", {"partial": "1"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert live.lstrip().startswith('<div id="operation-live" data-state="ready:4"')
    assert "granted by user:ann" in live
    assert "<h1>" not in live


def test_a_closed_operation_page_does_not_poll(api, approver):
    user, client = approver
    op = _editable(api, user)
    successor = services.approval_decide(
        request_id=op["approval"]["id"],
        user=user,
        approve=True,
        comment="",
        edits={"/amount_cents": 5},
    )
    page = client.get(f"/operations/{op['id']}/").content.decode()
    assert 'hx-trigger="every 5s"' not in page
    assert "approved with changes as" in page
    assert successor.id in page
    edited = client.get(f"/operations/{successor.id}/").content.decode()
    assert "Edited copy of" in edited


def test_nan_and_untouched_empty_fields_decide_nothing_wrong(api, approver):
    user, client = approver
    op = _editable(api, user)
    response = client.post(
        f"/approvals/{op['approval']['id']}/decide",
        {"decision": "approve", "edit-0": "NaN"},
        follow=True,
    )
    assert response.status_code == 200
    assert "Nothing was decided." in response.content.decode()
    # An emptied number field means "leave it": a plain approval.
    client.post(f"/approvals/{op['approval']['id']}/decide", {"decision": "approve", "edit-0": ""})
    assert Operation.objects.get(pk=op["id"]).status == "ready"
    assert not Operation.objects.filter(previous_id=op["id"]).exists()
