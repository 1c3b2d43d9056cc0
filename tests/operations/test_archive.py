"""manage.py archive: terminal operations older than a date leave the live ledger for a
verified JSON Lines file; audit verify checks the live chains and the archive."""

import json
import os
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from io import StringIO

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection
from django.db.models import QuerySet
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals.models import ApprovalRequest, Decision, Grant
from operations import services
from operations.models import Event, Operation, OutboxMessage, Tool
from operations.services import archive as archive_module
from tests.approvals.conftest import person
from tests.conftest import contract
from tests.support.db import skip_unless_postgresql
from tests.support.world import Direct

pytestmark = pytest.mark.django_db


def _verify(*args: str) -> str:
    out = StringIO()
    call_command("audit", "verify", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def ledger(api, settings):
    """Forty days ago: a refund approved and succeeded (with its webhooks), one that
    failed, an operation still waiting; today: one that succeeded."""
    direct = Direct(api)  # the tests are about the archive, not the runner API
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    api.post("/api/v1/webhook-endpoints", {"url": "http://127.0.0.1:9/h", "events": ["*"]})
    direct.tool("refund", contract("irreversible", approval={"mode": "always"}))
    direct.tool("email", contract("idempotent"))
    approver = person()
    assign_perm("operations.decide_tool", approver, Tool.objects.get(pk="refund"))
    with time_machine.travel(timezone.now() - timedelta(days=40)):
        run = direct.run()
        approved = direct.register(run, "refund")
        services.approval_decide(
            request_id=approved["approval"]["id"], user=approver, approve=True, comment="ok"
        )
        direct.claim(approved["id"])
        direct.outcome(approved["id"], 1, {"kind": "succeeded", "downstream_id": "re_1"})
        failed = direct.register(run, "email", claim={"lease_s": 30})
        direct.outcome(failed["id"], 1, {"kind": "failed", "code": "bounced"})
        waiting = direct.register(run, "refund")
    recent = direct.register(run, "email", claim={"lease_s": 30})
    direct.outcome(recent["id"], 1, {"kind": "succeeded"})
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


def _archived_ids(path) -> list[str]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [bundle["operation"]["pk"] for bundle in lines[1:-1]]


def _old_enough() -> str:
    return (timezone.now() - timedelta(days=30)).date().isoformat()


def _accounted_for(tmp_path, ids: list[str]) -> list:
    """Every operation is either still live or in exactly one verified archive file that
    the ledger records, and no temporary file is left in the folder. Returns the files."""
    files = sorted(tmp_path.iterdir())
    assert all(f.suffix == ".jsonl" and not f.name.startswith(".") for f in files), files
    archived: list[str] = []
    for f in files:
        assert archive_module.archive_recorded(archive_module.archive_verify_file(f)), f
        archived += _archived_ids(f)
    live = list(Operation.objects.filter(pk__in=ids).values_list("pk", flat=True))
    assert sorted(archived + live) == sorted(ids)
    assert Event.objects.filter(stream="archive", kind="archived").count() == len(files)
    report = _verify(*[arg for f in files for arg in ("--archive", str(f))])
    assert "Every chain verifies." in report
    assert report.count("recorded by an archived event") == len(files)
    return files


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("same_target", [True, False], ids=["one-target", "own-targets"])
def test_concurrent_archive_runs_never_lose_an_operation(
    ledger, tmp_path, monkeypatch, same_target
):
    """Four ``manage.py archive`` runs at once, each on its own thread with its own
    database connection. Verifying is slowed down so that the runs overlap while the
    first one holds its file and its transaction."""
    runs = 4
    ids = [ledger[name]["id"] for name in ("approved", "failed", "waiting", "recent")]
    verify = archive_module.archive_verify_file

    def slow_verify(path):
        summary = verify(path)
        time.sleep(0.5)
        return summary

    monkeypatch.setattr(archive_module, "archive_verify_file", slow_verify)
    barrier = threading.Barrier(runs)
    before = _old_enough()

    def run(number: int) -> str:
        target = tmp_path / ("2026-09.jsonl" if same_target else f"run-{number}.jsonl")
        try:
            barrier.wait()
            out = StringIO()
            call_command("archive", "--before", before, "--to", str(target), stdout=out)
            return out.getvalue()
        except CommandError as exc:
            return f"refused: {exc}"
        finally:
            connection.close()

    with ThreadPoolExecutor(runs) as pool:
        results = list(pool.map(run, range(runs)))

    assert sum(r.startswith("Archived 2 operations") for r in results) == 1, results
    refusals = [r for r in results if r.startswith("refused")]
    assert len(refusals) == runs - 1, results
    for refusal in refusals:
        assert any(
            reason in refusal
            for reason in ("Another archive run", "No terminal operation", "exists")
        ), refusal
    [kept] = _accounted_for(tmp_path, ids)
    assert sorted(_archived_ids(kept)) == sorted([ledger["approved"]["id"], ledger["failed"]["id"]])


@pytest.mark.django_db(transaction=True)
@skip_unless_postgresql(
    "the archive lock is a PostgreSQL advisory lock; on SQLite the IMMEDIATE transaction "
    "makes a second run wait instead (the concurrent test above runs there too)"
)
def test_a_second_run_while_one_is_under_way_is_refused_at_once(ledger, tmp_path, monkeypatch):
    """The first run holds its transaction (its file written and verified) until the
    second has been answered: the second is refused by the lock, not left to wait on
    the first run's row locks and find nothing."""
    inside, answered = threading.Event(), threading.Event()
    verify = archive_module.archive_verify_file

    def verify_and_hold(path):
        summary = verify(path)
        inside.set()
        answered.wait(timeout=10)
        return summary

    monkeypatch.setattr(archive_module, "archive_verify_file", verify_and_hold)
    first = tmp_path / "first.jsonl"

    def first_run() -> str:
        try:
            out = StringIO()
            call_command("archive", "--before", _old_enough(), "--to", str(first), stdout=out)
            return out.getvalue()
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(first_run)
        assert inside.wait(timeout=30)
        started = time.monotonic()
        with pytest.raises(CommandError, match="Another archive run is under way"):
            call_command(
                "archive",
                "--before",
                _old_enough(),
                "--to",
                str(tmp_path / "second.jsonl"),
                stdout=StringIO(),
            )
        waited = time.monotonic() - started
        answered.set()
        assert running.result().startswith("Archived 2 operations")
    assert waited < 5
    ids = [ledger[name]["id"] for name in ("approved", "failed", "waiting", "recent")]
    assert _accounted_for(tmp_path, ids) == [first]


def test_a_run_with_nothing_left_to_archive_leaves_an_existing_file_alone(ledger, tmp_path):
    """The second of two runs on one target: it finds the first run's file and nothing
    left to archive, and must not take the first run's file with it."""
    path = tmp_path / "2026-09.jsonl"
    call_command("archive", "--before", _old_enough(), "--to", str(path), stdout=StringIO())
    written = path.read_bytes()
    before = timezone.now() - timedelta(days=30)
    with pytest.raises(archive_module.ArchiveError):
        archive_module.archive_operations(
            before=before, path=path, actor=services.Actor.system("archive")
        )
    assert path.read_bytes() == written
    ids = [ledger[name]["id"] for name in ("approved", "failed", "waiting", "recent")]
    _accounted_for(tmp_path, ids)


def test_a_target_that_appears_during_the_run_is_refused_and_left_alone(
    ledger, tmp_path, monkeypatch
):
    """Another writer takes the target name after the run began: the run never replaces
    it, removes nothing from the ledger and leaves no file of its own behind."""
    path = tmp_path / "2026-09.jsonl"
    verify = archive_module.archive_verify_file

    def verify_then_someone_writes_the_target(candidate):
        summary = verify(candidate)
        path.write_bytes(b"another writer's file\n")
        return summary

    monkeypatch.setattr(
        archive_module, "archive_verify_file", verify_then_someone_writes_the_target
    )
    with pytest.raises(CommandError, match="exists"):
        call_command("archive", "--before", _old_enough(), "--to", str(path), stdout=StringIO())
    assert path.read_bytes() == b"another writer's file\n"
    assert [f.name for f in tmp_path.iterdir()] == [path.name]
    assert Operation.objects.filter(pk=ledger["approved"]["id"]).exists()
    assert not Event.objects.filter(stream="archive").exists()


def test_a_folder_without_hard_links_is_refused_and_nothing_is_removed(
    ledger, tmp_path, monkeypatch
):
    def no_hard_links(source, target):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_hard_links)
    path = tmp_path / "2026-09.jsonl"
    with pytest.raises(CommandError, match="Cannot name the archive"):
        call_command("archive", "--before", _old_enough(), "--to", str(path), stdout=StringIO())
    assert list(tmp_path.iterdir()) == []
    ids = [ledger[name]["id"] for name in ("approved", "failed", "waiting", "recent")]
    assert Operation.objects.filter(pk__in=ids).count() == 4
    assert not Event.objects.filter(stream="archive").exists()


def test_a_failure_after_the_file_is_in_place_removes_only_this_runs_file(
    ledger, tmp_path, monkeypatch
):
    """The file is verified and under its name, the rows are deleted, then the anchor
    event fails: the transaction rolls back, so the file this run made goes, and
    nothing else in the folder does."""
    neighbour = tmp_path / "2026-08.jsonl"
    neighbour.write_bytes(b"last month's archive\n")
    path = tmp_path / "2026-09.jsonl"

    def anchor_fails(**kwargs):
        assert path.exists()  # the file is in place when the failure strikes
        raise RuntimeError("simulated: the anchor event cannot be written")

    monkeypatch.setattr(archive_module, "event_append", anchor_fails)
    with pytest.raises(RuntimeError, match="simulated"):
        call_command("archive", "--before", _old_enough(), "--to", str(path), stdout=StringIO())
    assert [f.name for f in tmp_path.iterdir()] == [neighbour.name]
    assert neighbour.read_bytes() == b"last month's archive\n"
    ids = [ledger[name]["id"] for name in ("approved", "failed", "waiting", "recent")]
    assert Operation.objects.filter(pk__in=ids).count() == 4
    assert not Event.objects.filter(stream="archive").exists()
    assert "Every chain verifies." in _verify()


@pytest.mark.django_db(transaction=True)
def test_a_committed_archive_keeps_its_file_when_the_commit_answer_is_lost(
    ledger, tmp_path, monkeypatch
):
    """PostgreSQL commits, then the connection fails before the answer arrives: the rows
    are gone, so the file must stay. The run says the outcome is unknown."""
    commit = connection.commit

    def commit_then_lose_the_answer():
        commit()
        raise OperationalError("simulated: the connection was lost after COMMIT")

    monkeypatch.setattr(connection, "commit", commit_then_lose_the_answer)
    path = tmp_path / "2026-09.jsonl"
    with pytest.raises(CommandError, match="outcome is unknown"):
        call_command("archive", "--before", _old_enough(), "--to", str(path), stdout=StringIO())
    monkeypatch.undo()
    ids = [ledger[name]["id"] for name in ("approved", "failed", "waiting", "recent")]
    [kept] = _accounted_for(tmp_path, ids)
    assert kept == path
    assert not Operation.objects.filter(pk=ledger["approved"]["id"]).exists()


def test_the_file_and_its_folder_are_on_disk_before_any_row_goes(ledger, tmp_path, monkeypatch):
    synced: list[str] = []
    fsync = os.fsync

    def recording_fsync(fd):
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        fsync(fd)

    def delete_records(queryset_delete):
        def delete(self):
            if self.model is Operation:
                synced.append("delete operations")
            return queryset_delete(self)

        return delete

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(QuerySet, "delete", delete_records(QuerySet.delete))
    path = tmp_path / "2026-09.jsonl"
    call_command("archive", "--before", _old_enough(), "--to", str(path), stdout=StringIO())
    assert synced == ["file", "folder", "delete operations"]
    # The file holds the ledger's rows: only its owner may read it.
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
