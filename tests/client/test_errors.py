"""The client's errors: one typed class per code the server can emit, and request ids.

The registry of ``ProblemError`` is held to the server's own list of codes and statuses
(``operations.http.problems.problem_codes()``), both ways. Every error names the
request it answers (``request_id``: the problem body's, else the ``X-Request-Id``
header), in ``str()`` and ``repr()`` too, so a runner's log line finds the server's.
"""

import re
import socket

import httpx
import pytest

import effectgate_client
from effectgate_client import (
    EffectgateClient,
    InvalidPrincipal,
    MalformedJSON,
    NotFound,
    OutcomeNotRecorded,
    ProblemError,
    RetryLater,
    ToolNotOwned,
    TransportError,
    UnexpectedResponse,
    UnknownTool,
)
from effectgate_client.errors import problem_from_response
from operations.http.problems import problem_codes
from operations.models import Operation
from tests.conftest import contract, make_runner

SERVER_ID = re.compile(r"req_[0-9a-z]{26}")


def test_the_client_has_a_typed_error_for_every_code_the_server_emits_and_no_other():
    server = problem_codes()
    client = {code: cls.http_status for code, cls in ProblemError.registry.items()}
    assert sorted(set(server) - set(client)) == [], "codes without a typed error"
    assert sorted(set(client) - set(server)) == [], "typed errors for codes never sent"
    assert client == server, "the statuses differ"


def test_each_typed_error_is_exported_and_named_after_its_code():
    for code, cls in ProblemError.registry.items():
        assert getattr(effectgate_client, cls.__name__) is cls
        assert cls.__name__ in effectgate_client.__all__
        assert cls.code == code
        # docs/client.md says so: the code in CamelCase, JSON as JSON.
        expected = "".join(part.capitalize() for part in code.split("_"))
        assert cls.__name__ == expected.replace("Json", "JSON"), code
    assert ProblemError.registry["malformed_json"] is MalformedJSON


def _answer(status, body=None, *, headers=None, text=None):
    request = httpx.Request("POST", "http://effectgate.test/api/v1/runs")
    if body is not None:
        return httpx.Response(status, json=body, headers=headers, request=request)
    return httpx.Response(status, text=text or "", headers=headers, request=request)


def _problem(status, code, **extra):
    return {
        "type": f"https://effectgate.dev/problems/{code}",
        "title": code,
        "status": status,
        "detail": f"detail of {code}",
        "code": code,
        **extra,
    }


def test_a_problem_takes_the_request_id_of_its_body_then_of_the_header():
    body = _problem(400, "invalid_principal", request_id="req_from_the_body")
    error = problem_from_response(_answer(400, body, headers={"X-Request-Id": "req_header"}))
    assert isinstance(error, InvalidPrincipal)
    assert error.request_id == "req_from_the_body"

    error = problem_from_response(
        _answer(403, _problem(403, "tool_not_owned"), headers={"X-Request-Id": "req_header"})
    )
    assert isinstance(error, ToolNotOwned)
    assert error.request_id == "req_header"

    error = problem_from_response(_answer(404, _problem(404, "not_found")))
    assert isinstance(error, NotFound)
    assert error.request_id is None
    assert str(error) == "404 not_found: detail of not_found"


@pytest.mark.parametrize(
    "value", ["", "a" * 129, "req_1\nX-Injected: yes", "-leading-dash", 42, "réq_1"]
)
def test_what_is_no_request_id_is_not_kept(value):
    """A body's ``request_id`` that Effectgate would never send (too long, a line break,
    not a string) is not carried into log lines; the header's is used instead."""
    body = _problem(409, "retry_later", request_id=value)
    error = problem_from_response(_answer(409, body, headers={"X-Request-Id": "req_header"}))
    assert error.request_id == "req_header"
    error = problem_from_response(_answer(409, body))
    assert error.request_id is None


def test_str_and_repr_name_the_request():
    body = _problem(409, "retry_later", request_id="req_01kbf3r8d5x2q9v7m4n6c8a0zt")
    error = problem_from_response(_answer(409, body))
    assert isinstance(error, RetryLater)
    assert (
        str(error)
        == "409 retry_later: detail of retry_later [request req_01kbf3r8d5x2q9v7m4n6c8a0zt]"
    )
    assert repr(error) == (
        "RetryLater(status=409, code='retry_later', detail='detail of retry_later', "
        "request_id='req_01kbf3r8d5x2q9v7m4n6c8a0zt')"
    )


def test_an_answer_that_is_no_problem_keeps_the_header_id():
    error = problem_from_response(
        _answer(502, text="<html>Bad gateway</html>", headers={"X-Request-Id": "req_proxy"})
    )
    assert isinstance(error, UnexpectedResponse)
    assert (error.status, error.request_id) == (502, "req_proxy")
    assert str(error) == "HTTP 502: <html>Bad gateway</html> [request req_proxy]"
    assert "request_id='req_proxy'" in repr(error)


def test_transport_errors_take_a_request_id_when_there_was_an_answer():
    error = TransportError("POST /runs: no answer", method="POST", path="/runs")
    assert error.request_id is None
    assert str(error) == "POST /runs: no answer"
    error = TransportError("POST /runs: cut", method="POST", path="/runs", request_id="req_1")
    assert (error.method, error.path, error.request_id) == ("POST", "/runs", "req_1")
    assert str(error) == "POST /runs: cut [request req_1]"
    assert repr(error) == (
        "TransportError('POST /runs: cut', method='POST', path='/runs', request_id='req_1')"
    )


def test_outcome_not_recorded_is_a_transport_error_with_what_to_post_again():
    outcome = {"kind": "succeeded", "result": {"id": "re_1"}}
    error = OutcomeNotRecorded("unreachable", operation_id="op_1", attempt=2, outcome=outcome)
    assert isinstance(error, TransportError)
    assert (error.operation_id, error.attempt, error.outcome) == ("op_1", 2, outcome)
    assert (error.method, error.path) == ("POST", "/operations/op_1/attempts/2/outcome")
    assert error.request_id is None
    error = OutcomeNotRecorded(
        "cut", operation_id="op_1", attempt=2, outcome=outcome, request_id="req_2"
    )
    assert error.request_id == "req_2"
    assert str(error) == "cut [request req_2]"


def test_the_client_raises_the_last_answers_request_id_after_repeats():
    ids = iter(["req_first", "req_second", "req_third"])

    def handler(request):
        return httpx.Response(
            503,
            json=_problem(503, "internal_error"),
            headers={"X-Request-Id": next(ids)},
        )

    client = EffectgateClient(
        "http://effectgate.test",
        "egr_token",
        transport=httpx.MockTransport(handler),
        sleep=lambda seconds: None,
        max_retries=2,
    )
    with pytest.raises(ProblemError) as raised:
        client.get_run("run_1")
    assert raised.value.request_id == "req_third"


def test_no_answer_no_request_id():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = EffectgateClient(f"http://127.0.0.1:{port}", "egr_token", max_retries=0)
    with pytest.raises(TransportError) as raised:
        client.get_run("run_1")
    assert raised.value.request_id is None
    assert "[request" not in str(raised.value)


# --- against a live server ---------------------------------------------------------------


class HeaderRecorder(httpx.HTTPTransport):
    """A real transport that keeps the ``X-Request-Id`` of every answer."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str | None] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.ids.append(response.headers.get("X-Request-Id"))
        return response


@pytest.mark.django_db(transaction=True)
def test_a_real_problem_names_its_request_in_the_body_the_header_and_the_message(live_server):
    with EffectgateClient(live_server.url, make_runner().token) as owner:
        owner.put_tool("owned_refund", contract("idempotent"))
    recorder = HeaderRecorder()
    with EffectgateClient(live_server.url, make_runner().token, transport=recorder) as other:
        with pytest.raises(ToolNotOwned) as raised:
            other.put_tool("owned_refund", contract("irreversible"))
        error = raised.value
        assert error.status == 403
        assert SERVER_ID.fullmatch(error.request_id or ""), error.request_id
        assert recorder.ids == [error.request_id], "the header's id is the body's"
        assert error.problem["request_id"] == error.request_id
        assert f"[request {error.request_id}]" in str(error)

        # Another request, another id: a registration refused before anything is written.
        run = other.create_run(principal="user:alice")
        with pytest.raises(UnknownTool) as unknown:
            other.register(run=run["id"], tool="no_such_tool", operation_key="k-1", arguments={})
        assert SERVER_ID.fullmatch(unknown.value.request_id or "")
        assert unknown.value.request_id == recorder.ids[-1]
        assert len(set(recorder.ids)) == len(recorder.ids) == 3
    assert not Operation.objects.exists()
