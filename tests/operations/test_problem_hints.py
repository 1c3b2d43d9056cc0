"""Refusals say what to send instead, over real HTTP against a live server: the
Authorization header's form, a body that is not JSON, a choice among a few values, and
query parameters (titled as such, naming the parameter)."""

import httpx
import pytest

from operations.models import Attempt, Run
from tests.conftest import contract, make_runner

pytestmark = pytest.mark.django_db(transaction=True)

SEND_BEARER = "send the runner token as the header Authorization: Bearer <token>."
QUERY_TITLE = "The query parameters are not valid"
BODY_TITLE = "The request body is not valid"


@pytest.fixture
def runner(live_server):
    return make_runner()


@pytest.fixture
def http(live_server, runner):
    headers = {"Authorization": f"Bearer {runner.token}"}
    with httpx.Client(base_url=f"{live_server.url}/api/v1", headers=headers) as client:
        yield client


def _problem(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/problem+json"
    body = response.json()
    assert (body["status"], body["code"]) == (status, code)
    return body


# Each test flushes the database for the live server: the cases of one refusal share one.
WRONG_HEADERS = [
    ("{token}", "The Authorization header holds a token without the Bearer scheme: "),
    ("Token {token}", "The Authorization header uses another scheme than Bearer: "),
    ("Basic {token}", "The Authorization header uses another scheme than Bearer: "),
    ("Bearer", "The Authorization header names the Bearer scheme but holds no token: "),
]


def test_a_token_not_sent_as_bearer_is_told_the_header_to_send(live_server, runner):
    for header, says in WRONG_HEADERS:
        response = httpx.get(
            f"{live_server.url}/api/v1/operations",
            headers={"Authorization": header.format(token=runner.token)},
        )

        body = _problem(response, 401, "not_authenticated")
        assert body["detail"] == says + SEND_BEARER, header
        assert response.headers["WWW-Authenticate"] == 'Bearer realm="effectgate"'
        assert runner.token not in response.text  # the header is never quoted back


def test_no_token_and_an_unknown_token_say_how_to_get_one(live_server):
    missing = httpx.get(f"{live_server.url}/api/v1/operations")
    unknown = httpx.get(
        f"{live_server.url}/api/v1/operations", headers={"Authorization": "Bearer egr_nope"}
    )

    assert _problem(missing, 401, "not_authenticated")["detail"] == (
        "No runner token was sent: send the runner token as the header "
        "Authorization: Bearer <token> (python manage.py runner token NAME issues one)."
    )
    assert (
        "python manage.py runner token NAME"
        in _problem(unknown, 401, "not_authenticated")["detail"]
    )


NOT_JSON = [
    ("application/x-www-form-urlencoded", "principal=user%3Aalice"),
    ("text/plain", '{"principal": "user:alice"}'),
    ("multipart/form-data; boundary=x", "--x\r\n\r\nuser:alice\r\n--x--\r\n"),
]


def test_a_body_that_is_not_json_is_told_to_send_json(http):
    for content_type, content in NOT_JSON:
        response = http.post("/runs", content=content, headers={"Content-Type": content_type})

        body = _problem(response, 415, "unsupported_media_type")
        assert body["detail"] == (
            f'Unsupported media type "{content_type}" in request. '
            "Send the body as JSON with the header Content-Type: application/json."
        )
    assert not Run.objects.exists()


def _claimed(http) -> str:
    assert http.put("/tools/hinted_refund", json=contract()).status_code == 201
    run = http.post("/runs", json={"principal": "user:alice"}).json()["id"]
    registered = http.post(
        "/operations",
        json={
            "run": run,
            "tool": "hinted_refund",
            "operation_key": "order-1:refund",
            "arguments": {"payment_id": "pay_1", "amount_cents": 500},
            "claim": {"lease_s": 60},
        },
    )
    assert registered.status_code == 201, registered.text
    return registered.json()["id"]


def test_an_invalid_outcome_kind_lists_the_valid_ones(http):
    op = _claimed(http)

    response = http.post(f"/operations/{op}/attempts/1/outcome", json={"kind": "success"})

    body = _problem(response, 400, "invalid_request")
    assert body["title"] == BODY_TITLE
    assert body["errors"] == [
        {
            "path": "/kind",
            "message": '"success" is not a valid choice; use one of: succeeded, failed, unknown.',
        }
    ]
    assert Attempt.objects.get(operation_id=op).status == "executing"


def test_an_invalid_reconciliation_result_lists_the_valid_ones(http):
    op = _claimed(http)

    response = http.post(f"/operations/{op}/reconciliations", json={"result": "done"})

    assert _problem(response, 400, "invalid_request")["errors"] == [
        {
            "path": "/result",
            "message": '"done" is not a valid choice; use one of: '
            "committed, not_found, still_unknown.",
        }
    ]


def test_an_unknown_query_parameter_is_titled_as_one_and_named(http):
    response = http.get("/operations", params={"operation_key": "order-1:refund"})

    body = _problem(response, 400, "invalid_request")
    assert body["title"] == QUERY_TITLE
    takes = "this list takes cursor, limit, run, status, tool"
    assert body["detail"] == f"Unknown query parameter 'operation_key': {takes}."
    assert body["errors"] == [
        {"path": "operation_key", "message": f"Unknown query parameter; {takes}."}
    ]


BAD_VALUES = [
    ("limit", "0", "Must be an integer from 1 to 200."),
    ("status", "succeded", "Must be one of: awaiting_approval, ready, "),
    ("status", "", "Must be one of: awaiting_approval, ready, "),
]


def test_a_bad_query_value_is_titled_as_a_query_problem_and_names_the_parameter(http):
    for parameter, value, must in BAD_VALUES:
        response = http.get("/operations", params={parameter: value})

        body = _problem(response, 400, "invalid_request")
        assert body["title"] == QUERY_TITLE
        assert body["detail"].startswith(f"The query parameter {parameter} is not valid: ")
        [error] = body["errors"]
        assert error["path"] == parameter
        assert error["message"].startswith(must)


def test_a_known_status_still_filters(http):
    _claimed(http)

    executing = http.get("/operations", params={"status": "executing"})
    ready = http.get("/operations", params={"status": "ready"})

    assert len(executing.json()["results"]) == 1
    assert ready.json()["results"] == []


def test_a_nul_in_a_query_parameter_is_titled_as_a_query_problem(http):
    response = http.get("/operations?status=%00")

    body = _problem(response, 400, "invalid_request")
    assert body["title"] == QUERY_TITLE
    assert "query parameter 'status'" in body["detail"]
