"""Event MACs (operations/eventmac.py): an event written with the database's credentials
but without the application's key is named by ``audit verify``; keys rotate; a ledger
from before the key gets its MACs by ``audit mac --backfill``."""

import hashlib
import hmac
import runpy
import secrets
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.utils import timezone

from console import settings as settings_module
from operations import audit, services
from operations.eventmac import keyring
from operations.models import Event, Operation
from tests.conftest import contract

from .conftest import audit_verify

KEY = "a1" * 32
OTHER = "b2" * 32


@pytest.fixture
def keyed(settings):
    settings.AUDIT_EVENT_KEY = KEY
    settings.AUDIT_EVENT_KEY_ID = "k1"
    settings.AUDIT_EVENT_OLD_KEYS = {}
    return settings


def _history(api) -> Operation:
    api.tool("t", contract("idempotent"))
    op = api.register(api.run(), "t", claim={"lease_s": 30})
    api.outcome(op["id"], 1, {"kind": "failed", "code": "rate_limited"})
    api.claim(op["id"])
    api.outcome(op["id"], 2, {"kind": "succeeded", "downstream_id": "re_1"})
    return Operation.objects.get(pk=op["id"])


def _forge_next(stream: str, mac=lambda digest: "") -> Event:
    """What someone with the database's credentials can write without the key: the
    stream's next event, with the right seq, prev_hash and hash (and ``mac(hash)``)."""
    last = Event.objects.filter(stream=stream).order_by("-seq").first()
    event = Event(
        stream=stream,
        seq=last.seq + 1,
        kind="outcome",
        operation_id=last.operation_id,
        run_id=last.run_id,
        tool_name=last.tool_name,
        from_status="succeeded",
        to_status="succeeded",
        actor="user:mallory",
        at=timezone.now(),
        data={"note": "refund sent twice"},
        prev_hash=last.hash,
    )
    event.hash = services.event_hash(event)
    event.mac = mac(event.hash)
    event.save()
    return event


def test_every_event_carries_its_mac_under_the_key(keyed, api):
    op = _history(api)
    events = list(Event.objects.filter(stream=op.id).order_by("seq"))
    assert len(events) >= 5
    for event in events:
        digest = hmac.new(bytes.fromhex(KEY), event.hash.encode(), hashlib.sha256).hexdigest()
        assert event.mac == f"k1:{digest}"
    code, out = audit_verify()
    assert code == 0, out
    assert "Every event's MAC verifies (keys k1)." in out


def test_the_mac_is_not_part_of_the_hash(keyed, api):
    op = _history(api)
    event = Event.objects.filter(stream=op.id).first()
    keyed.AUDIT_EVENT_KEY = ""
    assert services.event_hash(event) == event.hash
    assert audit.chains_verify().ok


def test_without_a_key_verify_says_macs_were_not_checked(settings, api):
    settings.AUDIT_EVENT_KEY = ""
    settings.AUDIT_EVENT_OLD_KEYS = {}
    op = _history(api)
    assert set(Event.objects.filter(stream=op.id).values_list("mac", flat=True)) == {""}
    code, out = audit_verify()
    assert code == 0, out
    assert "MACs not checked: no event key" in out


def test_a_correctly_hashed_event_inserted_without_the_key_is_named(keyed, api):
    op = _history(api)
    forged = _forge_next(op.id)
    # The chain alone cannot tell: the forger computed the hash anyone can.
    assert audit.chains_verify().ok
    report = audit.chains_verify(keys=keyring())
    assert not report.breaks
    found = report.first_mac_fault
    assert (found.stream, found.seq, found.event_id) == (op.id, forged.seq, forged.pk)
    assert "no MAC" in found.problem
    code, out = audit_verify()
    assert code == 1
    assert "Every chain verifies." in out
    assert f"NO VALID MAC stream {op.id} seq {forged.seq} (event id {forged.pk})" in out
    assert f"The event {op.id} seq {forged.seq} (event id {forged.pk}) has no valid MAC" in out


def test_a_mac_copied_from_another_event_or_made_with_another_key_is_refused(keyed, api):
    copier, guesser = _history(api), _history(api)
    copied = Event.objects.filter(stream=copier.id).first().mac
    _forge_next(copier.id, mac=lambda digest: copied)
    # The forger's own key, under the real key's id.
    own = secrets.token_bytes(32)
    _forge_next(
        guesser.id,
        mac=lambda digest: "k1:" + hmac.new(own, digest.encode(), hashlib.sha256).hexdigest(),
    )
    report = audit.chains_verify(keys=keyring())
    assert not report.breaks
    assert {(fault.stream, fault.problem) for fault in report.mac_faults} == {
        (stream, "the MAC does not match the event's hash under key k1")
        for stream in (copier.id, guesser.id)
    }
    code, out = audit_verify("--all")
    assert code == 1
    assert out.count("NO VALID MAC") == 2
    assert "(2 events in all)" in out


def test_the_expected_mac_is_never_printed(keyed, api):
    op = _history(api)
    forged = _forge_next(op.id)
    valid = hmac.new(bytes.fromhex(KEY), forged.hash.encode(), hashlib.sha256).hexdigest()
    _code, out = audit_verify("--all")
    assert valid not in out


def test_after_a_rotation_old_events_verify_with_the_old_key(keyed, api):
    before = _history(api)
    keyed.AUDIT_EVENT_KEY, keyed.AUDIT_EVENT_KEY_ID = OTHER, "k2"
    keyed.AUDIT_EVENT_OLD_KEYS = {"k1": KEY}
    after = _history(api)
    assert Event.objects.filter(stream=before.id).first().mac.startswith("k1:")
    assert Event.objects.filter(stream=after.id).first().mac.startswith("k2:")
    code, out = audit_verify()
    assert code == 0, out
    assert "Every event's MAC verifies (keys k1, k2)." in out
    # Without the old key, the events it signed are named.
    keyed.AUDIT_EVENT_OLD_KEYS = {}
    code, out = audit_verify()
    assert code == 1
    assert "under the key id 'k1', which no given key has" in out


def test_verify_takes_the_keys_from_a_file(keyed, api, tmp_path, settings):
    op = _history(api)
    settings.AUDIT_EVENT_KEY = ""
    keys = tmp_path / "event-keys"
    keys.write_text(f"# kept by the auditor\nk1:{KEY}\n")
    code, out = audit_verify("--event-key-file", str(keys))
    assert code == 0, out
    assert "Every event's MAC verifies (keys k1)." in out
    keys.write_text(f"{OTHER}\n")  # a bare key takes AUDIT_EVENT_KEY_ID, k1: the wrong one
    code, out = audit_verify("--event-key-file", str(keys))
    assert code == 1
    assert f"{op.id} seq 1" in out
    keys.write_text("k1:abcd\n")
    code, out = audit_verify("--event-key-file", str(keys))
    assert code == 1
    assert "at least 32 are needed" in out


def _mac(*args: str) -> str:
    out = StringIO()
    call_command("audit", "mac", *args, stdout=out)
    return out.getvalue()


def test_backfill_gives_the_events_from_before_the_key_their_mac(settings, api):
    settings.AUDIT_EVENT_KEY = ""
    settings.AUDIT_EVENT_OLD_KEYS = {}
    old = _history(api)
    settings.AUDIT_EVENT_KEY, settings.AUDIT_EVENT_KEY_ID = KEY, "k1"
    new = _history(api)
    missing = Event.objects.filter(mac="").count()
    assert not Event.objects.filter(stream=old.id).exclude(mac="").exists()
    assert not Event.objects.filter(stream=new.id, mac="").exists()
    code, out = audit_verify()
    assert code == 1
    assert "no MAC (written without the key" in out
    assert f"{missing} events have no MAC." in _mac()
    out = _mac("--backfill")
    assert f"wrote the MAC of {missing} events under key k1" in out
    assert not Event.objects.filter(mac="").exists()
    code, out = audit_verify()
    assert code == 0, out
    assert "0 events have no MAC." in _mac("--backfill")


def test_backfill_refuses_a_broken_chain(keyed, api, settings):
    settings.AUDIT_EVENT_KEY = ""
    op = _history(api)
    settings.AUDIT_EVENT_KEY = KEY
    from tests.security.test_audit_integrity import tampering

    with tampering():
        Event.objects.filter(stream=op.id, seq=2).update(actor="user:mallory")
    missing = Event.objects.filter(mac="").count()
    assert missing
    with pytest.raises(CommandError, match=f"Not vouching for a broken audit trail: {op.id} seq 2"):
        _mac("--backfill")
    assert Event.objects.filter(mac="").count() == missing


def test_backfill_without_a_key_is_refused(settings, api):
    settings.AUDIT_EVENT_KEY = ""
    _history(api)
    with pytest.raises(CommandError, match="No event key"):
        _mac("--backfill")


# --- the settings -----------------------------------------------------------------------


def _settings(monkeypatch, **env: str) -> dict:
    monkeypatch.setenv("SECRET_KEY", secrets.token_urlsafe(50))
    for name in ("AUDIT_EVENT_KEY", "AUDIT_EVENT_KEY_FILE", "AUDIT_EVENT_KEY_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AUDIT_EVENT_OLD_KEYS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(settings_module.__file__)


def test_the_settings_read_the_key_from_the_environment_or_a_file(monkeypatch, tmp_path):
    loaded = _settings(monkeypatch, AUDIT_EVENT_KEY=KEY.upper(), AUDIT_EVENT_OLD_KEYS=f"k0:{OTHER}")
    assert loaded["AUDIT_EVENT_KEY"] == KEY
    assert loaded["AUDIT_EVENT_KEY_ID"] == "k1"
    assert loaded["AUDIT_EVENT_OLD_KEYS"] == {"k0": OTHER}
    path = tmp_path / "event.key"
    path.write_text(KEY + "\n")
    loaded = _settings(monkeypatch, AUDIT_EVENT_KEY_FILE=str(path), AUDIT_EVENT_KEY_ID="2026-q1")
    assert (loaded["AUDIT_EVENT_KEY"], loaded["AUDIT_EVENT_KEY_ID"]) == (KEY, "2026-q1")
    assert _settings(monkeypatch)["AUDIT_EVENT_KEY"] == ""


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AUDIT_EVENT_KEY": "ab" * 31}, "holds 31 bytes; an event key needs at least 32"),
        ({"AUDIT_EVENT_KEY": "not hex at all"}, "AUDIT_EVENT_KEY is not hex"),
        ({"AUDIT_EVENT_KEY": KEY, "AUDIT_EVENT_KEY_ID": "k:1"}, "is not a key id"),
        ({"AUDIT_EVENT_KEY": KEY, "AUDIT_EVENT_OLD_KEYS": "k0:abcd"}, "holds 2 bytes"),
        ({"AUDIT_EVENT_KEY": KEY, "AUDIT_EVENT_OLD_KEYS": OTHER}, "takes id:hex pairs"),
        ({"AUDIT_EVENT_KEY": KEY, "AUDIT_EVENT_OLD_KEYS": f"k1:{OTHER}"}, "the current key"),
        ({"AUDIT_EVENT_KEY_FILE": "/nonexistent/event.key"}, "cannot read"),
    ],
)
def test_the_settings_refuse_a_short_or_malformed_key(monkeypatch, env, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        _settings(monkeypatch, **env)


def test_the_settings_refuse_a_key_in_both_places(monkeypatch, tmp_path):
    path = tmp_path / "event.key"
    path.write_text(KEY)
    with pytest.raises(ImproperlyConfigured, match="not both"):
        _settings(monkeypatch, AUDIT_EVENT_KEY=KEY, AUDIT_EVENT_KEY_FILE=str(path))
