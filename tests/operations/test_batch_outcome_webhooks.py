"""An outcome batch's webhooks carry the operation as it ended, as single outcomes'
do: the payload re-reads the operation, so the batch's gathered rows are written first
(``rows.deferred``)."""

import pytest
from django.conf import settings

from operations.models import OutboxMessage
from tests.operations.test_batches import _batch, _claimed

POSTGRES = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


@pytest.mark.skipif(not POSTGRES, reason="the set-based write is PostgreSQL's")
@pytest.mark.parametrize("together", [False, True])
def test_outcome_webhook_payload_is_the_operation_as_it_ended(api, settings, together):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    response = api.post(
        "/api/v1/webhook-endpoints",
        {"url": "http://127.0.0.1:9/hook", "events": ["operation.succeeded"]},
    )
    assert response.status_code == 201, response.json()
    api.tool("t")
    run = api.run()
    ids = _claimed(api, run, "w", 2)
    body = [
        {"operation": op, "attempt": 1, "kind": "succeeded", "downstream_id": f"re_{n}"}
        for n, op in enumerate(ids)
    ]
    if together:
        results = _batch(api, body, path=f"/api/v1/runs/{run}/outcomes")
        assert [item["status"] for item in results] == [200, 200]
    else:
        for item in body:
            op = item.pop("operation")
            api.outcome(op, 1, {k: v for k, v in item.items() if k != "attempt"})
    messages = OutboxMessage.objects.filter(event_type="operation.succeeded").order_by("id")
    got = [
        (m.payload["data"]["operation"]["status"], m.payload["data"]["operation"]["downstream_id"])
        for m in messages
    ]
    assert got == [("succeeded", "re_0"), ("succeeded", "re_1")]
