"""Every API error is RFC 9457 problem+json with a stable code; bad JSON writes nothing."""

import json

import pytest
from rest_framework.test import APIClient

from operations.models import Event, Operation, Run


def _problem(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert body["code"] == code
    assert body["status"] == status
    assert {"type", "title", "detail"} <= set(body)
    return body


def _raw(api, path, data, content_type="application/json"):
    return api.client.generic("POST", path, data, content_type=content_type)


@pytest.mark.django_db
def test_missing_and_bad_tokens_are_401():
    client = APIClient()
    response = client.get("/api/v1/operations")
    _problem(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"].startswith("Bearer")
    client.credentials(HTTP_AUTHORIZATION="Bearer egr_nope")
    _problem(client.get("/api/v1/operations"), 401, "not_authenticated")


def test_revoked_token_is_401(api):
    from django.utils import timezone

    api.runner.tokens.update(revoked_at=timezone.now())
    _problem(api.get("/api/v1/tools"), 401, "not_authenticated")


NOT_ALLOWED = (405, "method_not_allowed", "This method is not allowed on this path")
UNSUPPORTED = (415, "unsupported_media_type", "The request body's media type is not supported")


def test_unknown_url_and_method(api):
    _problem(api.get("/api/v1/nothing-here"), 404, "not_found")
    response = api.client.delete("/api/v1/runs")
    body = _problem(response, 405, "method_not_allowed")
    # The title is the code in words; the detail names this request's method.
    assert body["title"] == NOT_ALLOWED[2]
    assert '"DELETE"' in body["detail"]
    assert "POST" in response["Allow"]


def test_wrong_content_type(api):
    response = _raw(api, "/api/v1/runs", "principal=x", "application/x-www-form-urlencoded")
    body = _problem(response, 415, "unsupported_media_type")
    assert body["title"] == UNSUPPORTED[2]
    assert '"application/x-www-form-urlencoded"' in body["detail"]
    assert Run.objects.count() == 0


@pytest.mark.parametrize(
    ("method", "path", "content_type", "expected", "specifics"),
    [
        ("PUT", "/api/v1/operations", "application/json", NOT_ALLOWED, "PUT"),
        ("PATCH", "/api/v1/tools/t", "application/json", NOT_ALLOWED, "PATCH"),
        ("POST", "/api/v1/runs", "text/plain", UNSUPPORTED, "text/plain"),
        ("PUT", "/api/v1/tools/t", "application/xml", UNSUPPORTED, "application/xml"),
    ],
)
def test_a_title_is_the_same_sentence_for_every_request_and_the_detail_is_specific(
    api, method, path, content_type, expected, specifics
):
    """Never a template with its placeholders unfilled (``Method "{method}" not
    allowed.``): the title is the code in words, the detail names this request's part."""
    status, code, title = expected
    response = api.client.generic(method, path, "{}", content_type=content_type)
    body = _problem(response, status, code)
    assert body["title"] == title
    assert f'"{specifics}"' in body["detail"]


def test_the_accept_header_problem_has_a_plain_title(api):
    response = api.get("/api/v1/runs", HTTP_ACCEPT="text/html")
    body = _problem(response, 406, "not_acceptable")
    assert body["title"] == "The Accept header excludes JSON"


@pytest.mark.parametrize(
    "payload",
    [
        b'{"principal": "a", "principal": "b"}',
        b'{"principal": "a", "budgets": {"max_spend": NaN}}',
        b'{"principal": "a", "budgets": {"max_spend": Infinity}}',
        b'{"principal": "a", "budgets": {"max_spend": -Infinity}}',
        b'{"principal": "a"',
        b'{"principal": "\xff\xfe"}',
        b'{"principal": "a\\u0000b"}',
        b'{"principal": "\\ud800"}',
        b"[" * 100 + b"]" * 100,
    ],
)
def test_malformed_json_is_400_and_writes_nothing(api, payload):
    _problem(_raw(api, "/api/v1/runs", payload), 400, "malformed_json")
    assert Run.objects.count() == 0


@pytest.mark.parametrize("number", [b"9007199254740992", b"-9007199254740992", b"1e400"])
def test_numbers_out_of_range_are_422_and_write_nothing(api, number):
    api.tool("t")
    run = api.run()
    body = (
        b'{"run": "' + run.encode() + b'", "tool": "t", "operation_key": "k", '
        b'"arguments": {"payment_id": "p", "amount_cents": ' + number + b"}}"
    )
    _problem(_raw(api, "/api/v1/operations", body), 422, "number_out_of_range")
    assert Operation.objects.count() == 0


def test_largest_safe_integer_is_accepted(api):
    api.tool("t")
    op = api.register(api.run(), "t", {"payment_id": "p", "amount_cents": 2**53 - 1})
    assert op["arguments"]["amount_cents"] == 2**53 - 1


def test_oversize_body_is_413(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    payload = json.dumps({"principal": "x" * 2000}).encode()
    _problem(_raw(api, "/api/v1/runs", payload), 413, "payload_too_large")
    assert Run.objects.count() == 0


def test_unknown_fields_are_refused(api):
    body = _problem(
        api.post("/api/v1/runs", {"principal": "a", "budget": {}}), 400, "invalid_request"
    )
    assert body["errors"] == [{"path": "/budget", "message": "Unknown field."}]


def test_internal_errors_are_problems_too(api, monkeypatch):
    from operations import services

    def boom(**kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(services, "run_create", boom)
    body = _problem(api.post("/api/v1/runs", {"principal": "a"}), 500, "internal_error")
    assert "secret internals" not in json.dumps(body)
    assert Event.objects.filter(kind="run_created").count() == 0


def test_every_code_mapped_from_a_drf_exception_has_a_title():
    from operations.http import problems

    mapped = {code for _, code in problems._DRF_CODES} | {"invalid_request"}
    assert set(problems._DRF_TITLES) == mapped
    assert all("{" not in title for title in problems._DRF_TITLES.values())


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize(
    ("method", "path"),
    [("get", "/api/v1/nope"), ("post", "/api/v2/tools"), ("get", "/api/v1/api/v1/tools/x")],
)
def test_an_unknown_api_path_is_a_problem_even_under_debug(api, settings, debug, method, path):
    settings.DEBUG = debug
    answer = getattr(api, method)(path)
    assert answer.status_code == 404
    assert answer["Content-Type"] == "application/problem+json"
    assert answer.json()["code"] == "not_found"
