"""Every answer carries an ``X-Request-Id``: the caller's when it is a plain token, the
server's own otherwise; the same id is in the problem body and in the request's log lines."""

import io
import logging
import re

import pytest
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from operations import requestids
from operations.http.throttling import WindowRateThrottle

MADE = re.compile(r"req_[0-9a-hjkmnp-tv-z]{26}")


def _made(response) -> str:
    request_id = response["X-Request-Id"]
    assert MADE.fullmatch(request_id), request_id
    return request_id


def _problem_id(response) -> str:
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["request_id"] == response["X-Request-Id"]
    return body["request_id"]


def test_made_ids_are_new_each_time_and_sort_by_time():
    made = [requestids.make() for _ in range(2000)]
    assert all(MADE.fullmatch(request_id) for request_id in made)
    assert len(set(made)) == len(made)
    # The first ten characters are the milliseconds: later ids never sort first.
    prefixes = [request_id[:14] for request_id in made]
    assert prefixes == sorted(prefixes)


@pytest.mark.parametrize(
    "sent",
    ["a", "trace-4bf92f3577b34da6.a3ce929d0e0e4736", "Z:1_2.3-4", "9" + "x" * 127],
)
def test_a_valid_id_is_kept(sent):
    assert requestids.accept(sent) == sent


@pytest.mark.parametrize(
    "sent",
    [
        None,
        "",
        "-leading-dash",
        "_leading",
        "x" * 129,
        "abc\n",
        "abc\r\nSet-Cookie: a=b",
        "two words",
        "caf\u00e9",
        "a/b",
        "a\x00",
    ],
)
def test_an_invalid_id_is_replaced_never_echoed(sent):
    made = requestids.accept(sent)
    assert MADE.fullmatch(made)
    assert made != sent


def test_an_api_success_carries_a_made_id(api):
    response = api.get("/api/v1/tools")
    assert response.status_code == 200
    first = _made(response)
    assert _made(api.get("/api/v1/tools")) != first


def test_a_problem_carries_the_header_id_in_its_body(api):
    response = api.get("/api/v1/operations/op_missing")
    assert response.status_code == 404
    assert MADE.fullmatch(_problem_id(response))


@pytest.mark.django_db
def test_problems_answered_before_any_view_carry_it_too(settings):
    client = APIClient()
    # No token: DRF's authentication refusal.
    assert MADE.fullmatch(_problem_id(client.get("/api/v1/operations")))
    # A URL no view serves (Django's 404 handler, under /api/).
    assert MADE.fullmatch(_problem_id(client.get("/api/v1/nothing-here")))
    # A header refused by the middleware that refuses U+0000 (the 400 handler).
    refused = client.get("/api/v1/tools", HTTP_X_NOTE="a\x00b")
    assert refused.status_code == 400
    assert MADE.fullmatch(_problem_id(refused))


def test_a_caller_id_is_kept_in_the_header_and_the_problem(api):
    sent = "trace-4bf92f3577b34da6:1"
    ok = api.get("/api/v1/tools", HTTP_X_REQUEST_ID=sent)
    assert ok["X-Request-Id"] == sent
    missing = api.get("/api/v1/operations/op_missing", HTTP_X_REQUEST_ID=sent)
    assert _problem_id(missing) == sent


@pytest.mark.parametrize("sent", ["x" * 129, "abc\r\nX-Injected: 1", "abc\n", "-x", "caf\u00e9"])
def test_an_invalid_caller_id_is_replaced_in_the_header_and_the_problem(api, sent):
    ok = api.get("/api/v1/tools", HTTP_X_REQUEST_ID=sent)
    assert _made(ok) != sent
    missing = api.get("/api/v1/operations/op_missing", HTTP_X_REQUEST_ID=sent)
    assert MADE.fullmatch(_problem_id(missing))
    assert "X-Injected" not in missing.headers


def test_middleware_refusals_carry_it(api, settings, database_cache, monkeypatch):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    too_large = api.client.generic(
        "POST", "/api/v1/runs", b'{"principal": "' + b"x" * 2000 + b'"}', "application/json"
    )
    assert too_large.status_code == 413
    assert MADE.fullmatch(_problem_id(too_large))
    # The token's rate: one request a minute, on a clock that stands still.
    monkeypatch.setattr(WindowRateThrottle, "timer", staticmethod(lambda: 90.0))
    settings.THROTTLE_RUNNER_RATE = "1/min"
    assert api.get("/api/v1/tools").status_code == 200
    limited = api.get("/api/v1/tools", HTTP_X_REQUEST_ID="retry-7")
    assert limited.status_code == 429
    assert limited.json()["code"] == "rate_limited"
    assert _problem_id(limited) == "retry-7"


@pytest.mark.django_db
def test_console_pages_and_their_404_carry_it():
    client = Client()
    page = client.get(reverse("login"))
    assert page.status_code == 200
    _made(page)
    missing = client.get("/no-such-page/", HTTP_X_REQUEST_ID="edge-1")
    assert missing.status_code == 404
    assert missing["X-Request-Id"] == "edge-1"
    assert "text/html" in missing["Content-Type"]


@pytest.fixture
def log_lines():
    """What the configured console handler (LOGGING in console/settings.py) writes."""
    handler = next(
        h
        for h in logging.getLogger().handlers
        if any(isinstance(f, requestids.RequestIdFilter) for f in h.filters)
    )
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    previous = handler.setStream(stream)
    try:
        yield stream
    finally:
        handler.setStream(previous)


def test_log_records_of_the_request_carry_it(api, monkeypatch, log_lines, caplog):
    from operations import services

    def boom(**kwargs):
        raise RuntimeError("failed in the service")

    monkeypatch.setattr(services, "run_create", boom)
    caplog.set_level(logging.INFO)
    response = api.post("/api/v1/runs", {"principal": "a"}, HTTP_X_REQUEST_ID="crash-42")
    assert response.status_code == 500
    assert _problem_id(response) == "crash-42"
    lines = [line for line in log_lines.getvalue().splitlines() if "Unhandled error" in line]
    assert lines
    assert all("request_id=crash-42 " in line for line in lines), lines
    records = [r for r in caplog.records if r.getMessage().startswith("Unhandled error")]
    assert records
    assert all(getattr(r, "request_id", None) == "crash-42" for r in records)
    # After the request, nothing is bound: a background line says so.
    logging.getLogger("operations.tasks").warning("outside any request")
    assert "request_id=- outside any request" in log_lines.getvalue()
