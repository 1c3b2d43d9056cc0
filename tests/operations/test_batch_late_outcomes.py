"""Late outcomes, outcome conflicts and a repeated operation in one outcome batch end
each operation, its events and the run's spend as the same posts one by one."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from operations.audit.chains import chains_verify
from operations.models import Event, Operation, Run
from operations.services.sweep import lease_expire_due
from tests.operations.test_batches import _batch, _claimed

POSTGRES = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


@pytest.mark.skipif(not POSTGRES, reason="the set-based write is PostgreSQL's")
def test_late_conflict_and_repeat_in_one_batch_as_single_calls(api):
    api.tool("t")
    ended = []
    for together in (True, False):
        run = api.run()
        late, done, other = _claimed(api, run, f"L{together}", 3)
        api.outcome(done, 1, {"kind": "succeeded", "downstream_id": "d"})
        lease_expire_due(now=timezone.now() + timedelta(seconds=120))
        posts = [
            (late, {"kind": "succeeded", "downstream_id": "late", "cost": 1.5}),
            (done, {"kind": "failed", "code": "x"}),  # conflict
            (other, {"kind": "failed", "code": "rate_limited", "cost": 0.25}),  # late too
            (done, {"kind": "succeeded", "downstream_id": "d"}),  # same again
        ]
        if together:
            body = [{"operation": op, "attempt": 1, **o} for op, o in posts]
            statuses = [r["status"] for r in _batch(api, body, path=f"/api/v1/runs/{run}/outcomes")]
        else:
            statuses = [
                api.post(f"/api/v1/operations/{op}/attempts/1/outcome", o).status_code
                for op, o in posts
            ]
        ended.append(
            (
                statuses,
                [
                    (s.status, s.downstream_id)
                    for s in (Operation.objects.get(pk=op) for op in (late, done, other))
                ],
                str(Run.objects.get(pk=run).spend),
                [
                    list(
                        Event.objects.filter(stream=op)
                        .order_by("seq")
                        .values_list("kind", flat=True)
                    )
                    for op in (late, done, other)
                ],
            )
        )
    print(ended)
    assert ended[0] == ended[1]
    assert chains_verify().ok
