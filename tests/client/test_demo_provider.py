"""``effectgate_client.demo``, the stand-in payment provider of the client's quick start,
over real HTTP: one refund per idempotency key, lookups in the shape Effectgate reads,
refusals that say what to send."""

import subprocess
import sys

import httpx
import pytest

from effectgate_client.demo import MAX_BODY_BYTES, DemoProvider
from operations.dispatch.probes import _parse
from tests.support.net import free_port, wait_for_port


@pytest.fixture
def provider():
    with DemoProvider() as demo:
        yield demo


@pytest.fixture
def http(provider):
    with httpx.Client(base_url=provider.url, timeout=5) as client:
        yield client


def _refund(http, key, payment_id="pay_1", amount_cents=500):
    body = {"payment_id": payment_id, "amount_cents": amount_cents}
    return http.post("/refunds", json=body, headers={"Idempotency-Key": key})


def test_a_refund_is_committed_once_per_key(provider, http):
    first = _refund(http, "key-1")
    again = _refund(http, "key-1", amount_cents=900)
    other = _refund(http, "key-2")

    assert first.status_code == again.status_code == other.status_code == 200
    assert first.json() == {
        "id": "re_0000001",
        "status": "succeeded",
        "payment_id": "pay_1",
        "amount_cents": 500,
    }
    assert again.json() == first.json()  # the repeat answers the refund already made
    assert other.json()["id"] == "re_0000002"
    assert sorted(provider.refunds) == ["key-1", "key-2"]


def test_lookups_answer_what_effectgate_reads(provider, http):
    _refund(http, "key/1 +")
    template = provider.lookup_template
    assert template == f"{provider.url}/refunds/lookup/{{idempotency_key}}"

    committed = http.get("/refunds/lookup/key%2F1%20%2B")
    missing = http.get("/refunds/lookup/never-sent")

    assert committed.status_code == missing.status_code == 200
    assert committed.json()["result"] == "committed"
    assert committed.json()["downstream_id"] == "re_0000001"
    assert missing.json()["result"] == "not_found"
    # Effectgate's probe reads both as answers, not as failed probes.
    assert _parse(committed, committed.content).result == "committed"
    assert _parse(missing, missing.content).result == "not_found"


@pytest.mark.parametrize(
    ("body", "headers", "status", "says"),
    [
        (b'{"payment_id": "pay_1", "amount_cents": 5}', {}, 428, "Idempotency-Key"),
        (b"payment_id=pay_1", {"Idempotency-Key": "k"}, 400, "payment_id"),
        (b'{"payment_id": "pay_1", "amount_cents": 0}', {"Idempotency-Key": "k"}, 400, ">= 1"),
        (b'{"payment_id": "", "amount_cents": true}', {"Idempotency-Key": "k"}, 400, "int"),
        (b"x" * (MAX_BODY_BYTES + 1), {"Idempotency-Key": "k"}, 413, "at most"),
    ],
)
def test_a_request_it_cannot_take_is_refused_saying_what_to_send(
    provider, http, body, headers, status, says
):
    response = http.post("/refunds", content=body, headers=headers)
    assert response.status_code == status
    assert says in response.json()["error"]
    assert provider.refunds == {}


def test_other_paths_are_404(http):
    assert http.get("/refunds").status_code == 404
    assert http.post("/payments", json={}).status_code == 404


def test_python_m_serves_it_until_interrupted():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "effectgate_client.demo", "--port", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first_line = process.stdout.readline()
        assert first_line.startswith(f"Demo payment provider on http://127.0.0.1:{port} ")
        wait_for_port(port, process=process)
        answer = httpx.post(
            f"http://127.0.0.1:{port}/refunds",
            json={"payment_id": "pay_1", "amount_cents": 100},
            headers={"Idempotency-Key": "k"},
        )
        assert answer.json()["id"] == "re_0000001"
    finally:
        process.terminate()
        process.wait(timeout=10)
