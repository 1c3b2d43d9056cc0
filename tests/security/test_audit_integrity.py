"""Audit integrity: append-only tables (PostgreSQL triggers) and verifiable hash chains."""

import contextlib

import pytest
from django.db import DatabaseError, connection, transaction
from guardian.shortcuts import assign_perm

from approvals.models import Decision
from console import accounts
from operations import audit, services
from operations.dbroles import as_owner
from operations.models import Event, Operation, Resolution, ResolutionReview, Tool
from operations.triggers import APPEND_ONLY_MODELS, ignored, trigger_uris
from tests.approvals.conftest import person
from tests.conftest import contract

from .conftest import audit_verify, postgresql_only


@contextlib.contextmanager
def tampering():
    """What an attacker with the database owner's rights could do: bypass the triggers.

    On PostgreSQL the append-only triggers are ignored for this thread; SQLite has none.
    As the owner: the runtime role may not even try (tests/security/test_db_roles.py).
    """
    with as_owner(), ignored(*trigger_uris()):
        yield


def _history(api) -> Operation:
    """An operation with a long stream: registered, claimed, failed, retried, succeeded."""
    api.tool("t", contract("idempotent"))
    op = api.register(api.run(), "t")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "failed", "code": "rate_limited"})
    api.claim(op["id"])
    api.outcome(op["id"], 2, {"kind": "succeeded", "downstream_id": "re_1"})
    return Operation.objects.get(pk=op["id"])


def test_an_untouched_ledger_verifies(api):
    op = _history(api)
    report = audit.chains_verify()
    assert report.ok, report.breaks
    assert report.events == Event.objects.count()
    assert report.streams == Event.objects.values("stream").distinct().count()
    code, out = audit_verify()
    assert code == 0
    assert "Every chain verifies" in out
    assert f"Checked {report.events} events in {report.streams} streams" in out
    assert Event.objects.filter(stream=op.id).count() >= 5


def test_verification_streams_in_chunks_across_streams(api, monkeypatch):
    _history(api)
    _history(api)
    monkeypatch.setattr(audit.chains, "CHUNK", 2)
    assert audit.chains_verify().ok


def test_a_changed_field_is_named_by_stream_and_seq(api):
    op = _history(api)
    target = Event.objects.get(stream=op.id, seq=3)
    with tampering():
        Event.objects.filter(pk=target.pk).update(data={**target.data, "code": "forged"})
    report = audit.chains_verify()
    assert not report.ok
    found = report.first_break
    assert (found.stream, found.seq, found.event_id) == (op.id, 3, target.pk)
    assert "hash does not match the event's fields" in found.problem
    assert found.found == target.hash
    code, out = audit_verify()
    assert code == 1
    assert f"BROKEN stream {op.id} seq 3" in out


def test_a_changed_actor_or_time_is_found(api):
    op = _history(api)
    with tampering():
        Event.objects.filter(stream=op.id, seq=2).update(actor="user:mallory")
    assert (audit.chains_verify().first_break.seq, audit.chains_verify().first_break.stream) == (
        2,
        op.id,
    )


def test_a_deleted_event_is_found_where_the_gap_is(api):
    op = _history(api)
    with tampering():
        Event.objects.filter(stream=op.id, seq=2).delete()
    found = audit.chains_verify().first_break
    assert (found.stream, found.seq) == (op.id, 3)
    assert "seq is not the previous seq + 1" in found.problem
    assert (found.expected, found.found) == ("2", "3")


def test_a_deleted_first_event_is_found(api):
    op = _history(api)
    with tampering():
        Event.objects.filter(stream=op.id, seq=1).delete()
    found = audit.chains_verify().first_break
    assert (found.stream, found.seq) == (op.id, 2)
    assert "does not start at seq 1" in found.problem


def test_a_replaced_event_with_a_recomputed_hash_breaks_the_next_link(api):
    op = _history(api)
    target = Event.objects.get(stream=op.id, seq=2)
    target.actor = "user:mallory"
    forged_hash = services.event_hash(target)
    with tampering():
        Event.objects.filter(pk=target.pk).update(actor="user:mallory", hash=forged_hash)
    found = audit.chains_verify().first_break
    assert (found.stream, found.seq) == (op.id, 3)
    assert "prev_hash does not match" in found.problem
    assert found.expected == forged_hash


def test_a_rewritten_whole_chain_verifies_but_changes_the_heads_digest(api):
    """The one rewrite a chain cannot reveal by itself; the kept heads digest does."""
    op = _history(api)
    before = audit.chains_verify().heads_digest
    prev = services.GENESIS_HASH
    with tampering():
        for event in Event.objects.filter(stream=op.id).order_by("seq"):
            event.actor = "user:mallory"
            event.prev_hash = prev
            event.hash = services.event_hash(event)
            Event.objects.filter(pk=event.pk).update(
                actor=event.actor, prev_hash=event.prev_hash, hash=event.hash
            )
            prev = event.hash
    after = audit.chains_verify()
    assert after.ok
    assert after.heads_digest != before


def test_all_lists_one_break_per_broken_stream(api):
    first, second = _history(api), _history(api)
    with tampering():
        Event.objects.filter(stream=first.id, seq=2).update(kind="forged")
        Event.objects.filter(stream=second.id, seq=4).update(kind="forged")
    report = audit.chains_verify()
    assert sorted((b.stream, b.seq) for b in report.breaks) == sorted(
        [(first.id, 2), (second.id, 4)]
    )
    code, out = audit_verify("--all")
    assert code == 1
    assert out.count("BROKEN") == 2
    code, out = audit_verify("--stream", first.id)
    assert code == 1
    assert f"stream {first.id} seq 2" in out


# --- append-only, enforced by PostgreSQL ----------------------------------------------


def _decision_and_resolutions(api) -> tuple[Decision, Resolution, ResolutionReview]:
    api.tool("pay", contract("irreversible", approval={"mode": "always"}))
    op = api.register(api.run(principal="user:nobody"), "pay")
    approver = person(decide_on="pay")
    services.approval_decide(
        request_id=op["approval"]["id"], user=approver, approve=True, comment="ok"
    )
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    first, second = person(), person()
    for user in (first, second):
        assign_perm("operations.reconcile_tool", user, Tool.objects.get(pk="pay"))
    operation = Operation.objects.get(pk=op["id"])
    services.operation_resolve(operation=operation, user=first, result="not_found", note="none")
    resolution = Resolution.objects.get(operation=operation)
    services.operation_resolution_confirm(resolution_id=resolution.id, user=second, confirm=True)
    return Decision.objects.get(), resolution, ResolutionReview.objects.get()


def _refused(action) -> None:
    """The trigger refuses ``action`` even to the tables' owner (whom privileges would
    let through; the runtime role is refused before any trigger, test_db_roles.py)."""
    with as_owner(), pytest.raises(DatabaseError, match="pgtrigger: Cannot"), transaction.atomic():
        action()


@postgresql_only
def test_the_append_only_triggers_are_installed_by_migrate(db):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgrelid::regclass::text FROM pg_trigger WHERE tgname LIKE %s",
            ["pgtrigger_append_only_%"],
        )
        tables = {row[0].strip('"') for row in cursor.fetchall()}
    from django.apps import apps

    assert tables == {apps.get_model(label)._meta.db_table for label in APPEND_ONLY_MODELS}


@postgresql_only
def test_events_refuse_update_and_delete(api):
    op = _history(api)
    event = Event.objects.get(stream=op.id, seq=2)
    _refused(lambda: Event.objects.filter(pk=event.pk).update(actor="user:mallory"))
    _refused(lambda: Event.objects.filter(pk=event.pk).delete())
    event.actor = "user:mallory"
    _refused(event.save)

    def raw_update():
        with connection.cursor() as cursor:
            cursor.execute("UPDATE operations_event SET data = '{}' WHERE id = %s", [event.pk])

    _refused(raw_update)
    assert Event.objects.get(pk=event.pk).actor != "user:mallory"
    assert audit.chains_verify().ok


@postgresql_only
def test_decisions_and_resolutions_refuse_update_and_delete(api):
    decision, resolution, review = _decision_and_resolutions(api)
    for model, row, change in (
        (Decision, decision, {"decision": "reject"}),
        (Resolution, resolution, {"note": "forged"}),
        (ResolutionReview, review, {"decision": "disputed"}),
    ):
        _refused(lambda m=model, r=row, c=change: m.objects.filter(pk=r.pk).update(**c))
        # Django's collector refuses some deletes before the database sees them
        # (protected foreign keys); the raw DELETE shows the trigger holds regardless.
        _refused(lambda m=model, r=row: m.objects.filter(pk=r.pk)._raw_delete(m.objects.db))
    assert Decision.objects.get(pk=decision.pk).decision == "approve"
    assert ResolutionReview.objects.get(pk=review.pk).decision == "confirmed"


@postgresql_only
def test_appending_still_works_under_the_triggers(api):
    _history(api)
    before = Event.objects.count()
    accounts.user_session_record(user=person(), kind="signed_in")
    _history(api)
    assert Event.objects.count() > before + 1
    assert audit.chains_verify().ok
