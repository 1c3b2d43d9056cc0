"""The restore drill: a ledger with work in every state is backed up with pg_dump,
restored into a fresh database, verified with ``audit verify``, and its runner resumes
against a server on the restored database: replays answer the same operations, unknown
outcomes are still unknown, and nothing runs twice (docs/deployment.md, Backups)."""

import os
import re
import shutil
import subprocess

import pytest
from django.conf import settings

from bench.stack import Stack, fresh_database
from effectgate_client import EffectgateClient, Failed, Runner, Unknown
from tests.support.db import own_database_name, skip_unless_postgresql

pytestmark = [
    pytest.mark.slow,
    skip_unless_postgresql(
        "the drill is pg_dump and pg_restore: PostgreSQL only (SQLite, the local "
        "mode, is a file to copy); CI runs it on PostgreSQL",
    ),
]

SCHEMA = {
    "type": "object",
    "required": ["payment_id"],
    "properties": {"payment_id": {"type": "string"}},
}
TOOLS = {
    "refund": {"effect_class": "irreversible", "approval": {"mode": "never"}},
    "gated": {"effect_class": "irreversible", "approval": {"mode": "always"}},
    "undoable": {"effect_class": "compensable"},
    "email": {"effect_class": "idempotent"},
}
DECIDE = """
from django.contrib.auth import get_user_model
from guardian.shortcuts import assign_perm
from operations import services
from operations.models import Operation, Tool
user = get_user_model().objects.create_user("drill-approver", password="drill-password-1")
assign_perm("operations.decide_tool", user, Tool.objects.get(pk="gated"))
for key, approve in (("gated-approved", True), ("gated-rejected", False)):
    op = Operation.objects.get(operation_key=key)
    request = op.approval_requests.get(status="pending")
    services.approval_decide(request_id=request.id, user=user, approve=approve,
                             comment="" if approve else "not this one")
"""


class Calls:
    """The provider behind every tool: what it was asked to do, by operation key."""

    def __init__(self, script=None):
        self.script = script or {}
        self.made: list[str] = []

    def tool(self, key):
        def call(ctx):
            self.made.append(key)
            step = self.script.get(key)
            if isinstance(step, Exception):
                raise step
            return {"done": key}

        return call


def _execute(runner, run, tool, key, calls, **options):
    return runner.execute(
        run=run,
        tool=tool,
        operation_key=key,
        arguments={"payment_id": f"pay_{key}"},
        call=calls.tool(key),
        **options,
    )


def _pg(*args):
    program = args[0]
    if shutil.which(program) is None:
        pytest.fail(f"{program} is missing: install the PostgreSQL client (postgresql-client)")
    subprocess.run(args, check=True, capture_output=True, text=True)


def _digest(report: str) -> str:
    [digest] = re.findall(r"heads digest ([0-9a-f]{64})", report)
    return digest


def test_a_restored_backup_verifies_and_its_runner_resumes(tmp_path):
    base = os.environ.get("DATABASE_URL") or (
        "postgres://{USER}@{HOST}:{PORT}/{NAME}".format(**settings.DATABASES["default"])
    )
    source = fresh_database(own_database_name("drill_source"), base_url=base)
    first = Calls({"unknown": Unknown("timeout"), "failed": Failed("card_declined", "no")})
    with Stack(source, workers=1, threads=4, loops=False, log_dir=tmp_path / "source") as stack:
        token = stack.token
        client = EffectgateClient(stack.base_url, token)
        for name, body in TOOLS.items():
            client.put_tool(name, {**body, "input_schema": SCHEMA})
        run = client.create_run(principal="user:customer")["id"]
        runner = Runner(client, lease_s=30, wait_s=0.2)
        states = {
            "done": _execute(runner, run, "refund", "done", first).status,
            "unknown": _execute(runner, run, "refund", "unknown", first).status,
            "failed": _execute(runner, run, "refund", "failed", first).status,
            "undo": _execute(
                runner, run, "undoable", "undo", Calls({"undo": Unknown("timeout")})
            ).status,
            "gated-waiting": _execute(runner, run, "gated", "gated-waiting", first).status,
            "gated-approved": _execute(runner, run, "gated", "gated-approved", first).status,
            "gated-rejected": _execute(runner, run, "gated", "gated-rejected", first).status,
        }
        # Registered, never attempted: the runner crashed before its first claim.
        pending = client.register(
            run=run, tool="email", operation_key="email", arguments={"payment_id": "pay_email"}
        )
        states["email"] = pending["status"]
        # Claimed, in flight when the backup was taken.
        inflight = client.register(
            run=run,
            tool="email",
            operation_key="inflight",
            arguments={"payment_id": "pay_inflight"},
            claim_lease_s=3600,
        )
        states["inflight"] = inflight["status"]
        cancelled_run = client.create_run(principal="user:customer")["id"]
        _execute(runner, cancelled_run, "gated", "cancelled", first)
        client.cancel_run(cancelled_run)
        stack.manage("shell", "-c", DECIDE)
        states["gated-approved"] = client.get_operation(
            client.register(
                run=run,
                tool="gated",
                operation_key="gated-approved",
                arguments={"payment_id": "pay_gated-approved"},
            )["id"]
        )["status"]
        client.close()
        at_backup = stack.manage("audit", "verify")  # exits non-zero if anything is off
        dump = tmp_path / "ledger.dump"
        _pg("pg_dump", "--format=custom", f"--file={dump}", source)
    assert states == {
        "done": "succeeded",
        "unknown": "outcome_unknown",
        "failed": "failed_permanent",
        "undo": "compensating",
        "gated-waiting": "awaiting_approval",
        "gated-approved": "ready",
        "gated-rejected": "awaiting_approval",  # decided after the runner stopped waiting
        "email": "ready",
        "inflight": "executing",
    }
    before = list(first.made)

    restored = fresh_database(own_database_name("drill_restored"), base_url=base)
    _pg("pg_restore", "--no-owner", f"--dbname={restored}", str(dump))
    # Before anything else writes to it: the same chain heads as at the backup.
    verified = Stack(restored).manage("audit", "verify")
    assert "Every chain verifies." in verified
    assert "Every state row follows from the events." in verified
    assert _digest(verified) == _digest(at_backup)
    with Stack(
        restored,
        workers=1,
        threads=4,
        loops=False,
        runner_name="after-restore",
        log_dir=tmp_path / "restored",
    ) as stack:
        client = EffectgateClient(stack.base_url, token)  # the same runner, the same token
        runner = Runner(client, lease_s=30, wait_s=0.5)
        again = Calls()
        answers = {
            key: _execute(runner, run, tool, key, again)
            for key, tool in (
                ("done", "refund"),
                ("unknown", "refund"),
                ("failed", "refund"),
                ("gated-waiting", "gated"),
                ("gated-approved", "gated"),
                ("gated-rejected", "gated"),
                ("email", "email"),
                ("inflight", "email"),
            )
        }
        # Replays answer what the ledger holds; unknown stays unknown.
        assert answers["done"].status == "succeeded"
        assert answers["unknown"].status == "outcome_unknown"
        assert answers["failed"].status == "failed_permanent"
        assert answers["gated-waiting"].status == "awaiting_approval"
        assert answers["gated-rejected"].status == "rejected"
        assert answers["inflight"].refusal == "attempt_in_progress"
        # What had never run runs now, once: the approved refund and the email.
        assert answers["gated-approved"].status == "succeeded"
        assert answers["email"].status == "succeeded"
        assert sorted(again.made) == ["email", "gated-approved"]
        # And a second resume runs nothing at all.
        twice = Calls()
        for key, tool in (("done", "refund"), ("gated-approved", "gated"), ("email", "email")):
            _execute(runner, run, tool, key, twice)
        assert twice.made == []
        client.close()
    # Nothing ran twice across the backup: each key ran at most once in all.
    everything = before + again.made
    assert len(everything) == len(set(everything)), everything
