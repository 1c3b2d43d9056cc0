"""The sealer: every committed event becomes one leaf of the transparency log, once, in
a fixed order, a late commit included; one sealer at a time; a checkpoint signed and
announced when the tree grew and a key is configured.

On PostgreSQL an event waits while any older transaction on the server is open (the
sealer's horizon), the other workers' of a parallel run included: the tests seal until
everything is in (``seal_all``) rather than expect one pass to take it all.
"""

import base64
import threading
import time

import pytest
from django.db import connection, transaction
from standardwebhooks.webhooks import Webhook

from operations import selectors, services
from operations.dispatch import webhooks
from operations.models import Checkpoint, Event, LogLeaf, LogNode, OutboxMessage
from operations.services import seal
from operations.tlog import merkle, notes
from tests.conftest import contract, make_runner
from tests.support.audit_log import (
    expected_root,
    leaf_of,
    seal_all,
    wait_until_sealable,
    write_signing_key,
)
from tests.support.db import skip_unless_postgresql
from tests.support.receiver import Receiver

postgresql_only = skip_unless_postgresql(
    "needs PostgreSQL: concurrent transactions there commit out of id order and two "
    "sealers can run at once (SQLite serializes every write); CI runs the suite on it"
)


def _history(api) -> str:
    api.tool("t", contract("idempotent"))
    op = api.register(api.run(), "t")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "succeeded", "downstream_id": "re_1"})
    return op["id"]


def _sealed() -> list[int]:
    return list(LogLeaf.objects.order_by("index").values_list("event_id", flat=True))


def _assert_whole_log_matches_the_events() -> None:
    """Every event exactly once, leaves numbered 0.., stored hashes and root as the
    reference computes them from the events."""
    order = _sealed()
    assert sorted(order) == sorted(Event.objects.values_list("pk", flat=True))
    assert list(LogLeaf.objects.order_by("index").values_list("index", flat=True)) == list(
        range(len(order))
    )
    events = Event.objects.in_bulk(order)
    for leaf in LogLeaf.objects.all():
        assert bytes(leaf.hash) == leaf_of(events[leaf.event_id])
    size = len(order)
    assert selectors.log_root(size) == expected_root(size)
    # One stored hash per complete perfect subtree of level 1 and up.
    assert LogNode.objects.count() == size - bin(size).count("1")


def test_the_sealer_appends_every_committed_event_once(api):
    _history(api)
    reports = seal_all()
    size = reports[-1].size
    assert sum(report.appended for report in reports) == Event.objects.count() == size > 5
    assert all(report.checkpoint is None for report in reports)
    assert "no signing key" in next(r for r in reports if r.appended).describe()
    _assert_whole_log_matches_the_events()
    again = services.log_seal()
    assert (again.appended, again.size) == (0, size)
    _history(api)
    seal_all()
    _assert_whole_log_matches_the_events()


def test_bounded_passes_resume_where_the_last_one_stopped(api):
    _history(api)
    _history(api)
    total = Event.objects.count()
    passes = [report.appended for report in seal_all(limit=3)]
    assert sum(passes) == total
    assert max(passes) == 3
    _assert_whole_log_matches_the_events()
    # The log's order, however the passes were cut.
    order = _sealed()
    assert order == sorted(order, key=_order_key)


def _order_key(event_id: int):
    """The log's order: (inserting transaction, id) on PostgreSQL, the id on SQLite."""
    if connection.vendor != "postgresql":
        return (0, event_id)
    with connection.cursor() as cursor:
        cursor.execute("SELECT txid FROM operations_event WHERE id = %s", [event_id])
        return (cursor.fetchone()[0], event_id)


def test_a_checkpoint_is_signed_when_the_tree_grew(api, audit_key):
    _history(api)
    reports = seal_all()
    checkpoint = reports[-1].checkpoint or Checkpoint.objects.order_by("size").last()
    size = reports[-1].size
    assert checkpoint is not None
    assert checkpoint.size == size
    assert [c.size for c in Checkpoint.objects.all()] == sorted(
        {r.checkpoint.size for r in reports if r.checkpoint}
    )
    assert bytes(checkpoint.root) == expected_root(size)
    origin = "127.0.0.1:8000/effectgate-audit"
    assert checkpoint.origin == origin
    text = notes.open_note(checkpoint.note, name=origin, keys=[audit_key.public_key()])
    body = notes.CheckpointBody.parse(text)
    assert (body.size, body.root, body.time) == (checkpoint.size, checkpoint.root, checkpoint.time)
    assert checkpoint.time.microsecond == 0
    # Nothing new: no other checkpoint; something new: one of the new size.
    signed = Checkpoint.objects.count()
    assert services.log_seal().checkpoint is None
    assert Checkpoint.objects.count() == signed
    _history(api)
    seal_all()
    later = Checkpoint.objects.order_by("size").last()
    assert later.size == LogLeaf.objects.count() > checkpoint.size
    proof = selectors.consistency_proof(first=checkpoint.size, second=later.size)
    assert merkle.verify_consistency(
        first=checkpoint.size,
        second=later.size,
        first_root=bytes(checkpoint.root),
        second_root=bytes(later.root),
        proof=proof,
    )


def test_a_key_configured_later_signs_the_log_as_it_stands(api, settings, tmp_path):
    _history(api)
    unsigned = seal_all()[-1]
    assert unsigned.checkpoint is None
    assert unsigned.size > 0
    assert not Checkpoint.objects.exists()
    path, _ = write_signing_key(tmp_path)
    settings.AUDIT_SIGNING_KEY_FILE = str(path)
    signed = services.log_seal()
    assert signed.appended == 0
    assert signed.checkpoint is not None
    assert signed.checkpoint.size == signed.size


def test_the_key_can_come_from_the_environment_text(api, settings, tmp_path):
    path, key = write_signing_key(tmp_path)
    settings.AUDIT_SIGNING_KEY = path.read_text()
    _history(api)
    seal_all()
    checkpoint = Checkpoint.objects.order_by("size").last()
    assert checkpoint is not None
    assert notes.open_note(checkpoint.note, name=checkpoint.origin, keys=[key.public_key()])


def test_a_key_that_is_not_ed25519_is_refused_without_showing_it(api, settings, tmp_path):
    from django.core.exceptions import ImproperlyConfigured

    settings.AUDIT_SIGNING_KEY = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----"
    with pytest.raises(ImproperlyConfigured, match="AUDIT_SIGNING_KEY holds no") as refused:
        services.log_seal()
    assert "c2VjcmV0" not in str(refused.value)
    settings.AUDIT_SIGNING_KEY = ""
    settings.AUDIT_SIGNING_KEY_FILE = str(tmp_path / "missing.pem")
    with pytest.raises(ImproperlyConfigured, match="cannot be read"):
        services.log_seal()
    settings.AUDIT_SIGNING_KEY_FILE = ""
    for origin in ("has space/log", "a+b/log", "x" * 256):
        settings.AUDIT_LOG_ORIGIN = origin
        with pytest.raises(ImproperlyConfigured, match="AUDIT_LOG_ORIGIN"):
            services.log_seal()
    assert not LogLeaf.objects.exists()


def test_the_checkpoint_is_announced_to_subscribed_endpoints(api, other_api, audit_key, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    receiver = Receiver()
    try:
        created = api.post(
            "/api/v1/webhook-endpoints", {"url": receiver.url, "events": ["audit.checkpoint"]}
        )
        assert created.status_code == 201, created.json()
        # Another runner's endpoint that wants operations only hears nothing of it.
        other = other_api.post(
            "/api/v1/webhook-endpoints", {"url": receiver.url, "events": ["operation.*"]}
        )
        assert other.status_code == 201
        _history(other_api)
        OutboxMessage.objects.all().delete()
        seal_all()
        checkpoint = Checkpoint.objects.order_by("size").last()
        messages = OutboxMessage.objects.order_by("created_at", "id")
        assert {m.event_type for m in messages} == {"audit.checkpoint"}
        assert {m.endpoint_id for m in messages} == {created.json()["id"]}
        assert len(messages) == Checkpoint.objects.count()
        report = webhooks.deliver_due()
        assert report.delivered == len(messages)
        request = next(
            r for r in receiver.requests if r.headers["webhook-id"] == messages.last().id
        )
        payload = Webhook(created.json()["secret"]).verify(request.body, request.headers)
        assert payload["type"] == "audit.checkpoint"
        assert payload["data"] == {
            "checkpoint": {
                "size": checkpoint.size,
                "root": base64.b64encode(bytes(checkpoint.root)).decode(),
                "time": checkpoint.time.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "origin": checkpoint.origin,
                "note": checkpoint.note,
            }
        }
        # What the witness keeps verifies with the published key alone.
        kept = payload["data"]["checkpoint"]["note"]
        assert notes.open_note(kept, name=checkpoint.origin, keys=[audit_key.public_key()])
    finally:
        receiver.close()


# --- PostgreSQL: late commits and two sealers, with real concurrent transactions ----------


def _in_thread(target, name=None):
    """Run ``target`` on a thread with its own database connection, closed at the end."""

    def run():
        try:
            target()
        finally:
            connection.close()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_an_event_committed_late_is_sealed_once_after_its_commit():
    """A transaction inserts an event and stays open while other events, inserted after
    it (larger ids), commit and the sealer runs: the open one's event is not sealed, nor
    are those of transactions younger than it (the horizon), and none is skipped."""
    first = make_runner()
    inserted, release, slow = threading.Event(), threading.Event(), {}

    def slow_transaction():
        with transaction.atomic():
            runner, _ = services.runner_create(
                name="slow-runner", actor=services.Actor.system("test")
            )
            slow["event"] = Event.objects.filter(stream=f"runner:{runner.pk}").latest("pk").pk
            inserted.set()
            assert release.wait(30)

    thread = _in_thread(slow_transaction)
    assert inserted.wait(30)
    later = make_runner()
    later_events = set(
        Event.objects.filter(stream=f"runner:{later.runner.pk}").values_list("pk", flat=True)
    )
    assert min(later_events) > slow["event"]  # committed first, numbered after

    older = set(
        Event.objects.filter(stream=f"runner:{first.runner.pk}").values_list("pk", flat=True)
    )
    # Passes while the slow transaction stays open: the older events go in (as soon as
    # no other session's older transaction holds them back), the open one's event and
    # those of younger transactions do not.
    for _ in range(600):
        services.log_seal()
        if older <= set(_sealed()):
            break
        time.sleep(0.05)
    services.log_seal()
    sealed = set(_sealed())
    assert older <= sealed
    assert slow["event"] not in sealed
    assert not later_events & sealed  # younger than the open transaction: they wait too
    size_while_open = len(sealed)

    release.set()
    thread.join(30)
    assert not thread.is_alive()
    seal_all()
    order = _sealed()
    assert order.count(slow["event"]) == 1
    assert order.index(slow["event"]) >= size_while_open
    assert later_events <= set(order)
    assert services.log_seal().appended == 0
    _assert_whole_log_matches_the_events()


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_second_sealer_while_one_runs_does_nothing(monkeypatch):
    make_runner()
    reading, release, first = threading.Event(), threading.Event(), {}
    due = seal._due

    def slow_due(last, limit):
        rows = due(last, limit)
        if threading.current_thread().name == "first-sealer":
            reading.set()
            assert release.wait(30)
        return rows

    monkeypatch.setattr(seal, "_due", slow_due)

    def run_first():
        first["report"] = services.log_seal()

    thread = _in_thread(run_first, name="first-sealer")
    assert reading.wait(30)
    second = services.log_seal()
    assert second.busy
    assert second.appended == 0
    assert "Another sealer" in second.describe()
    before = LogLeaf.objects.count()
    release.set()
    thread.join(30)
    assert not first["report"].busy
    assert LogLeaf.objects.count() == before + first["report"].appended
    seal_all()
    _assert_whole_log_matches_the_events()


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_sealers_racing_writers_seal_each_event_once():
    """Four sealers in a loop while two threads keep writing events: at the end every
    event is in the log once (the database would refuse a second leaf of one event)."""
    stop, errors = threading.Event(), []
    make_runner()

    def writer(n):
        for i in range(15):
            make_runner(name=f"writer-{n}-{i}")

    def sealer():
        try:
            while not stop.is_set():
                services.log_seal(limit=7)
        except Exception as exc:
            errors.append(exc)

    sealers = [_in_thread(sealer) for _ in range(4)]
    writers = [_in_thread(lambda n=n: writer(n)) for n in range(2)]
    for thread in writers:
        thread.join(120)
    stop.set()
    for thread in sealers:
        thread.join(120)
    assert errors == []
    seal_all()
    _assert_whole_log_matches_the_events()


def test_the_beat_task_seals_pass_after_pass_until_caught_up(api, audit_key, settings):
    from operations import tasks

    _history(api)
    _history(api)
    wait_until_sealable()
    appended = services.log_seal_due(budget_s=30, limit=3)
    assert appended == LogLeaf.objects.count() >= 3
    # Each pass that grew the tree signed a checkpoint of it.
    assert Checkpoint.objects.count() >= appended // 3
    seal_all()
    _history(api)
    settings.AUDIT_SEAL_EVERY_S = 5
    before = LogLeaf.objects.count()
    wait_until_sealable()
    sealed = tasks.seal_audit_log()
    assert sealed == LogLeaf.objects.count() - before > 0
    seal_all()
    _assert_whole_log_matches_the_events()
