"""A runner process killed with SIGKILL after its claim: the sweep classifies the lease."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from operations.models import Attempt, Operation
from operations.services import sweep
from tests.conftest import contract, make_runner

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "crashing_runner.py"
LEASE_S = 2


def _crash_after_claim(live_server, token, tool):
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), live_server.url, token, tool, str(LEASE_S)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line, "the runner process died before claiming"
        claimed = json.loads(line)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
    assert process.returncode == -signal.SIGKILL
    return claimed


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("effect_class", "expected"), [("irreversible", "outcome_unknown"), ("idempotent", "ready")]
)
def test_killed_runner_lease_expires_and_sweep_classifies(live_server, effect_class, expected):
    api = make_runner()
    api.tool(effect_class, contract(effect_class, approval={"mode": "never"}))
    claimed = _crash_after_claim(live_server, api.token, effect_class)
    op_id = claimed["operation"]
    assert Operation.objects.get(pk=op_id).status == "executing"
    assert sweep().leases_expired == 0  # the lease is still live
    time.sleep(LEASE_S + 0.5)
    assert sweep().leases_expired == 1
    op = Operation.objects.get(pk=op_id)
    assert op.status == expected
    assert Attempt.objects.get(operation=op, number=1).status == "lease_expired"
    if expected == "ready":
        again = api.claim(op_id)
        assert again["attempt"] == 2
        assert again["idempotency_key"] == claimed["attempt"]["idempotency_key"]
    else:
        assert api.claim(op_id, expect=409)["code"] == "reconciliation_required"
