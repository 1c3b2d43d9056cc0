"""The lean path (operations/http/hot.py, console.middleware.ApiStackMiddleware) against
the generic one (the DRF views under the console's whole middleware stack): the same
inputs get the same answers and the same problems; the validation compiled from the
serializers accepts only what they accept, as they accept it, and what the OpenAPI
document describes."""

import json
from typing import Any

import jsonschema
import pytest
from django.test import override_settings
from django.urls import resolve
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.exceptions import ValidationError
from rest_framework.test import APIClient

from operations import services
from operations.http.hot import COMPILED
from operations.metrics import HTTP_REQUEST_DURATION
from operations.models import RunnerToken
from tests.conftest import contract, make_runner

HOT_PATHS = [
    "/api/v1/operations",
    "/api/v1/operations/op_x/attempts",
    "/api/v1/operations/op_x/attempts/1/heartbeat",
    "/api/v1/operations/op_x/attempts/1/outcome",
    "/api/v1/runs/run_x/outcomes",
]
# The headers an answer's meaning depends on; the rest (Date, Content-Length) vary.
HEADERS = [
    "Content-Type",
    "Allow",
    "WWW-Authenticate",
    "Retry-After",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "Referrer-Policy",
    "Cross-Origin-Opener-Policy",
]


def test_the_hot_endpoints_are_the_lean_views_and_take_the_api_middleware():
    # What the hypothesis state machine (tests/fuzz/test_stateful.py), the concurrency
    # tests and schemathesis send to these URLs goes through the lean views.
    for path in HOT_PATHS:
        assert hasattr(resolve(path).func, "drf_view"), path


def test_a_hot_post_skips_the_console_layers_and_keeps_id_metrics_and_headers(api):
    api.tool("t")
    run = api.run()
    route = "/api/v1/operations"
    before = HTTP_REQUEST_DURATION.labels(route=route, method="POST", status="201")._sum.get()
    response = api.post(
        route,
        {"run": run, "tool": "t", "operation_key": "k", "arguments": _args()},
        HTTP_X_REQUEST_ID="req-lean-1",
    )
    assert response.status_code == 201
    assert response["X-Request-Id"] == "req-lean-1"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert "Content-Security-Policy" not in response  # the console's pages have one
    assert not response.cookies  # no session, no CSRF cookie
    after = HTTP_REQUEST_DURATION.labels(route=route, method="POST", status="201")._sum.get()
    assert after > before
    # A NUL is refused before any view, as on every other path.
    refused = api.client.post(route + "?x=%00", {}, format="json")
    assert refused.status_code == 400
    assert refused.json()["code"] == "invalid_request"


def _args(n: int = 1) -> dict[str, Any]:
    return {"payment_id": f"pay_{n}", "amount_cents": 100 + n}


def _generic_client(api, token: str | None = None) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token or api.token}")
    return client


def _send(client: APIClient, method: str, path: str, body: Any, **extra: Any):
    if isinstance(body, bytes | str):
        content_type = extra.pop("content_type", "application/json")
        return client.generic(method, path, body, content_type=content_type, **extra)
    return client.generic(method, path, json.dumps(body), content_type="application/json", **extra)


def _answer(response) -> tuple[int, dict[str, str], Any]:
    headers = {name: response[name] for name in HEADERS if name in response}
    try:
        body = response.json()
    except ValueError:
        body = response.content
    return response.status_code, headers, _masked(body)


# What differs between two registrations of the same intent made by the two paths.
VOLATILE = {
    "request_id",
    "id",
    "operation_key",
    "idempotency_key",
    "created_at",
    "updated_at",
    "lease_until",
    "started_at",
    "deadline_at",
    "next_attempt_at",
    "allowed_next_actions",
    "retry_after_ms",
    "logical_operation_id",
}


def _masked(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: "*" if k in VOLATILE else _masked(v) for k, v in body.items()}
    if isinstance(body, list):
        return [_masked(item) for item in body]
    return body


def _both(api, method: str, path: str, body: Any, token: str | None = None, **extra: Any):
    client = _generic_client(api, token) if token else api.client
    if "HTTP_AUTHORIZATION" in extra:
        client = APIClient()  # the header sent as it is, or none
    lean = _answer(_send(client, method, path, body, **dict(extra)))
    with override_settings(API_LEAN_VIEWS=False, API_MIDDLEWARE=[]):
        generic_client = _generic_client(api, token)
        if "HTTP_AUTHORIZATION" in extra:
            generic_client = APIClient()
        generic = _answer(_send(generic_client, method, path, body, **dict(extra)))
    return lean, generic


def _setup(api) -> tuple[str, str]:
    api.tool("t", contract("irreversible"))
    run = api.run(max_tool_calls=100)
    op = api.register(run, "t", _args(), claim={"lease_s": 30})
    return run, op["id"]


REGISTRATION_REFUSALS: list[Any] = [
    {},
    [],
    [{}] * 51,
    "a string",
    7,
    {"run": "r", "tool": "t", "arguments": {}},
    {"run": 5, "tool": "t", "operation_key": "k", "arguments": {}},
    {"run": "r", "tool": "t", "operation_key": "k", "arguments": [], "extra": 1},
    {"run": "r", "tool": "t", "operation_key": "k", "arguments": None},
    {"run": "r" * 41, "tool": "t", "operation_key": "k", "arguments": {}},
    {"run": "RUN", "tool": "t", "operation_key": "k", "arguments": {}, "claim": {"lease_s": 0}},
    {"run": "RUN", "tool": "t", "operation_key": "k", "arguments": {}, "claim": {"lease_s": "9"}},
    {"run": "RUN", "tool": "t", "operation_key": "k", "arguments": {}, "turn": True},
    {"run": "RUN", "tool": "t", "operation_key": "k", "arguments": {}, "approval": {}},
    {"run": "RUN", "tool": "nope", "operation_key": "k", "arguments": {}},
    {"run": "run_nope", "tool": "t", "operation_key": "k", "arguments": {}},
    {"run": "RUN", "tool": "t", "operation_key": "k-bad", "arguments": {"payment_id": 1}},
    {"run": "RUN", "tool": "t", "operation_key": " k ", "arguments": {"x": 1}, "call_id": " "},
]


@pytest.mark.parametrize("index", range(len(REGISTRATION_REFUSALS)))
def test_a_registration_refused_is_refused_alike(api, index):
    run, _ = _setup(api)
    body = json.loads(json.dumps(REGISTRATION_REFUSALS[index]).replace("RUN", run))
    lean, generic = _both(api, "POST", "/api/v1/operations", body)
    assert lean == generic
    assert lean[0] >= 400 or lean[2]["results"], lean


OUTCOME_BODIES: list[Any] = [
    {"kind": "failed"},
    {"kind": "failed", "code": "timeout_unknown", "result": 1},
    {"kind": "success"},
    {"kind": "succeeded", "cost": -1},
    {"kind": "succeeded", "cost": 1e10},
    {"kind": "succeeded", "code": "not a code!"},
    {"kind": "succeeded", "retry_after_ms": 1.5},
    {"kind": "succeeded", "detail": "x" * 4001},
    {"kind": "unknown", "code": "timeout_unknown", "detail": " padded "},
    [1],
    "x",
]


@pytest.mark.parametrize("index", range(len(OUTCOME_BODIES)))
def test_an_outcome_refused_is_refused_alike(api, index):
    _, op = _setup(api)
    path = f"/api/v1/operations/{op}/attempts/1/outcome"
    lean, generic = _both(api, "POST", path, OUTCOME_BODIES[index])
    assert lean == generic
    assert lean[0] in (200, 400), lean


@pytest.mark.parametrize(
    ("path", "body", "extra"),
    [
        ("/api/v1/operations", b'{"run": 1,}', {}),
        ("/api/v1/operations", b'{"a": 1, "a": 2}', {}),
        ("/api/v1/operations", b'{"n": 9007199254740993}', {}),
        ("/api/v1/operations", b"run=1", {"content_type": "application/x-www-form-urlencoded"}),
        ("/api/v1/operations", b"{}", {"HTTP_ACCEPT": "text/html"}),
        ("/api/v1/operations", {}, {"HTTP_AUTHORIZATION": "Token abc"}),
        ("/api/v1/operations", {}, {"HTTP_AUTHORIZATION": "Bearer egr_unknown"}),
        ("/api/v1/operations", {}, {"HTTP_AUTHORIZATION": ""}),
        ("/api/v1/operations/OP/attempts", {"lease_s": 3601}, {}),
        ("/api/v1/operations/OP/attempts", {"lease_s": 30}, {}),
        ("/api/v1/operations/op_nope/attempts", {}, {}),
        ("/api/v1/operations/OP/attempts/1/heartbeat", {"lease_s": True}, {}),
        ("/api/v1/operations/OP/attempts/2/heartbeat", {}, {}),
        ("/api/v1/operations/OP/attempts/1/heartbeat", b"", {}),
        ("/api/v1/operations/op_nope/attempts/1/outcome", {"kind": "succeeded"}, {}),
        ("/api/v1/runs/RUN/outcomes", {"kind": "succeeded"}, {}),
        ("/api/v1/runs/RUN/outcomes", [], {}),
        ("/api/v1/runs/run_nope/outcomes", [{"operation": "OP", "attempt": 1}], {}),
        ("/api/v1/runs/RUN/outcomes", [{"operation": "OP", "attempt": 0, "kind": "x"}], {}),
    ],
)
def test_other_requests_are_answered_alike(api, path, body, extra):
    run, op = _setup(api)
    path = path.replace("RUN", run).replace("OP", op)
    if isinstance(body, dict | list):
        body = json.loads(json.dumps(body).replace('"OP"', json.dumps(op)))
    lean, generic = _both(api, "POST", path, body, **extra)
    assert lean == generic


def test_a_token_without_the_scope_is_refused_alike(api):
    token = services.token_create(
        runner=api.runner,
        actor=services.Actor.system("test"),
        scopes=[RunnerToken.SCOPE_REGISTER_CONTRACTS],
    )
    lean, generic = _both(api, "POST", "/api/v1/operations", {}, token=token)
    assert lean == generic
    assert lean[0] == 403


def test_a_body_too_large_is_refused_alike(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 100
    lean, generic = _both(api, "POST", "/api/v1/operations", {"x": "y" * 200})
    assert lean == generic
    assert lean[0] == 413


def test_throttling_counts_a_batch_as_its_items_alike(db, settings):
    settings.THROTTLE_RUNNER_RATE = "3/min"
    answers = []
    for lean in (True, False):
        api = make_runner()
        client = api.client if lean else _generic_client(api)
        with override_settings(API_LEAN_VIEWS=lean):
            two = _answer(_send(client, "POST", "/api/v1/operations", [{}, {}]))
            two_more = _answer(_send(client, "POST", "/api/v1/operations", [{}, {}]))
        answers.append((two, two_more))
    assert answers[0] == answers[1]
    (two, two_more) = answers[0]
    assert two[0] == 200
    assert [item["status"] for item in two[2]["results"]] == [400, 400]
    assert two_more[0] == 429
    assert two_more[2]["code"] == "rate_limited"


def test_successes_are_answered_alike(api):
    api.tool("t", contract("irreversible"))
    run = api.run(max_tool_calls=100)
    lean_ops, generic_ops = [], []
    for suffix, ops in (("lean", lean_ops), ("generic", generic_ops)):
        client = api.client if suffix == "lean" else _generic_client(api)
        with override_settings(API_LEAN_VIEWS=suffix == "lean"):
            steps = []
            body = {"run": run, "tool": "t", "operation_key": f"a-{suffix}", "arguments": _args()}
            steps.append(_answer(_send(client, "POST", "/api/v1/operations", body)))
            steps.append(_answer(_send(client, "POST", "/api/v1/operations", body)))
            claimed = {**body, "operation_key": f"b-{suffix}", "claim": {}}
            response = _send(client, "POST", "/api/v1/operations", claimed)
            steps.append(_answer(response))
            op = response.json()["id"]
            ops.append(op)
            base = f"/api/v1/operations/{op}/attempts/1"
            steps.append(_answer(_send(client, "POST", f"{base}/heartbeat", {"lease_s": 60})))
            done = {"kind": "succeeded", "downstream_id": "re_1", "cost": 2}
            steps.append(_answer(_send(client, "POST", f"{base}/outcome", done)))
            steps.append(_answer(_send(client, "POST", f"{base}/outcome", done)))
            first = _send(
                client, "POST", "/api/v1/operations", {**body, "operation_key": f"c-{suffix}"}
            )
            steps.append(_answer(first))
            steps.append(
                _answer(
                    _send(client, "POST", f"/api/v1/operations/{first.json()['id']}/attempts", b"")
                )
            )
            batch = [
                {**body, "operation_key": f"d-{suffix}-{n}", "claim": {"lease_s": 30}}
                for n in range(3)
            ]
            answer = _send(client, "POST", "/api/v1/operations", [*batch, {}, batch[0]])
            steps.append(_answer(answer))
            results = answer.json()["results"]
            outcomes = [
                {"operation": item["operation"]["id"], "attempt": 1, "kind": "succeeded"}
                for item in results[:3]
            ]
            outcomes.append({"operation": op, "attempt": 1, "kind": "failed", "code": "x_y"})
            steps.append(_answer(_send(client, "POST", f"/api/v1/runs/{run}/outcomes", outcomes)))
            ops.append(steps)
    for step, (mine, theirs) in enumerate(zip(lean_ops[1], generic_ops[1], strict=True)):
        assert mine == theirs, step
    statuses = [status for status, _, _ in lean_ops[1]]
    assert statuses == [201, 200, 201, 200, 200, 200, 201, 201, 200, 200]


# --- the compiled validation, the serializers and the document ---------------------------

TEXT = st.one_of(
    st.sampled_from(["", " ", "k", " k", "run_1", "a" * 41, "x_y", "timeout_unknown"]),
    st.text(max_size=12),
)
VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=5),
    st.sampled_from([0, 1, 30, 3600, 3601, 2**31, 1e9, 1e10, 0.5, -1.0]),
    TEXT,
    st.just({}),
    st.just([]),
    st.just({"lease_s": 30}),
    st.just({"require": True, "reason": " why"}),
    st.just({"lease_s": "30"}),
)
FIELDS = {
    name: sorted({*compiled.serializer_class().fields, "unknown"})
    for name, compiled in ((cls.__name__, c) for cls, c in COMPILED.items())
}
KINDS = st.sampled_from(["succeeded", "failed", "unknown", "other"])


def _bodies(cls_name: str):
    names = FIELDS[cls_name]
    values = {name: (KINDS if name == "kind" else VALUES) for name in names}
    return st.one_of(
        st.fixed_dictionaries({}, optional=values),
        st.sampled_from([[], "x", 1, None]),
    )


def _json_schema(schema: Any) -> Any:
    """OpenAPI 3.0's ``nullable`` in JSON Schema's words, which jsonschema reads."""
    if isinstance(schema, list):
        return [_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {k: _json_schema(v) for k, v in schema.items() if k != "nullable"}
    if schema.get("nullable"):
        if "type" in converted:
            converted["type"] = [converted["type"], "null"]
        elif "$ref" in converted or "allOf" in converted:
            converted = {"anyOf": [converted, {"type": "null"}]}
    return converted


def _document_schemas() -> dict[str, Any]:
    response = APIClient().get("/api/schema/", {"format": "json"})
    return _json_schema(response.json()["components"]["schemas"])


@pytest.mark.parametrize("cls", list(COMPILED), ids=lambda cls: cls.__name__)
def test_the_compiled_checks_accept_what_the_serializer_and_the_document_accept(db, cls):
    compiled = COMPILED[cls]
    components = _document_schemas()
    documented = {
        "$ref": f"#/components/schemas/{cls.__name__}Request",
        "components": {"schemas": components},
    }
    validator = jsonschema.Draft202012Validator(documented)

    @hypothesis_settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_bodies(cls.__name__))
    def check(body):
        accepted = compiled.accepts(body)
        serializer = cls(data=body)
        valid = serializer.is_valid()
        if accepted is not None:
            # Accepted outright: the serializer accepts it as it is, the document too.
            assert valid, (body, serializer.errors)
            assert accepted == json.loads(json.dumps(serializer.validated_data)), body
            validator.validate(body)
        # Whatever the compiled checks leave, the serializer decides: same data or errors.
        try:
            answered: Any = compiled(body)
        except ValidationError as refused:
            answered = ("refused", refused.detail)
        expected = dict(serializer.validated_data) if valid else ("refused", serializer.errors)
        assert answered == expected, body

    check()
