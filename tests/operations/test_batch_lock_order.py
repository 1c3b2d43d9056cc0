"""An outcome batch takes the rows a single outcome takes in the single outcome's order
(operations, tools for the breaker, then the runs for the spend, last): a batch and a
single outcome of one run racing each other both complete, neither is aborted as a
deadlock."""

import threading

import pytest
from django.conf import settings
from django.db import connection

from operations.services import outcomes as outcomes_module
from operations.services.batches import OutcomeItem, attempts_record_outcome_batch
from operations.services.outcomes import attempt_record_outcome
from tests.conftest import contract
from tests.operations.test_batches import _claimed

POSTGRES = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"


@pytest.mark.skipif(not POSTGRES, reason="PostgreSQL's row locks")
def test_a_single_outcome_racing_an_outcome_batch_of_its_run_does_not_deadlock(
    transactional_db, api
):
    body = contract("idempotent", breaker={"failure_codes": ["upstream_5xx"], "threshold": 5})
    body["retry"]["max_attempts"] = 10
    api.tool("a")
    api.tool("b", body)
    run = api.run()
    op1 = _claimed(api, run, "x", 1, tool="a")[0]
    op2, op3 = _claimed(api, run, "y", 2, tool="b")

    batch_holds_run = threading.Event()
    real = outcomes_module.breaker_record_locked

    def hooked(op, **kwargs):
        if threading.current_thread().name == "batch" and op.id == op2:
            batch_holds_run.set()  # item 1's cost has locked the run's row
            threading.Event().wait(0.5)  # the single call takes tool b and waits for the run
        return real(op, **kwargs)

    outcomes_module.breaker_record_locked = hooked
    got: dict[str, object] = {}

    def batch():
        try:
            got["batch"] = attempts_record_outcome_batch(
                runner=api.runner,
                run_id=run,
                items=[
                    OutcomeItem(op1, 1, {"kind": "succeeded", "cost": 1}),
                    OutcomeItem(op2, 1, {"kind": "failed", "code": "upstream_5xx"}),
                ],
            )
        except Exception as error:
            got["batch"] = error
        finally:
            connection.close()

    def single():
        batch_holds_run.wait(10)
        try:
            got["single"] = attempt_record_outcome(
                operation_id=op3,
                number=1,
                body={"kind": "failed", "code": "upstream_5xx", "cost": 1},
                runner=api.runner,
            )
        except Exception as error:
            got["single"] = error
        finally:
            connection.close()

    try:
        threads = [threading.Thread(target=batch, name="batch"), threading.Thread(target=single)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        outcomes_module.breaker_record_locked = real
    print({k: repr(v)[:200] for k, v in got.items()})
    assert not isinstance(got["single"], Exception), got["single"]
    assert not isinstance(got["batch"], Exception), got["batch"]
