"""The client without a server: problem parsing, repeats, classification, waiters.

The tests of requests and repeats run with both clients (``flavor``): the
asynchronous one must send the same requests and repeat them by the same rules."""

import asyncio
import http.server
import inspect
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

import effectgate_client
from effectgate_client import (
    ApprovalRequired,
    AsyncEffectgateClient,
    AsyncNotifiedWaiter,
    AsyncPollingWaiter,
    AsyncRunner,
    AttemptInProgress,
    BudgetExhausted,
    CompensationRequired,
    ConcurrencyConflict,
    EffectgateClient,
    GrantInvalid,
    NotifiedWaiter,
    NotSent,
    OperationClosed,
    PollingWaiter,
    ProblemError,
    ReconciliationRequired,
    RetryLater,
    Runner,
    ToolForbidden,
    TransportError,
    UnexpectedResponse,
    Unknown,
    outcome_from_httpx_error,
)

ROOT = Path(__file__).resolve().parents[2]


def _problem(status, code, **extra):
    return {
        "type": f"https://effectgate.dev/problems/{code}",
        "title": code,
        "status": status,
        "detail": f"detail of {code}",
        "code": code,
        **extra,
    }


FLAVORS = pytest.mark.parametrize("flavor", ["sync", "async"])


class _Blocking:
    """The asynchronous client with each method run to its answer (``asyncio.run``;
    a mock transport holds no connection that would outlive its loop)."""

    def __init__(self, client):
        self._client = client

    def __getattr__(self, name):
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            result = attribute(*args, **kwargs)
            if inspect.isasyncgen(result):
                return asyncio.run(_collect(result))
            return asyncio.run(result)

        return call


async def _collect(items):
    return [item async for item in items]


def _client(handler, flavor="sync", sleep=None, **kwargs):
    if flavor == "sync":
        return EffectgateClient(
            "http://effectgate.test",
            "egr_token",
            transport=httpx.MockTransport(handler),
            sleep=sleep or (lambda seconds: None),
            **kwargs,
        )

    async def no_sleep(seconds):
        if sleep is not None:
            sleep(seconds)

    return _Blocking(
        AsyncEffectgateClient(
            "http://effectgate.test",
            "egr_token",
            transport=httpx.MockTransport(handler),
            sleep=no_sleep,
            **kwargs,
        )
    )


def test_the_package_imports_without_django():
    # A meta-path hook makes any import of django fail in a fresh interpreter.
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'django' or name.startswith('django.'):\n"
        "            raise ImportError('django is not installed here')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import effectgate_client, effectgate_client.runner, effectgate_client.waiters\n"
        "assert not any(m == 'django' or m.startswith('django.') for m in sys.modules)\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    for path in Path(effectgate_client.__file__).parent.glob("*.py"):
        assert not re.search(r"^\s*(import|from)\s+django", path.read_text(), re.M), path


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (409, "operation_closed", OperationClosed),
        (409, "reconciliation_required", ReconciliationRequired),
        (409, "compensation_required", CompensationRequired),
        (409, "approval_required", ApprovalRequired),
        (409, "attempt_in_progress", AttemptInProgress),
        (403, "tool_forbidden", ToolForbidden),
        (403, "grant_invalid", GrantInvalid),
        (409, "retry_later", RetryLater),
        (409, "budget_exhausted", BudgetExhausted),
        (409, "concurrency_conflict", ConcurrencyConflict),
    ],
)
@FLAVORS
def test_every_claim_refusal_is_its_own_type_and_is_not_repeated(status, code, cls, flavor):
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(status, json=_problem(status, code))

    client = _client(handler, flavor)
    with pytest.raises(cls) as caught:
        client.claim("op_1", lease_s=10)
    assert len(calls) == 1
    assert calls[0].url.path == "/api/v1/operations/op_1/attempts"
    assert calls[0].headers["authorization"] == "Bearer egr_token"
    assert (caught.value.status, caught.value.code) == (status, code)
    assert caught.value.detail == f"detail of {code}"


@FLAVORS
def test_retry_after_comes_from_the_body_or_the_header(flavor):
    def body(request):
        return httpx.Response(409, json=_problem(409, "retry_later", retry_after_ms=1500))

    with pytest.raises(RetryLater) as caught:
        _client(body, flavor).claim("op_1")
    assert caught.value.retry_after_ms == 1500
    assert caught.value.retry_after_s == 1.5

    def header(request):
        return httpx.Response(
            409, json=_problem(409, "attempt_in_progress"), headers={"Retry-After": "3"}
        )

    with pytest.raises(AttemptInProgress) as caught:
        _client(header, flavor).claim("op_1")
    assert caught.value.retry_after_ms == 3000


@FLAVORS
def test_unknown_code_still_raises_a_problem_with_its_body(flavor):
    def handler(request):
        return httpx.Response(418, json=_problem(418, "teapot", extra_field=1))

    with pytest.raises(ProblemError) as caught:
        _client(handler, flavor).get_operation("op_1")
    assert type(caught.value) is ProblemError
    assert caught.value.code == "teapot"
    assert caught.value.problem["extra_field"] == 1


@FLAVORS
def test_lost_answers_are_repeated_then_given_up(flavor):
    attempts = []

    def flaky(request):
        attempts.append(request)
        if len(attempts) < 3:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"id": "op_1", "status": "ready"})

    client = _client(flaky, flavor)
    assert client.get_operation("op_1")["status"] == "ready"
    assert len(attempts) == 3
    assert client.stats["lost:ConnectError"] == 2

    def down(request):
        raise httpx.ReadTimeout("no answer", request=request)

    with pytest.raises(TransportError) as caught:
        _client(down, flavor, max_retries=2).get_operation("op_1")
    assert "3 tries" in str(caught.value)


@FLAVORS
def test_server_errors_are_repeated_honouring_retry_after(flavor):
    waits = []
    answers = iter(
        [
            httpx.Response(503, text="<html>bad gateway</html>"),
            httpx.Response(429, json=_problem(429, "rate_limited"), headers={"Retry-After": "2"}),
            httpx.Response(200, json={"ok": True}),
        ]
    )
    client = _client(lambda request: next(answers), flavor, sleep=waits.append)
    assert client.get_run("run_1") == {"ok": True}
    assert waits[1] == 2.0
    assert client.stats["status:503"] == client.stats["status:429"] == 1

    with pytest.raises(UnexpectedResponse) as caught:
        _client(lambda r: httpx.Response(502, text="proxy"), flavor, max_retries=1).get_run("run_1")
    assert caught.value.status == 502


@FLAVORS
def test_a_refusal_after_a_repeat_is_marked_and_reconcile_reads_the_operation(flavor):
    calls = []

    def handler(request):
        calls.append(request.method)
        if len(calls) == 1:
            raise httpx.ReadError("lost", request=request)
        if request.method == "POST":
            return httpx.Response(409, json=_problem(409, "not_unknown"))
        return httpx.Response(200, json={"id": "op_1", "status": "succeeded"})

    assert _client(handler, flavor).reconcile("op_1", result="committed")["status"] == "succeeded"
    assert calls == ["POST", "POST", "GET"]


@FLAVORS
def test_register_requires_an_operation_key(flavor):
    with pytest.raises(ValueError, match="operation_key"):
        _client(lambda r: httpx.Response(500), flavor).register(
            run="run_1", tool="t", operation_key="", arguments={}
        )


@FLAVORS
def test_list_operations_follows_the_cursor(flavor):
    def handler(request):
        if "cursor" in request.url.params:
            return httpx.Response(200, json={"results": [{"id": "op_1"}], "next": None})
        return httpx.Response(
            200,
            json={
                "results": [{"id": "op_3"}, {"id": "op_2"}],
                "next": "http://effectgate.test/api/v1/operations?cursor=abc&limit=2",
            },
        )

    ids = [op["id"] for op in _client(handler, flavor).list_operations(run="run_1", limit=2)]
    assert ids == ["op_3", "op_2", "op_1"]


def test_httpx_errors_are_classified_conservatively():
    request = httpx.Request("POST", "http://provider.test/refunds")
    refused = outcome_from_httpx_error(httpx.ConnectError("refused", request=request))
    assert isinstance(refused, NotSent)
    assert refused.body()["code"] == "not_sent"
    for exc in (
        httpx.ReadTimeout("slow", request=request),
        httpx.RemoteProtocolError("Server disconnected", request=request),
        httpx.ReadError("reset", request=request),
        httpx.WriteError("broken pipe", request=request),
    ):
        outcome = outcome_from_httpx_error(exc)
        assert isinstance(outcome, Unknown), exc
        assert outcome.body()["kind"] == "unknown"
    assert outcome_from_httpx_error(httpx.ReadTimeout("x", request=request)).code == (
        "timeout_unknown"
    )


def test_an_httpx_error_says_where_it_failed_without_the_urls_secrets():
    request = httpx.Request("POST", "https://svc:pw@payments.example:8443/v1/refunds?key=k3y")
    secrets = ("pw", "k3y", "/v1/refunds", "Bearer")
    refused = outcome_from_httpx_error(httpx.ConnectError("[Errno 111] refused", request=request))
    assert refused.detail == (
        "The provider at payments.example:8443 could not be reached "
        "(ConnectError: [Errno 111] refused); nothing was sent."
    )
    header = httpx.LocalProtocolError("Illegal header value b'Bearer sk_live_1'", request=request)
    for exc, words in [
        (httpx.ConnectTimeout("timed out", request=request), "could not be reached"),
        (httpx.PoolTimeout("no free connection", request=request), "was free in time"),
        (header, "could not be sent (LocalProtocolError)"),
        (httpx.ReadTimeout("timed out", request=request), "sent to the provider at"),
    ]:
        detail = outcome_from_httpx_error(exc).detail
        assert words in detail, detail
        assert "payments.example:8443" in detail
        assert not [secret for secret in secrets if secret in detail], detail
    # An error raised without its request still reads as a sentence.
    assert outcome_from_httpx_error(httpx.ConnectError("refused")).detail.startswith(
        "The provider could not be reached (ConnectError: refused)"
    )


class FakeClient:
    def __init__(self, statuses):
        self.statuses = list(statuses)
        self.reads = 0

    def get_operation(self, operation_id):
        self.reads += 1
        status = self.statuses.pop(0) if len(self.statuses) > 1 else self.statuses[0]
        return {"id": operation_id, "status": status}


def test_polling_waiter_backs_off_and_stops_at_the_deadline():
    sleeps = []
    now = [0.0]

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds

    waiter = PollingWaiter(initial_s=1, max_s=4, sleep=sleep, clock=lambda: now[0])
    client = FakeClient(["awaiting_approval"])
    op = waiter.wait(client, {"id": "op_1"}, status="awaiting_approval", deadline=20)
    assert op["status"] == "awaiting_approval"
    assert now[0] == pytest.approx(20)
    # Ceilings 1, 2, 4, 4...: each wait is within [ceiling/2, ceiling] or cut by the deadline.
    assert 0.5 <= sleeps[0] <= 1
    assert 1 <= sleeps[1] <= 2
    assert 2 <= sleeps[2] <= 4
    assert max(sleeps) <= 4

    ready = FakeClient(["awaiting_approval", "awaiting_approval", "ready"])
    waiter = PollingWaiter(initial_s=0.01, sleep=lambda s: None)
    op = waiter.wait(
        ready, {"id": "op_1"}, status="awaiting_approval", deadline=time.monotonic() + 5
    )
    assert (op["status"], ready.reads) == ("ready", 3)


def test_notified_waiter_wakes_on_notify_long_before_its_fallback_poll():
    client = FakeClient(["awaiting_approval", "ready"])
    waiter = NotifiedWaiter(fallback_poll_s=30)
    timer = threading.Timer(0.2, waiter.notify, args=["op_1"])
    started = time.monotonic()
    timer.start()
    op = waiter.wait(client, {"id": "op_1"}, status="awaiting_approval", deadline=started + 60)
    assert op["status"] == "ready"
    assert time.monotonic() - started < 5
    assert client.reads == 2


def test_notified_waiter_polls_when_no_notification_comes():
    client = FakeClient(["awaiting_approval", "awaiting_approval", "ready"])
    waiter = NotifiedWaiter(fallback_poll_s=0.05)
    op = waiter.wait(
        client, {"id": "op_1"}, status="awaiting_approval", deadline=time.monotonic() + 5
    )
    assert (op["status"], client.reads) == ("ready", 3)


def test_only_results_effectgates_strict_json_accepts_travel_as_they_are():
    from effectgate_client.runner import _travels

    assert _travels({"id": 2**53 - 1, "name": "x", "items": [1.5, None, True]})
    refusals = (2**60, 1e300, -1e20, float("nan"), float("inf"), "a\x00b", "\ud800", {1: "x"})
    for refused in (*refusals, object()):
        assert not _travels(refused), refused
    deep: list = []
    for _ in range(70):
        deep = [deep]
    assert not _travels(deep)


class FakeAsyncClient(FakeClient):
    async def get_operation(self, operation_id):
        return FakeClient.get_operation(self, operation_id)


def test_async_polling_waiter_backs_off_like_the_polling_waiter():
    sleeps = []
    now = [0.0]

    async def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds

    waiter = AsyncPollingWaiter(initial_s=1, max_s=4, sleep=sleep, clock=lambda: now[0])
    client = FakeAsyncClient(["awaiting_approval"])
    op = asyncio.run(waiter.wait(client, {"id": "op_1"}, status="awaiting_approval", deadline=20))
    assert op["status"] == "awaiting_approval"
    assert now[0] == pytest.approx(20)
    assert 0.5 <= sleeps[0] <= 1
    assert 1 <= sleeps[1] <= 2
    assert 2 <= sleeps[2] <= 4
    assert max(sleeps) <= 4
    assert waiter.polls == client.reads


def test_async_notified_waiter_wakes_on_a_notify_from_another_thread():
    client = FakeAsyncClient(["awaiting_approval", "ready"])
    waiter = AsyncNotifiedWaiter(fallback_poll_s=30)
    timer = threading.Timer(0.2, waiter.notify, args=["op_1"])
    started = time.monotonic()
    timer.start()
    op = asyncio.run(
        waiter.wait(client, {"id": "op_1"}, status="awaiting_approval", deadline=started + 60)
    )
    assert op["status"] == "ready"
    assert time.monotonic() - started < 5
    assert client.reads == 2


def test_async_notified_waiter_ignores_other_operations_and_polls_when_nothing_comes():
    client = FakeAsyncClient(["awaiting_approval", "awaiting_approval", "ready"])
    waiter = AsyncNotifiedWaiter(fallback_poll_s=0.05)

    async def main():
        waiting = asyncio.ensure_future(
            waiter.wait(
                client, {"id": "op_1"}, status="awaiting_approval", deadline=time.monotonic() + 5
            )
        )
        await asyncio.sleep(0.01)
        waiter.notify("op_other")  # wakes the sleeper, which finds its version unchanged
        return await waiting

    op = asyncio.run(main())
    assert (op["status"], client.reads) == ("ready", 3)


class _HugeAnswers(http.server.BaseHTTPRequestHandler):
    """``/declared``: a Content-Length of 1 GB; anything else: a chunked body of
    ``TOTAL`` bytes, written until the client hangs up (``server.sent`` counts them)."""

    TOTAL = 64 * 1024 * 1024
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.path.endswith("/declared"):
            self.send_header("Content-Length", str(10**9))
            self.end_headers()
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"[" + b"0," * 32767 + b"0]"
        try:
            while self.server.sent < self.TOTAL:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.server.sent += len(chunk)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client hung up
        self.close_connection = True


@pytest.fixture
def huge_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HugeAnswers)
    server.sent = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@FLAVORS
@pytest.mark.parametrize("path", ["/declared", "/streamed"])
def test_an_answer_larger_than_max_response_bytes_is_not_read(huge_server, flavor, path):
    url = f"http://127.0.0.1:{huge_server.server_address[1]}"
    limit = 1024 * 1024
    if flavor == "sync":
        client = EffectgateClient(url, "egr_token", max_response_bytes=limit)
        call = lambda: client.request("GET", path)  # noqa: E731
    else:
        client = AsyncEffectgateClient(url, "egr_token", max_response_bytes=limit)

        async def answer():
            async with client:
                return await client.request("GET", path)

        call = lambda: asyncio.run(answer())  # noqa: E731
    with pytest.raises(UnexpectedResponse) as caught:
        call()
    assert caught.value.status == 200
    assert "max_response_bytes" in str(caught.value)
    # Refused for its Content-Length, or cut off soon after the limit: never read whole.
    assert huge_server.sent < _HugeAnswers.TOTAL / 4


@FLAVORS
def test_an_answer_within_max_response_bytes_is_read(flavor):
    body = {"items": ["x" * 100] * 100}
    client = _client(
        lambda request: httpx.Response(200, json=body), flavor, max_response_bytes=20_000
    )
    assert client.get_run("run_1") == body
    with pytest.raises(UnexpectedResponse):
        _client(
            lambda request: httpx.Response(200, json=body), flavor, max_response_bytes=5_000
        ).get_run("run_1")


@FLAVORS
def test_each_wait_a_retry_after_asks_for_is_capped(flavor):
    def answers():
        return iter(
            [
                httpx.Response(503, json=_problem(503, "busy"), headers={"Retry-After": "86400"}),
                httpx.Response(429, json=_problem(429, "rate_limited", retry_after_ms=10**12)),
                # No number (infinite): the client's own backoff, below the cap.
                httpx.Response(503, json=_problem(503, "busy"), headers={"Retry-After": "1e400"}),
                httpx.Response(200, json={"ok": True}),
            ]
        )

    waits = []
    replies = answers()
    assert _client(lambda r: next(replies), flavor, sleep=waits.append).get_run("r") == {"ok": True}
    assert waits[:2] == [60.0, 60.0]
    assert waits[2] <= 2.0

    waits.clear()
    replies = answers()
    client = _client(lambda r: next(replies), flavor, sleep=waits.append, max_retry_wait_s=1.5)
    assert client.get_run("r") == {"ok": True}
    assert waits[:2] == [1.5, 1.5]


def test_an_exception_detail_keeps_no_url_credentials_or_query_and_is_capped():
    from effectgate_client.runner import exception_detail

    error = ValueError(
        "POST https://user:sk_live_abc@host/x?token=secret failed; "
        "see http://key@other.example/a#k=v and ftp://h/p"
    )
    assert exception_detail(error) == (
        "ValueError: POST https://host/x failed; see http://other.example/a and ftp://h/p"
    )
    assert len(exception_detail(RuntimeError("y" * 5000))) == 200


@FLAVORS
def test_executes_wait_for_a_claims_retry_after_ms_is_capped(flavor):
    """A claim refused with an enormous ``retry_after_ms`` waits ``max_retry_wait_s``
    and claims again (instead of giving up at once, or waiting for days)."""
    claims = iter(
        [
            httpx.Response(409, json=_problem(409, "retry_later", retry_after_ms=10**12)),
            httpx.Response(409, json=_problem(409, "operation_closed")),
        ]
    )
    envelope = {"status": "cancelled", "code": "cancelled", "message": "m"}

    def handler(request):
        path = request.url.path
        if path.endswith("/operations"):
            return httpx.Response(201, json={"id": "op_1", "status": "ready", "attempt": None})
        if path.endswith("/attempts"):
            return next(claims)
        if path.endswith("/tool-result"):
            return httpx.Response(200, json=envelope)
        return httpx.Response(200, json={"id": "op_1", "status": "cancelled"})

    waits = []
    options = {"run": "run_1", "tool": "refund", "operation_key": "k", "arguments": {}}
    if flavor == "sync":
        client = _client(handler, max_retry_wait_s=0.5)
        runner = Runner(client, sleep=waits.append)
        result = runner.execute(call=lambda ctx: None, **options)
    else:

        async def hold(seconds):
            waits.append(seconds)

        async def main():
            async with AsyncEffectgateClient(
                "http://effectgate.test",
                "egr_token",
                transport=httpx.MockTransport(handler),
                max_retry_wait_s=0.5,
            ) as client:
                return await AsyncRunner(client, sleep=hold).execute(
                    call=lambda ctx: None, **options
                )

        result = asyncio.run(main())
    assert waits == [0.5]
    assert result.status == "cancelled"
