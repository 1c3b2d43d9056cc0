"""Tool contracts: registration, versions, defaults, weakening, bad contracts."""

import copy

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from operations.contracts import normalize_contract, weakenings
from operations.errors import InvalidContract
from operations.http.throttling import COUNTER_TABLE
from operations.models import Tool, ToolVersion
from tests.conftest import REFUND_SCHEMA, contract, make_runner


def test_put_creates_then_versions_only_on_change(api):
    response = api.put("/api/v1/tools/send_refund", contract("irreversible"))
    assert response.status_code == 201
    body = response.json()
    assert (body["name"], body["version"], body["active_version"]) == ("send_refund", 1, 1)
    assert body["effect_class"] == "irreversible"
    same = api.put("/api/v1/tools/send_refund", contract("irreversible"))
    assert same.status_code == 200
    assert same.json()["version"] == 1
    stricter = contract("irreversible")
    stricter["approval"] = {"mode": "always", "approvals_required": 2}
    changed = api.put("/api/v1/tools/send_refund", stricter)
    assert changed.status_code == 200
    assert (changed.json()["version"], changed.json()["active_version"]) == (2, 2)
    assert api.get("/api/v1/tools/send_refund").json()["approval"]["approvals_required"] == 2
    listed = api.get("/api/v1/tools").json()["results"]
    assert [(t["name"], t["version"]) for t in listed] == [("send_refund", 2)]


def test_weakening_version_stays_inactive_and_operations_keep_the_active_one(api):
    api.put("/api/v1/tools/refund", contract("irreversible", approval={"mode": "always"}))
    weaker = api.put("/api/v1/tools/refund", contract("irreversible", approval={"mode": "never"}))
    body = weaker.json()
    assert (body["version"], body["active_version"], body["active"]) == (2, 1, False)
    assert body["weakens"] == ["approval mode weakened from always to never"]
    op = api.register(api.run(), "refund")
    assert op["tool_version"] == 1
    assert op["status"] == "awaiting_approval"


# --- GET /tools: a page at a time, like the other lists --------------------------------


def _page(api, path: str, **params) -> dict:
    response = api.get(path, params or None)
    assert response.status_code == 200, response.json()
    return response.json()


def _path(url: str) -> str:
    return url.removeprefix("http://testserver")


def test_the_tool_list_is_paged_by_name_with_the_lists_cursor(api):
    for name in ("charge", "archive", "email", "bill", "delete"):
        api.tool(name, contract("irreversible", approval={"mode": "always"}))
    # A weakening version stays inactive: the list shows the version in force.
    api.put("/api/v1/tools/bill", contract("irreversible", approval={"mode": "never"}))

    first = _page(api, "/api/v1/tools", limit=2)
    assert set(first) == {"results", "next", "previous"}
    assert [(t["name"], t["version"], t["active"]) for t in first["results"]] == [
        ("archive", 1, True),
        ("bill", 1, True),
    ]
    assert first["previous"] is None
    second = _page(api, _path(first["next"]))
    assert [t["name"] for t in second["results"]] == ["charge", "delete"]
    last = _page(api, _path(second["next"]))
    assert [t["name"] for t in last["results"]] == ["email"]
    assert last["next"] is None
    back = _page(api, _path(last["previous"]))
    assert [t["name"] for t in back["results"]] == ["charge", "delete"]
    # Everything at once within the default page, each body as GET /tools/{name} has it.
    everything = _page(api, "/api/v1/tools")["results"]
    assert everything == [_page(api, f"/api/v1/tools/{t['name']}") for t in everything]
    assert Tool.objects.count() == 5
    assert ToolVersion.objects.filter(tool_id="bill").count() == 2


def test_the_tool_list_refuses_unknown_parameters_bad_limits_and_foreign_cursors(api):
    api.tool("refund")
    unknown = api.get("/api/v1/tools", {"name": "refund"})
    assert unknown.status_code == 400
    assert unknown.json()["code"] == "invalid_request"
    assert unknown.json()["errors"] == [
        {"path": "name", "message": "Unknown query parameter; this list takes cursor, limit."}
    ]
    for limit in ("0", "201", "ten"):
        bad = api.get("/api/v1/tools", {"limit": limit})
        assert (bad.status_code, bad.json()["code"]) == (400, "invalid_request"), limit
    foreign = api.get("/api/v1/tools", {"cursor": "not-a-cursor"})
    assert (foreign.status_code, foreign.json()["code"]) == (404, "not_found")
    assert _page(api, "/api/v1/tools", limit=200)["results"][0]["name"] == "refund"


def test_a_page_of_tools_costs_the_same_statements_however_many_tools(api):
    def statements() -> int:
        with CaptureQueriesContext(connection) as queries:
            _page(api, "/api/v1/tools")
        # The throttle's count (operations/http/throttling.py) is not the list's.
        return sum(COUNTER_TABLE not in query["sql"] for query in queries.captured_queries)

    other = make_runner()
    api.tool("a")
    other.tool("b")
    few = statements()
    for index in range(6):
        (api if index % 2 else other).tool(f"more_{index}")
    assert statements() == few
    owners = {t["name"]: t["owner"] for t in _page(api, "/api/v1/tools")["results"]}
    assert owners["a"] == api.runner.name
    assert owners["b"] == owners["more_0"] == other.runner.name


def test_defaults_depend_on_the_effect_class():
    irreversible = normalize_contract(
        {"effect_class": "irreversible", "input_schema": REFUND_SCHEMA}
    )
    assert irreversible["approval"]["mode"] == "always"
    assert irreversible["approval"]["grant_ttl_s"] == 900
    assert irreversible["approval"]["request_ttl_s"] == 86400
    assert irreversible["reconcile"] == {"mode": "manual", "url": None, "max_probes": 10}
    idempotent = normalize_contract({"effect_class": "idempotent", "input_schema": REFUND_SCHEMA})
    assert idempotent["approval"]["mode"] == "never"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda c: c.update(effect_class="idempotent"), "effect class lowered"),
        (lambda c: c["approval"].update(approvals_required=1), "fewer approvals required"),
        (lambda c: c["approval"].update(grant_ttl_s=3600), "longer grant_ttl_s"),
        (lambda c: c["approval"].update(request_ttl_s=10**6), "longer request_ttl_s"),
        (
            lambda c: c.update(
                reconcile={"mode": "lookup", "url": "https://x.test/{idempotency_key}"}
            ),
            "another reconciliation lookup URL",
        ),
        (lambda c: c["retry"]["retryable_codes"].append("timeout"), "more retryable codes"),
        (lambda c: c.update(concurrency_key=None), "concurrency key removed"),
    ],
)
def test_each_weakening_is_detected(change, reason):
    base = contract(
        "irreversible",
        approval={"mode": "always", "approvals_required": 2},
        concurrency_key="/payment_id",
    )
    old = normalize_contract(base)
    body = copy.deepcopy(base)
    change(body)
    reasons = weakenings(old, normalize_contract(body))
    assert any(r.startswith(reason) for r in reasons), reasons


def test_stricter_contract_is_not_a_weakening():
    old = normalize_contract(contract("compensable", approval={"mode": "never"}))
    new = normalize_contract(contract("irreversible", approval={"mode": "always"}))
    assert weakenings(old, new) == []


@pytest.mark.parametrize(
    "body",
    [
        {"effect_class": "dangerous", "input_schema": REFUND_SCHEMA},
        {"effect_class": "idempotent"},
        {"effect_class": "idempotent", "input_schema": {"type": "string"}},
        {"effect_class": "idempotent", "input_schema": {"type": 12}},
        {"effect_class": "idempotent", "input_schema": REFUND_SCHEMA, "aproval": {}},
        {
            "effect_class": "idempotent",
            "input_schema": REFUND_SCHEMA,
            "approval": {"mode": "rules", "rules": []},
        },
        {
            "effect_class": "idempotent",
            "input_schema": REFUND_SCHEMA,
            "approval": {"mode": "rules", "rules": [{"path": "amount", "op": "gt", "value": 1}]},
        },
        {
            "effect_class": "idempotent",
            "input_schema": REFUND_SCHEMA,
            "reconcile": {"mode": "lookup"},
        },
        {
            "effect_class": "idempotent",
            "input_schema": REFUND_SCHEMA,
            "reconcile": {"mode": "lookup", "url": "https://x.test/{secret}"},
        },
    ],
)
def test_bad_contracts_are_refused_and_nothing_is_stored(api, body):
    response = api.put("/api/v1/tools/bad", body)
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_contract"
    assert response.json()["errors"]
    assert not Tool.objects.filter(pk="bad").exists()


@pytest.mark.parametrize(
    ("block", "path"),
    [
        (
            {"retry": {"retryable_codes": ["rate_limited", "Rate-Limited"]}},
            "/retry/retryable_codes/1",
        ),
        ({"retry": {"retryable_codes": ["rate limited"]}}, "/retry/retryable_codes/0"),
        ({"retry": {"retryable_codes": ["x" * 65]}}, "/retry/retryable_codes/0"),
        ({"retry": {"retryable_codes": ["rate_limited\n"]}}, "/retry/retryable_codes/0"),
        (
            {"breaker": {"failure_codes": ["upstream_5xx", "Upstream-5xx"]}},
            "/breaker/failure_codes/1",
        ),
        ({"breaker": {"failure_codes": ["timeout\n"]}}, "/breaker/failure_codes/0"),
    ],
)
def test_codes_no_outcome_can_carry_are_refused(api, block, path):
    """A retryable or breaker code is compared with an outcome's ``code``, which matches
    ``^[a-z0-9_.:-]{1,64}$``: a code outside that could never match."""
    response = api.put("/api/v1/tools/t", contract("idempotent", **block))
    assert response.status_code == 422, response.json()
    assert response.json()["code"] == "invalid_contract"
    assert [error["path"] for error in response.json()["errors"]] == [path]
    assert not Tool.objects.filter(pk="t").exists()


def test_every_code_an_outcome_may_carry_is_accepted(api):
    codes = ["rate_limited", "upstream.5xx", "http:429", "a-b", "0", "x" * 64]
    body = contract("idempotent", retry={"retryable_codes": codes})
    body["breaker"] = {"failure_codes": codes, "threshold": 1000}
    stored = api.tool("t", body)
    assert stored["retry"]["retryable_codes"] == sorted(codes)
    assert stored["breaker"]["failure_codes"] == sorted(codes)
    # Each of them, posted as an outcome's code, is accepted and retried.
    for code in codes:
        op = api.register(api.run(), "t")
        api.claim(op["id"])
        assert api.outcome(op["id"], 1, {"kind": "failed", "code": code})["status"] == "ready"


def test_an_approval_rule_may_not_read_a_sensitive_field(api):
    schema = copy.deepcopy(REFUND_SCHEMA)
    schema["properties"]["amount_cents"]["x-sensitive"] = True
    body = contract(
        "irreversible",
        input_schema=schema,
        approval={"mode": "rules", "rules": [{"path": "/amount_cents", "op": "gt", "value": 1}]},
    )
    response = api.put("/api/v1/tools/t", body)
    assert response.status_code == 422
    assert response.json()["errors"][0]["path"] == "/approval/rules/0/path"


def test_contract_registration_needs_the_register_scope(api):
    api.runner.tokens.update(scopes=["use_tools"])
    response = api.put("/api/v1/tools/t", contract())
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"
    assert not ToolVersion.objects.exists()


def test_normalize_refuses_invalid_contract_directly():
    with pytest.raises(InvalidContract):
        normalize_contract(
            {
                "effect_class": "idempotent",
                "input_schema": REFUND_SCHEMA,
                "retry": {"base_delay_ms": 10, "max_delay_ms": 1},
            }
        )
