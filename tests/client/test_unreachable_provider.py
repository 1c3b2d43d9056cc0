"""A provider the tool function cannot reach, against a live Effectgate: every attempt is
``not_sent``, and when none is left the model reads that the provider could not be
reached, where, and the error's class, never the URL's path, query or credentials."""

import httpx
import pytest

from effectgate_client import outcome_from_httpx_error
from operations.models import Attempt, Event, Operation
from tests.client.test_runner_live import Setup
from tests.support.net import free_port

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "s3cret-api-key"


def test_an_unreachable_provider_is_named_in_the_answer_when_no_retry_is_left(live_server):
    setup = Setup(live_server)
    setup.tool("refund_unreachable", retry={"max_attempts": 3, "base_delay_ms": 0})
    port = free_port()  # nothing listens there
    url = f"http://user:{SECRET}@127.0.0.1:{port}/v1/refunds?api_key={SECRET}"

    def call(ctx):
        try:
            httpx.post(url, json=ctx.arguments, timeout=5)
        except httpx.HTTPError as exc:
            raise outcome_from_httpx_error(exc) from exc

    result = setup.execute("refund_unreachable", call)

    envelope = result.for_model()
    assert envelope["status"] == "budget_exhausted"
    assert envelope["code"] == "not_sent"
    assert envelope["message"].startswith(
        "The call to refund_unreachable was stopped: its retry or time budget is used up. "
        "No retry left after attempt 3. "
        f"The provider at 127.0.0.1:{port} could not be reached (ConnectError: "
    )
    assert envelope["message"].endswith("); nothing was sent.")
    assert result.attempts == [1, 2, 3]
    op = Operation.objects.get(pk=envelope["logical_operation_id"])
    assert (op.status, op.error_code) == ("budget_exhausted", "not_sent")
    # What Effectgate stored of it: the outcomes as posted, the events, the operation.
    outcomes = Attempt.objects.filter(operation=op).values_list("outcome", flat=True)
    events = Event.objects.filter(operation=op).values_list("data", flat=True)
    stored = [op.error_detail, *map(str, outcomes), *map(str, events)]
    assert sum("could not be reached" in text for text in stored) >= 4
    assert not [text for text in stored if SECRET in text or "/v1/refunds" in text]
