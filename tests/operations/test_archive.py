"""manage.py archive: terminal operations older than a date leave the live ledger for a
verified JSON Lines file; audit verify checks the live chains and the archive."""

import json
from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals.models import ApprovalRequest, Decision, Grant
from operations import services
from operations.models import Event, Operation, OutboxMessage, Tool
from operations.services import archive as archive_module
from tests.approvals.conftest import person
from tests.conftest import contract

pytestmark = pytest.mark.django_db


def _verify(*args: str) -> str:
    out = StringIO()
    call_command("audit", "verify", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def ledger(api, settings):
    """Forty days ago: a refund approved and succeeded (with its webhooks), one that
    failed, an operation still waiting; today: one that succeeded."""
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    api.post("/api/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/h", "events": ["*"]})
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    api.tool("email", contract("idempotent"))
    approver = person()
    assign_perm("operations.decide_tool", approver, Tool.objects.get(pk="refund"))
    with time_machine.travel(timezone.now() - timedelta(days=40)):
        run = api.run()
        approved = api.register(run, "refund")
        services.approval_decide(
            request_id=approved["approval"]["id"], user=approver, approve=True, comment="ok"
        )
        api.claim(approved["id"])
        api.outcome(approved["id"], 1, {"kind": "succeeded", "downstream_id": "re_1"})
        failed = api.register(run, "email", claim={"lease_s": 30})
        api.outcome(failed["id"], 1, {"kind": "failed", "code": "bounced"})
        waiting = api.register(run, "refund")
    recent = api.register(run, "email", claim={"lease_s": 30})
    api.outcome(recent["id"], 1, {"kind": "succeeded"})
    return {"approved": approved, "failed": failed, "waiting": waiting, "recent": recent}


def test_old_terminal_operations_move_to_a_verified_file(ledger, tmp_path):
    path = tmp_path / "2026-10.jsonl"
    before = (timezone.now() - timedelta(days=30)).date().isoformat()
    out = StringIO()
    call_command("archive", "--before", before, "--to", str(path), stdout=out)
    assert "Archived 2 operations" in out.getvalue()
    gone = [ledger["approved"]["id"], ledger["failed"]["id"]]
    kept = [ledger["waiting"]["id"], ledger["recent"]["id"]]
    assert not Operation.objects.filter(pk__in=gone).exists()
    assert Operation.objects.filter(pk__in=kept).count() == 2
    for model, field in (
        (Event, "stream__in"),
        (ApprovalRequest, "operation_id__in"),
        (OutboxMessage, "operation_id__in"),
    ):
        assert not model.objects.filter(**{field: gone}).exists(), model
    assert not Decision.objects.filter(request__operation_id__in=gone).exists()
    assert not Grant.objects.filter(request__operation_id__in=gone).exists()

    # The file holds everything that belonged to them, chain heads included.
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    bundles = {b["operation"]["pk"]: b for b in lines[1:-1]}
    assert set(bundles) == set(gone)
    approved = bundles[ledger["approved"]["id"]]
    assert [e["fields"]["kind"] for e in approved["events"]][-1] == "outcome"
    assert len(approved["decisions"]) == len(approved["grants"]) == 1
    assert approved["outbox_messages"]
    assert set(lines[-1]["heads"]) == set(gone)

    # The live chains verify, the state follows from the events, and the file is the
    # one the anchor event recorded.
    report = _verify("--archive", str(path))
    assert "Every chain verifies." in report
    assert "Every state row follows from the events." in report
    assert "recorded by an archived event" in report
    anchor = Event.objects.get(stream="archive", kind="archived")
    assert anchor.data["operations"] == 2
    assert anchor.actor == "system:archive"


def test_a_tampered_or_unknown_archive_fails_verification(ledger, tmp_path):
    path = tmp_path / "a.jsonl"
    before = (timezone.now() - timedelta(days=30)).date().isoformat()
    call_command("archive", "--before", before, "--to", str(path), stdout=StringIO())
    lines = path.read_text().splitlines()
    bundle = json.loads(lines[1])
    bundle["events"][0]["fields"]["actor"] = "user:mallory"
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_text("\n".join([lines[0], json.dumps(bundle), *lines[2:]]) + "\n")
    with pytest.raises(CommandError, match="does not verify"):
        _verify("--archive", str(tampered))
    # A well-formed archive that no archived event records is refused too.
    copy = tmp_path / "copy.jsonl"
    header = json.dumps(json.loads(lines[0]), separators=(",", ":"))  # same data, other bytes
    copy.write_text("\n".join([header, *lines[1:]]) + "\n")
    with pytest.raises(CommandError, match="No archived event"):
        _verify("--archive", str(copy))


def test_nothing_is_removed_when_the_file_does_not_verify(ledger, tmp_path, monkeypatch):
    def refuse(path):
        raise archive_module.ArchiveError("simulated: the file does not verify")

    monkeypatch.setattr(archive_module, "archive_verify_file", refuse)
    path = tmp_path / "b.jsonl"
    before = (timezone.now() - timedelta(days=30)).date().isoformat()
    with pytest.raises(CommandError, match="simulated"):
        call_command("archive", "--before", before, "--to", str(path), stdout=StringIO())
    assert Operation.objects.filter(pk=ledger["approved"]["id"]).exists()
    assert not path.exists()
    assert not Event.objects.filter(stream="archive").exists()


def test_an_operation_a_live_one_points_at_stays(api, tmp_path):
    api.tool("undo", contract("compensable"))
    with time_machine.travel(timezone.now() - timedelta(days=40)):
        run = api.run()
        first = api.register(run, "undo", claim={"lease_s": 30})
        api.outcome(first["id"], 1, {"kind": "unknown", "code": "timeout"})
        answer = api.post(
            f"/api/v1/operations/{first['id']}/compensations", {"result": "committed"}
        )
        assert answer.status_code == 200, answer.json()
    retry = api.register(run, "undo", retry_of=first["id"])  # live, and points at it
    assert Operation.objects.get(pk=first["id"]).status == "compensated"
    before = (timezone.now() - timedelta(days=30)).date().isoformat()
    with pytest.raises(CommandError, match="No terminal operation"):
        call_command(
            "archive", "--before", before, "--to", str(tmp_path / "c.jsonl"), stdout=StringIO()
        )
    assert Operation.objects.get(pk=retry["id"]).previous_id == first["id"]
