"""Input that no column can hold, or no arithmetic can use, is refused with a 4xx: never
a 500, on PostgreSQL (CI's database, which refuses U+0000 in text) as on SQLite.

Each test asserts the answer and that nothing was written or changed.
"""

import json
import time

import pytest
from django.test import Client

from operations import services
from operations.models import InboundEvent, Tool, WebhookEndpoint
from tests.conftest import contract
from tests.console.conftest import client_for
from tests.support.world import Direct

from .conftest import ledger_state


def _problem(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert body["code"] == code, body
    return body


# --- U+0000 in the path, the query string, a header or a form field ------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/api/v1/operations/op_%00"),
        ("get", "/api/v1/operations/op_%00/events"),
        ("get", "/api/v1/operations?status=%00"),
        ("get", "/api/v1/operations?run=run_%00"),
        ("get", "/api/v1/operations?%00=ready"),
        ("get", "/api/v1/runs/run_%00"),
        ("get", "/api/v1/tools/%00"),
        ("post", "/api/v1/operations/op_%00/attempts"),
    ],
)
def test_nul_in_an_api_url_is_a_400_problem(api, method, path):
    before = ledger_state()
    response = getattr(api.client, method)(path)
    problem = _problem(response, 400, "invalid_request")
    assert "U+0000" in problem["detail"]
    assert ledger_state() == before


def test_nul_in_an_api_url_is_a_problem_also_under_debug(api, settings):
    settings.DEBUG = True
    _problem(api.client.get("/api/v1/operations/op_%00"), 400, "invalid_request")


def test_deleting_a_webhook_endpoint_named_with_nul_is_refused_and_deletes_nothing(api):
    endpoint, _ = services.webhook_endpoint_create(
        runner=api.runner, url="https://93.184.215.14/x", events=["operation.*"]
    )
    before = ledger_state()
    _problem(api.client.delete("/api/v1/webhook-endpoints/%00"), 400, "invalid_request")
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert ledger_state() == before


def test_an_inbound_event_for_a_tool_named_with_nul_is_refused_without_a_token(db):
    response = Client().post("/api/v1/inbound/%00", b"{}", content_type="application/json")
    _problem(response, 400, "invalid_request")
    assert not InboundEvent.objects.exists()


def test_nul_in_a_header_is_refused_before_the_view(api):
    """A header a view stores (an inbound event's webhook-id, a traceparent) or that a
    lookup uses (the session cookie) with U+0000 fails in PostgreSQL; it is refused
    first, and its value is not repeated in the answer."""
    api.tool("t")
    run = api.run()
    before = ledger_state()
    response = api.post(
        "/api/v1/operations",
        {
            "run": run,
            "tool": "t",
            "operation_key": "k",
            "arguments": {"payment_id": "p", "amount_cents": 1},
        },
        HTTP_TRACEPARENT="00-secret\x00value",
    )
    problem = _problem(response, 400, "invalid_request")
    assert "Traceparent header" in problem["detail"]
    assert "secret" not in problem["detail"]
    assert ledger_state() == before


def test_a_session_cookie_with_nul_is_a_400_page(superuser):
    client = client_for(superuser)
    response = client.get("/operations/", HTTP_COOKIE="sessionid=abcdefgh\x00ijk")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    "path",
    [
        "/search/?q=%00",
        "/operations/?tool=%00",
        "/operations/?q=ab%00cd",
        "/reconciliation/?run=%00",
        "/operations/op_%00/",
        "/runs/?principal=%00",
        "/audit/?actor=%00",
        "/inbound/?tool=%00",
        "/?tool=%00",
        "/admin/operations/operation/?q=%00",
    ],
)
def test_nul_in_a_console_url_is_a_400_message_page(world, superuser, path):
    response = client_for(superuser).get(path)
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    assert "U+0000" in response.content.decode()


def test_nul_in_a_console_form_field_is_refused_and_changes_nothing(world, superuser):
    tool = Tool.objects.get(pk="refund")
    response = client_for(superuser).post(
        "/tools/refund/owner", {"action": "transfer", "runner": "r\x00"}
    )
    assert response.status_code == 400
    assert "form field &#x27;runner&#x27;" in response.content.decode()
    assert Tool.objects.get(pk="refund").owner_id == tool.owner_id


def test_a_signed_inbound_event_whose_id_holds_nul_is_refused_and_not_recorded(inbound_secret):
    """The provider holds the secret and may still send what no column holds."""
    response = _inbound(inbound_secret, str(int(time.time())), msg_id="evt\x00")
    _problem(response, 400, "invalid_request")
    assert not InboundEvent.objects.exists()


# --- integers longer than anything they count ----------------------------------------

TWENTY_DIGITS = "9" * 20
FIVE_THOUSAND_DIGITS = "9" * 5000


@pytest.fixture
def executing(api):
    direct = Direct(api)  # the tests are about what is posted to it, not about making it
    direct.tool("t")
    op = direct.register(direct.run(), "t")
    direct.claim(op["id"])
    return op


@pytest.mark.parametrize("number", [TWENTY_DIGITS, FIVE_THOUSAND_DIGITS, str(2**53)])
@pytest.mark.parametrize(
    ("step", "body"),
    [("outcome", {"kind": "succeeded"}), ("heartbeat", {"lease_s": 30})],
)
def test_an_attempt_number_beyond_2_53_in_the_path_is_404_and_records_nothing(
    api, executing, number, step, body
):
    before = ledger_state()
    response = api.post(f"/api/v1/operations/{executing['id']}/attempts/{number}/{step}", body)
    _problem(response, 404, "not_found")
    assert ledger_state() == before


def test_the_largest_attempt_number_the_path_admits_reaches_the_view(api, executing):
    response = api.post(
        f"/api/v1/operations/{executing['id']}/attempts/{2**53 - 1}/heartbeat", {"lease_s": 30}
    )
    problem = _problem(response, 404, "not_found")
    assert "attempt" in problem["detail"].lower()


@pytest.mark.parametrize("limit", ["\u00b2", "\u0661", FIVE_THOUSAND_DIGITS, TWENTY_DIGITS, "-1"])
def test_a_limit_that_is_not_plain_digits_in_range_is_a_400_problem(api, limit):
    problem = _problem(api.get("/api/v1/operations", {"limit": limit}), 400, "invalid_request")
    assert "limit" in problem["detail"]


@pytest.mark.parametrize("minutes", [TWENTY_DIGITS, FIVE_THOUSAND_DIGITS, "-5", "abc", "\u00b2"])
def test_an_age_filter_that_is_not_a_whole_number_in_range_is_a_400_page(world, superuser, minutes):
    response = client_for(superuser).get("/reconciliation/", {"min_age_m": minutes})
    assert response.status_code == 400
    assert "min_age_m must be a whole number" in response.content.decode()


def test_an_age_filter_in_range_still_filters(world, superuser):
    client = client_for(superuser)
    unknown = world.hidden[0]["id"]
    assert unknown in client.get("/reconciliation/", {"min_age_m": "0"}).content.decode()
    old = client.get("/reconciliation/", {"min_age_m": str(100 * 365 * 24 * 60)})
    assert old.status_code == 200
    assert unknown not in old.content.decode()


@pytest.fixture
def inbound_secret(api, capsys) -> str:
    from django.core.management import call_command

    inbound = {"type": "/type", "succeeded": ["ok"], "idempotency_key": "/key"}
    api.tool("refund", contract("irreversible", approval={"mode": "never"}, inbound=inbound))
    call_command("tool", "inbound-secret", "refund")
    return capsys.readouterr().out.strip().splitlines()[-1]


def _inbound(secret: str, stamp: str, *, signature: str | None = None, msg_id: str = "evt_1"):
    from operations import signing

    body = b'{"type": "ok"}'
    if signature is None:
        signature = signing.sign(secret, msg_id, int(stamp), body)
    return Client().post(
        "/api/v1/inbound/refund",
        body,
        content_type="application/json",
        HTTP_WEBHOOK_ID=msg_id,
        HTTP_WEBHOOK_TIMESTAMP=stamp,
        HTTP_WEBHOOK_SIGNATURE=signature,
    )


@pytest.mark.parametrize("stamp", [FIVE_THOUSAND_DIGITS, TWENTY_DIGITS, "\u00b9\u00b2"])
def test_a_webhook_timestamp_no_date_can_be_is_a_bad_signature(inbound_secret, stamp):
    """Even correctly signed (the provider holds the secret), a timestamp of more digits
    than 2^53-1 has is malformed, like one in other scripts' digits."""
    signature = None if stamp.isascii() and len(stamp) < 4300 else "v1,AAAA"
    response = _inbound(inbound_secret, stamp, signature=signature)
    _problem(response, 401, "invalid_signature")
    assert not InboundEvent.objects.exists()


@pytest.mark.parametrize("signature", ["v1,\u00e9t\u00e9", "v1,ok v1,\u00ff", "\u00e9"])
def test_a_signature_with_non_ascii_bytes_does_not_verify(inbound_secret, signature):
    """Header bytes beyond ASCII arrive as Latin-1 text, which a constant-time comparison
    refuses to compare (it raised, a 500)."""
    response = _inbound(inbound_secret, str(int(time.time())), signature=signature)
    _problem(response, 401, "invalid_signature")
    assert not InboundEvent.objects.exists()


def test_a_valid_signature_beside_a_non_ascii_one_still_verifies(inbound_secret):
    from operations import signing

    stamp = str(int(time.time()))
    good = signing.sign(inbound_secret, "evt_1", int(stamp), b'{"type": "ok"}')
    response = _inbound(inbound_secret, stamp, signature=f"v1,\u00e9 {good}")
    assert response.status_code == 200, response.content[:300]
    assert InboundEvent.objects.get().event_id == "evt_1"


@pytest.mark.parametrize("stamp", [str(2**53 - 1), "0"])
def test_a_signed_timestamp_centuries_away_is_a_stale_event(inbound_secret, stamp):
    """A far timestamp is stale, not a date overflow."""
    problem = _problem(_inbound(inbound_secret, stamp), 400, "stale_event")
    assert "replays are refused" in problem["detail"]
    assert not InboundEvent.objects.exists()


# --- numbers that RFC 8785 could not write once stored ---------------------------------

NUMBERS = {
    "type": "object",
    "required": ["n"],
    "properties": {"n": {"type": "number"}},
    "additionalProperties": False,
}


@pytest.fixture
def measure_run(api) -> str:
    api.tool("measure", contract("irreversible", input_schema=NUMBERS, approval={"mode": "always"}))
    return api.run()


def _register_number(api, run: str, text: str):
    body = (
        f'{{"run": "{run}", "tool": "measure", "operation_key": "k", "arguments": {{"n": {text}}}}}'
    )
    return api.client.post("/api/v1/operations", body.encode(), content_type="application/json")


@pytest.mark.parametrize("text", ["1e300", "-1e20", "1e16", "9007199254740992.0"])
def test_an_integer_written_as_a_double_beyond_2_53_is_refused_at_registration(
    api, measure_run, text
):
    """On PostgreSQL, 1e300 read back from jsonb is a 301-digit integer, which RFC 8785
    refuses: the approval page, which hashes what it shows, answered 500. It is refused
    where it arrives instead, like the integer it is."""
    before = ledger_state()
    response = _register_number(api, measure_run, text)
    _problem(response, 422, "number_out_of_range")
    assert ledger_state() == before


@pytest.mark.parametrize("text", ["1e15", "9007199254740991.0", "1.5e-300", "0.1"])
def test_a_double_within_2_53_is_stored_and_hashed_as_it_reads_back(
    api, measure_run, superuser, text
):
    """What the database gives back is the number that was hashed: the approval page
    (which recomputes the intent hash) renders, and the hash is the one registered."""
    from operations.canonical import intent_hash
    from operations.models import Operation

    response = _register_number(api, measure_run, text)
    assert response.status_code == 201, response.content[:300]
    op = Operation.objects.get(pk=response.json()["id"])
    assert op.arguments["n"] == float(text)
    assert intent_hash(tool="measure", arguments=op.arguments, principal=op.principal) == (
        op.intent_hash
    )
    page = client_for(superuser).get(f"/approvals/{response.json()['approval']['id']}/")
    assert page.status_code == 200


def test_minus_zero_is_stored_as_the_zero_its_hash_covers(api, measure_run):
    """RFC 8785 writes -0.0 as 0: the stored arguments say 0 too, on every database."""
    import math

    from operations.canonical import intent_hash
    from operations.models import Operation

    response = _register_number(api, measure_run, "-0.0")
    assert response.status_code == 201, response.content[:300]
    stored = Operation.objects.get(pk=response.json()["id"])
    assert stored.arguments == {"n": 0.0}
    assert math.copysign(1, stored.arguments["n"]) == 1
    assert response.json()["arguments"] == {"n": 0.0}
    assert stored.intent_hash == intent_hash(
        tool="measure", arguments={"n": 0}, principal=stored.principal
    )


# --- names matched in full: "$" also matches before a final newline -----------------


@pytest.mark.parametrize("name", ["nltool%0A", "a" * 100 + "%0A", "ok%0A%0A"])
def test_a_tool_name_with_a_final_newline_is_refused_and_nothing_is_stored(api, name):
    before = ledger_state()
    response = api.put(f"/api/v1/tools/{name}", contract())
    problem = _problem(response, 404, "not_found")
    assert "Tool names" in problem["detail"]
    assert not Tool.objects.filter(name__endswith="\n").exists()
    assert ledger_state() == before


def test_a_traceparent_with_a_final_newline_is_not_recorded(api):
    from operations.models import Operation

    api.tool("t")
    run = api.run()
    valid = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    for key, header, kept in [("k1", valid + "\n", ""), ("k2", valid, valid)]:
        body = {
            "run": run,
            "tool": "t",
            "operation_key": key,
            "arguments": {"payment_id": "p", "amount_cents": 1},
        }
        response = api.post("/api/v1/operations", body, HTTP_TRACEPARENT=header)
        assert response.status_code == 201, response.content[:300]
        assert Operation.objects.get(pk=response.json()["id"]).traceparent == kept


def test_a_display_currency_with_a_final_newline_is_an_invalid_contract(api):
    display = {"fields": {"/amount_cents": {"format": "money", "currency": "EUR\n"}}}
    before = ledger_state()
    problem = _problem(
        api.put("/api/v1/tools/t", contract(display=display)), 422, "invalid_contract"
    )
    assert [error["path"] for error in problem["errors"]] == [
        "/display/fields/~1amount_cents/currency"
    ]
    assert ledger_state() == before


def test_an_edit_typed_in_the_console_is_read_as_strictly_as_a_body(api, superuser):
    """The decision form reads a number or JSON edit with the API's strict parser: 1e300,
    a duplicate key or an escaped U+0000 decides nothing (and writes nothing)."""
    from approvals.models import ApprovalRequest
    from operations.models import Operation

    schema = {
        "type": "object",
        "required": ["n"],
        "properties": {"n": {"type": "number"}, "meta": {"type": "object"}},
    }
    approval = {"mode": "always", "editable": ["/n", "/meta"]}
    api.tool("measure", contract("irreversible", input_schema=schema, approval=approval))
    op = api.register(api.run(), "measure", {"n": 1, "meta": {}})
    client = client_for(superuser)
    for name, text in [
        ("edit-0", "1e300"),
        ("edit-1", '{"a": 1, "a": 2}'),
        ("edit-1", '{"a": "x\\u0000"}'),
    ]:
        response = client.post(
            f"/approvals/{op['approval']['id']}/decide",
            {"decision": "approve", name: text},
            follow=True,
        )
        assert "Nothing was decided." in response.content.decode(), text
        assert Operation.objects.count() == 1, text
        assert ApprovalRequest.objects.get(pk=op["approval"]["id"]).status == "pending"
