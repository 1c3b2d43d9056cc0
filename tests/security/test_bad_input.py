"""Bad input on every write endpoint: a 4xx problem, and nothing written or half-written.

Each endpoint is first shown to write when its body is valid (so that "nothing written"
means something), then sent every kind of bad body; after each, every ledger table's row
count and every operation's, run's and attempt's mutable state are unchanged.
"""

import json
from dataclasses import dataclass
from typing import Any

import pytest

from operations import services
from operations.models import Operation, Run, WebhookEndpoint
from tests.conftest import contract
from tests.support.world import Direct

from .conftest import ledger_state


@dataclass
class Endpoint:
    name: str
    method: str
    path: str
    body: dict[str, Any]


@pytest.fixture
def endpoints(api, settings) -> dict[str, Endpoint]:
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    # The objects the requests aim at, made through the services: the tests are about
    # the bodies sent to the API, not about making these.
    direct = Direct(api)
    direct.tool("t", contract("idempotent"))
    direct.tool("undo", contract("compensable"))
    direct.tool("pay", contract("irreversible", approval={"mode": "never"}))
    run = direct.run()
    executing = direct.register(run, "t")
    direct.claim(executing["id"])
    ready = direct.register(run, "t", {"payment_id": "p2", "amount_cents": 2})
    unknown = direct.register(run, "pay")
    direct.claim(unknown["id"])
    direct.outcome(unknown["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    compensating = direct.register(run, "undo")
    direct.claim(compensating["id"])
    direct.outcome(compensating["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    assert Operation.objects.get(pk=compensating["id"]).status == "compensating"
    endpoint, _ = services.webhook_endpoint_create(
        runner=api.runner, url="http://127.0.0.1:9/hook", events=["operation.*"]
    )
    ops = "/api/v1/operations"
    found = [
        Endpoint("tools", "put", "/api/v1/tools/t2", contract("read_only")),
        Endpoint("runs", "post", "/api/v1/runs", {"principal": "user:x", "budgets": {}}),
        Endpoint("run_cancel", "post", f"/api/v1/runs/{run}/cancel", {}),
        Endpoint(
            "operations",
            "post",
            ops,
            {
                "run": run,
                "tool": "t",
                "operation_key": "fresh",
                "arguments": {"payment_id": "p9", "amount_cents": 9},
            },
        ),
        Endpoint("attempts", "post", f"{ops}/{ready['id']}/attempts", {"lease_s": 30}),
        Endpoint(
            "heartbeat", "post", f"{ops}/{executing['id']}/attempts/1/heartbeat", {"lease_s": 60}
        ),
        Endpoint(
            "outcome",
            "post",
            f"{ops}/{executing['id']}/attempts/1/outcome",
            {"kind": "succeeded", "downstream_id": "re_1", "cost": 1.5},
        ),
        Endpoint(
            "reconciliations",
            "post",
            f"{ops}/{unknown['id']}/reconciliations",
            {"result": "committed", "downstream_id": "re_2", "evidence": {"seen": "yes"}},
        ),
        Endpoint(
            "compensations",
            "post",
            f"{ops}/{compensating['id']}/compensations",
            {"result": "committed", "evidence": {"undone": True}},
        ),
        Endpoint(
            "webhook_endpoints",
            "post",
            "/api/v1/webhook-endpoints",
            {"url": "http://127.0.0.1:9/other", "events": ["operation.*"]},
        ),
        Endpoint(
            "webhook_rotate", "post", f"/api/v1/webhook-endpoints/{endpoint.id}/rotate-secret", {}
        ),
    ]
    return {item.name: item for item in found}


NAMES = [
    "tools",
    "runs",
    "run_cancel",
    "operations",
    "attempts",
    "heartbeat",
    "outcome",
    "reconciliations",
    "compensations",
    "webhook_endpoints",
    "webhook_rotate",
]


def _send(api, endpoint: Endpoint, data: bytes, content_type: str = "application/json"):
    return api.client.generic(
        endpoint.method.upper(), endpoint.path, data, content_type=content_type
    )


def _problem(response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert {"type", "title", "status", "detail", "code"} <= set(body)
    if code is not None:
        assert body["code"] == code, body
    return body


@pytest.mark.parametrize("name", NAMES)
def test_a_valid_body_writes(api, endpoints, name):
    """The control: with a good body each endpoint does write something."""
    endpoint = endpoints[name]
    before = ledger_state()
    response = _send(api, endpoint, json.dumps(endpoint.body).encode())
    assert response.status_code in (200, 201), response.content[:500]
    assert ledger_state() != before


def _nest(depth: int) -> bytes:
    return b'{"a": ' * depth + b"1" + b"}" * depth


BAD_BODIES = [
    # (label, body or callable of the valid body, content type, status, code)
    ("not json", b"{not json", "application/json", 400, "malformed_json"),
    ("truncated", b'{"a": ', "application/json", 400, "malformed_json"),
    ("deep nesting", _nest(200), "application/json", 400, "malformed_json"),
    ("deep arrays", b"[" * 5000 + b"]" * 5000, "application/json", 400, "malformed_json"),
    ("invalid utf-8", b'{"a": "\xff\xfe"}', "application/json", 400, "malformed_json"),
    ("overlong utf-8", b'{"a": "\xc0\xaf"}', "application/json", 400, "malformed_json"),
    ("utf-8 bom", b'\xef\xbb\xbf{"a": 1}', "application/json", 400, "malformed_json"),
    ("lone surrogate", b'{"a": "\\ud800"}', "application/json", 400, "malformed_json"),
    ("nul character", b'{"a": "x\\u0000y"}', "application/json", 400, "malformed_json"),
    ("nul in a key", b'{"a\\u0000": 1}', "application/json", 400, "malformed_json"),
    ("duplicate keys", b'{"a": 1, "a": 2}', "application/json", 400, "malformed_json"),
    ("NaN", b'{"a": NaN}', "application/json", 400, "malformed_json"),
    ("Infinity", b'{"a": -Infinity}', "application/json", 400, "malformed_json"),
    ("huge integer", b'{"a": 9007199254740992}', "application/json", 422, "number_out_of_range"),
    ("huge float", b'{"a": 1e400}', "application/json", 422, "number_out_of_range"),
    (
        "5,000 digits",
        b'{"a": ' + b"9" * 5000 + b"}",
        "application/json",
        422,
        "number_out_of_range",
    ),
    ("20 digits", b'{"a": -' + b"9" * 20 + b"}", "application/json", 422, "number_out_of_range"),
    # Integers written as doubles: jsonb reads 1e300 back as a 301-digit integer.
    ("1e300", b'{"a": 1e300}', "application/json", 422, "number_out_of_range"),
    ("-1e20", b'{"a": -1e20}', "application/json", 422, "number_out_of_range"),
    ("2^53+1.0", b'{"a": 9007199254740993.0}', "application/json", 422, "number_out_of_range"),
    ("1.7e308", b'{"a": 1.7e308}', "application/json", 422, "number_out_of_range"),
    ("form body", b"a=1&b=2", "application/x-www-form-urlencoded", 415, "unsupported_media_type"),
    ("text body", b'{"a": 1}', "text/plain", 415, "unsupported_media_type"),
    ("multipart", b"--x\r\n\r\n--x--", "multipart/form-data; boundary=x", 415, None),
    ("json but not utf-8", b'{"a": "\xe9"}', "application/json; charset=latin-1", 400, None),
]


@pytest.mark.parametrize("name", NAMES)
def test_bad_bodies_are_refused_and_write_nothing(api, endpoints, name):
    endpoint = endpoints[name]
    before = ledger_state()
    for label, body, content_type, status, code in BAD_BODIES:
        response = _send(api, endpoint, body, content_type)
        assert response.status_code == status, (label, response.content[:300])
        _problem(response, status, code)
        assert ledger_state() == before, label


@pytest.mark.parametrize("name", NAMES)
def test_oversize_bodies_are_413_and_write_nothing(api, endpoints, settings, name):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    endpoint = endpoints[name]
    body = dict(endpoint.body) if endpoint.body else {}
    body["padding"] = "x" * 5000
    before = ledger_state()
    _problem(_send(api, endpoint, json.dumps(body).encode()), 413, "payload_too_large")
    assert ledger_state() == before


BODY_ENDPOINTS = [n for n in NAMES if n not in {"run_cancel", "webhook_rotate", "tools"}]


@pytest.mark.parametrize("name", BODY_ENDPOINTS)
def test_unknown_fields_are_refused_and_write_nothing(api, endpoints, name):
    endpoint = endpoints[name]
    before = ledger_state()
    body = _problem(
        _send(api, endpoint, json.dumps({**endpoint.body, "surprise": 1}).encode()),
        400,
        "invalid_request",
    )
    assert {"path": "/surprise", "message": "Unknown field."} in body["errors"]
    assert ledger_state() == before


def test_unknown_contract_fields_are_refused(api, endpoints):
    endpoint = endpoints["tools"]
    before = ledger_state()
    body = {**endpoint.body, "aproval": {"mode": "never"}}
    _problem(_send(api, endpoint, json.dumps(body).encode()), 422, "invalid_contract")
    assert ledger_state() == before


@pytest.mark.parametrize("name", [*BODY_ENDPOINTS, "tools"])
def test_a_body_that_is_not_an_object_is_refused(api, endpoints, name):
    endpoint = endpoints[name]
    before = ledger_state()
    for body in (b"[]", b'"text"', b"17", b"null", b"true", b"[{}]"):
        response = _send(api, endpoint, body)
        if name == "operations" and body == b"[{}]":
            # A batch of one (api.md, Batches): its item is refused as the single call.
            assert response.status_code == 200, response.content[:300]
            assert [item["status"] for item in response.json()["results"]] == [400]
        else:
            assert response.status_code in (400, 422), (body, response.content[:300])
        assert ledger_state() == before, body


MAX_SAFE = 2**53 - 1
# Numbers every JSON implementation holds exactly, but too large for what they count.
HUGE_BUT_SAFE = [
    ("runs", {"principal": "user:x", "budgets": {"max_tool_calls": MAX_SAFE}}),
    ("runs", {"principal": "user:x", "budgets": {"max_turns": MAX_SAFE}}),
    ("runs", {"principal": "user:x", "budgets": {"deadline_s": MAX_SAFE}}),
    ("runs", {"principal": "user:x", "budgets": {"max_spend": float(MAX_SAFE)}}),
    ("runs", {"principal": "user:x", "budgets": {"max_spend": 10.0**15}}),
    ("attempts", {"lease_s": MAX_SAFE}),
    ("heartbeat", {"lease_s": MAX_SAFE}),
    ("outcome", {"kind": "succeeded", "cost": float(MAX_SAFE)}),
    ("outcome", {"kind": "failed", "code": "rate_limited", "retry_after_ms": MAX_SAFE}),
    ("operations", {"turn": MAX_SAFE}),
    ("operations", {"claim": {"lease_s": MAX_SAFE}}),
]


def test_numbers_too_large_for_their_field_are_refused(api, endpoints):
    before = ledger_state()
    for name, fields in HUGE_BUT_SAFE:
        endpoint = endpoints[name]
        body = {**endpoint.body, **fields}
        response = _send(api, endpoint, json.dumps(body).encode())
        problem = _problem(response, 400, "invalid_request")
        assert problem["errors"], (name, fields)
        assert ledger_state() == before, (name, fields)


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        ("user:al\u200bice", "U+200B"),  # zero-width space
        ("user:\u202eecila", "U+202E"),  # right-to-left override
        ("user:\ufeff", "U+FEFF"),  # BOM inside a string
        ("user:\uffff", "U+FFFF"),  # a noncharacter
        ("user:al\u00a0ice", "U+00A0"),  # a space that is not U+0020
    ],
)
def test_principals_with_hiding_characters_are_refused(api, text, hidden):
    """A principal is an identity people are barred by: one that hides characters could
    name someone else than it shows, so it is refused and nothing is written."""
    before = ledger_state()
    problem = _problem(api.post("/api/v1/runs", {"principal": text}), 400, "invalid_principal")
    assert hidden in problem["detail"]
    assert ledger_state() == before


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("user:e\u0301", "user:\u00e9"),  # combining accent (NFD) becomes NFC
        ("user:\u00e9", "user:\u00e9"),
        ("user:ALICE", "user:alice"),  # case-folded
        ("user:\uff41lice", "user:alice"),  # fullwidth a (NFKC)
        ("user:\U0001f600", "user:\U0001f600"),  # outside the BMP, kept
    ],
)
def test_principals_are_normalized_identities(api, text, stored):
    run = api.post("/api/v1/runs", {"principal": text})
    assert run.status_code == 201
    assert Run.objects.get(pk=run.json()["id"]).principal == stored


def test_nfc_and_nfd_spellings_are_the_same_intent(api):
    api.tool("t")
    nfc = api.run(principal="user:\u00e9")
    nfd = api.run(principal="user:e\u0301")
    first = api.register(nfc, "t", operation_key="same-key")
    again = api.post(
        "/api/v1/operations",
        {
            "run": nfd,
            "tool": "t",
            "operation_key": "same-key",
            "arguments": {"payment_id": "pay_1", "amount_cents": 500},
        },
    )
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]


@pytest.mark.parametrize(
    "step",
    [
        "insert_all",  # after the operation row: its attempt and events
        "_run_count",  # after every row: the run's budget, the last statement
    ],
)
def test_a_refused_request_leaves_no_half_written_run(api, monkeypatch, step):
    """Atomicity: a failure after the first write of a request rolls every write back."""
    api.tool("t")
    run = api.run()
    before = ledger_state()

    def fail_after_writing(*args, **kwargs):
        raise RuntimeError("the write could not be made")

    monkeypatch.setattr(services.registration, step, fail_after_writing)
    response = api.post(
        "/api/v1/operations",
        {
            "run": run,
            "tool": "t",
            "operation_key": "k",
            "arguments": {"payment_id": "p", "amount_cents": 1},
            "claim": {"lease_s": 30},
        },
    )
    assert response.status_code == 500
    assert ledger_state() == before
    assert WebhookEndpoint.objects.count() == 0


@pytest.mark.parametrize(
    "params", [{"staus": "ready"}, {"limit": "0"}, {"limit": "201"}, {"limit": "null"}]
)
def test_listing_refuses_unknown_filters_and_bad_limits(api, params):
    """A misspelt filter must not silently list every operation."""
    _problem(api.get("/api/v1/operations", params), 400, "invalid_request")
    assert api.get("/api/v1/operations", {"status": "ready", "limit": "5"}).status_code == 200


def test_a_principal_that_normalization_lengthens_past_its_column_is_refused(api):
    """NFKC may expand a character (U+FDFA becomes 18 letters): 255 characters sent can
    be longer stored; that must be a 400, not a database error."""
    before = ledger_state()
    text = "user:" + "\ufdfa" * 20
    assert len(text) <= 255
    problem = _problem(api.post("/api/v1/runs", {"principal": text}), 400, "invalid_principal")
    assert "255" in problem["detail"]
    assert ledger_state() == before
