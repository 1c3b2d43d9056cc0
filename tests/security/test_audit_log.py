"""The transparency log against a forger: ``audit verify`` holds the ledger to its signed
checkpoints, and a checkpoint a witness kept catches what the database alone cannot show.

The forger has the database owner's rights (the append-only triggers ignored, as in
test_audit_integrity.py) but not the signing key.
"""

import contextlib
from datetime import timedelta
from io import StringIO
from pathlib import Path

import time_machine
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from operations import services
from operations.dbroles import as_owner
from operations.models import Checkpoint, Event, LogLeaf, LogNode, Operation
from operations.tlog import leaves
from operations.triggers import ignored, trigger_uris
from tests.conftest import contract
from tests.support.audit_log import seal_all, write_signing_key
from tests.support.world import Direct

from .conftest import audit_verify, postgresql_only


@contextlib.contextmanager
def tampering():
    """A forger holding the owner's rights (the runtime role may not even try)."""
    with as_owner(), ignored(*trigger_uris()):
        yield


def _history(api, tool: str = "t") -> Operation:
    api.tool(tool, contract("idempotent"))
    op = api.register(api.run(), tool)
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "failed", "code": "rate_limited"})
    api.claim(op["id"])
    api.outcome(op["id"], 2, {"kind": "succeeded", "downstream_id": "re_1"})
    return Operation.objects.get(pk=op["id"])


def _rewrite_chain(stream: str, **changes) -> None:
    """Rewrite every event of ``stream`` with ``changes`` and recompute the whole chain:
    the one rewrite the hash chains cannot show by themselves."""
    prev = services.GENESIS_HASH
    with tampering():
        for event in Event.objects.filter(stream=stream).order_by("seq"):
            for name, value in changes.items():
                setattr(event, name, value)
            event.prev_hash = prev
            event.hash = services.event_hash(event)
            Event.objects.filter(pk=event.pk).update(
                **changes, prev_hash=event.prev_hash, hash=event.hash
            )
            prev = event.hash


def _kept_note(tmp_path: Path) -> Path:
    """What a witness keeps: the latest checkpoint's signed note, as delivered."""
    path = tmp_path / "kept.note"
    path.write_text(Checkpoint.objects.order_by("size").last().note, encoding="utf-8")
    return path


def test_a_sealed_and_signed_ledger_verifies(api, audit_key, tmp_path):
    _history(api)
    seal_all()
    _history(api, "u")
    seal_all()
    assert Checkpoint.objects.count() >= 2
    code, out = audit_verify("--checkpoint", str(_kept_note(tmp_path)))
    assert code == 0, out
    assert f"Checked {LogLeaf.objects.count()} leaves of the transparency log" in out
    assert "The log holds" in out
    assert "The 1 kept checkpoints match the log." in out


def test_a_rewritten_chain_that_verifies_is_caught_by_the_checkpoint(api, audit_key):
    op = _history(api)
    seal_all()
    _rewrite_chain(op.id, actor="user:mallory")
    code, out = audit_verify()
    assert "Every chain verifies." in out  # the chains alone cannot tell
    assert code == 1
    first = Event.objects.get(stream=op.id, seq=1)
    leaf = LogLeaf.objects.get(event_id=first.pk).index
    assert f"LOG FAULT leaf {leaf}: event {first.pk} is not what was sealed" in out
    assert f"The transparency log does not hold at leaf {leaf}" in out


def test_rewriting_the_log_too_still_breaks_the_signed_root(api, audit_key):
    """The forger rewrites the events and recomputes the leaves and subtree hashes to
    match: the stored checkpoints' signed roots no longer do, and no new one can be
    signed without the key."""
    op = _history(api)
    seal_all()
    _rewrite_chain(op.id, actor="user:mallory")
    _reseal_in_place()
    code, out = audit_verify("--all")
    assert code == 1
    assert "its signed root is not the root of the events as they are now" in out
    assert "LOG FAULT leaf" not in out  # every leaf matches its rewritten event


def _reseal_in_place() -> None:
    """Recompute every stored leaf and subtree hash from the events as they are now."""
    from operations.tlog import merkle

    builder = merkle.TreeBuilder()
    with tampering():
        for leaf in LogLeaf.objects.order_by("index"):
            event = Event.objects.get(pk=leaf.event_id)
            value = leaves.event_leaf(
                event=event.pk, hash=event.hash, seq=event.seq, stream=event.stream
            )
            LogLeaf.objects.filter(index=leaf.index).update(hash=value)
            for (level, index), node in builder.append(value)[1:]:
                LogNode.objects.filter(level=level, index=index).update(hash=node)


def test_a_witness_checkpoint_catches_a_history_the_application_signed_again(
    api, audit_key, tmp_path
):
    """The forger wipes the log and rewrites history; the application, which holds the
    key, seals and signs the forged history as if nothing happened. The database alone
    now verifies; the checkpoint a webhook subscriber kept does not match it."""
    op = _history(api)
    seal_all()
    kept = _kept_note(tmp_path)
    _rewrite_chain(op.id, actor="user:mallory")
    with tampering():
        Checkpoint.objects.all().delete()
        LogNode.objects.all().delete()
        LogLeaf.objects.all().delete()
    seal_all()
    code, out = audit_verify()
    assert code == 0, out  # consistent with itself: the rewrite does not show
    code, out = audit_verify("--checkpoint", str(kept))
    assert code == 1
    assert "LOG FAULT kept checkpoint" in out
    assert "the history it covers was rewritten" in out


def test_a_kept_checkpoint_of_another_key_or_log_is_refused(api, audit_key, tmp_path):
    _history(api)
    seal_all()
    kept = _kept_note(tmp_path)
    forged = tmp_path / "forged.note"
    forged.write_text(kept.read_text().replace("\n", "\n ", 1), encoding="utf-8")
    code, out = audit_verify("--checkpoint", str(forged))
    assert code == 1
    assert f"The kept checkpoint {forged} does not verify" in out


def test_a_deleted_event_is_named(api, audit_key):
    op = _history(api)
    seal_all()
    last = Event.objects.filter(stream=op.id).latest("seq")
    with tampering():
        Event.objects.filter(pk=last.pk).delete()
        Operation.objects.filter(pk=op.id).update(event_seq=last.seq - 1)
    code, out = audit_verify()
    assert code == 1
    leaf = LogLeaf.objects.get(event_id=last.pk).index
    assert f"LOG FAULT leaf {leaf}: event {last.pk} is not in the ledger" in out


def test_a_deleted_leaf_or_a_changed_subtree_hash_is_named(api, audit_key):
    _history(api)
    seal_all()
    code, out = audit_verify()
    assert code == 0, out
    with tampering():
        LogNode.objects.filter(level=1, index=0).update(hash=b"\x00" * 32)
    code, out = audit_verify()
    assert code == 1
    assert "LOG FAULT subtree 1/0 (leaves 0 to 1): its stored hash is not the one" in out
    with tampering():
        LogLeaf.objects.filter(index=2).delete()
    code, out = audit_verify()
    assert "LOG FAULT leaf 2: it is missing: the next leaf stored is 3" in out


@postgresql_only
def test_an_event_inserted_around_the_sealer_is_named(api, audit_key):
    """An event with a correct hash, written with a transaction id the sealer is past:
    it would never be sealed, so no checkpoint would ever cover it."""
    op = _history(api)
    seal_all()
    forged = services.event_append(
        stream="forged", kind="runner_created", actor=services.Actor.system("mallory")
    )
    with tampering(), connection.cursor() as cursor:
        cursor.execute("UPDATE operations_event SET txid = 3 WHERE id = %s", [forged.pk])
    services.log_seal()
    code, out = audit_verify()
    assert code == 1
    assert f"LOG FAULT event {forged.pk}: forged seq 1 is not in the log though the sealer" in out
    assert op


def test_signatures_need_the_key(api, audit_key, settings, tmp_path):
    _history(api)
    seal_all()
    public = tmp_path / "audit.pub"
    from operations.tlog import keys

    public.write_text(keys.public_key_pem(audit_key.public_key()))
    settings.AUDIT_SIGNING_KEY_FILE = ""
    code, out = audit_verify()
    assert code == 1
    assert "cannot be checked without the log's key" in out
    code, out = audit_verify("--audit-key", str(public))
    assert code == 0, out
    other, _ = write_signing_key(tmp_path, "other.pem")
    code, out = audit_verify("--audit-key", str(other))
    assert code == 1
    assert "its signed note does not verify" in out
    code, out = audit_verify("--audit-key", str(other), "--audit-key", str(public))
    assert code == 0, out


def test_archived_events_are_checked_from_their_file(api, audit_key, tmp_path, settings):
    direct = Direct(api)
    direct.tool("email", contract("idempotent"))
    with time_machine.travel(timezone.now() - timedelta(days=40)):
        done = direct.register(direct.run(), "email", claim={"lease_s": 30})
        direct.outcome(done["id"], 1, {"kind": "succeeded"})
    seal_all()
    path = tmp_path / "old.jsonl"
    before = (timezone.now() - timedelta(days=30)).date().isoformat()
    call_command("archive", "--before", before, "--to", str(path), stdout=StringIO())
    assert not Event.objects.filter(stream=done["id"]).exists()
    code, out = audit_verify()
    assert code == 1
    assert "is not in the ledger: deleted, or archived" in out
    code, out = audit_verify("--archive", str(path))
    assert code == 0, out


def test_audit_seal_runs_the_sealer_once(api, audit_key):
    _history(api)
    out = StringIO()
    call_command("audit", "seal", stdout=out)
    assert "Appended" in out.getvalue()
    while LogLeaf.objects.count() < Event.objects.count():
        call_command("audit", "seal", stdout=StringIO())
    assert Checkpoint.objects.exists()
    out = StringIO()
    call_command("audit", "seal", "--limit", "5", stdout=out)
    assert f"Appended 0 events; the log holds {LogLeaf.objects.count()}." in out.getvalue()
