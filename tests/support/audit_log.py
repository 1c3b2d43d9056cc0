"""The transparency log in tests: a signing key in a file, and the log's root computed
the naive way (RFC 9162's MTH, recursively, over every leaf as the events say now)."""

import hashlib
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from django.db import connection

from operations import services
from operations.models import Event, LogLeaf
from operations.services import SealReport
from operations.services.seal import _HORIZON
from operations.tlog import leaves


def write_signing_key(folder: Path, name: str = "audit.pem") -> tuple[Path, Ed25519PrivateKey]:
    """A fresh Ed25519 key, as ``openssl genpkey -algorithm ed25519`` writes it (PKCS #8)."""
    key = Ed25519PrivateKey.generate()
    path = folder / name
    path.write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    path.chmod(0o600)
    return path, key


def unsealed() -> list[int]:
    """The events this connection sees that have no leaf yet."""
    sealed = LogLeaf.objects.values("event_id")
    return list(Event.objects.exclude(pk__in=sealed).values_list("pk", flat=True))


def wait_until_sealable(*, timeout_s: float = 600) -> None:
    """Wait until the sealer may take every event this connection sees: on PostgreSQL,
    until no transaction older than the newest event's is open anywhere on the server
    (the horizon the sealer reads is past its ``txid``; see ``seal_all``). A test that
    counts what one pass seals waits for this first, or it counts the other workers'
    transactions, not the sealer's work."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        # The column the database fills (not a model field: Event.txid is written by
        # PostgreSQL, migration 0019).
        cursor.execute("SELECT max(txid) FROM operations_event")
        newest = cursor.fetchone()[0]
    if newest is None:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        with connection.cursor() as cursor:
            cursor.execute(_HORIZON)
            horizon = cursor.fetchone()[0]
        if horizon > newest:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"A transaction older than {newest} is open after {timeout_s} s")
        time.sleep(0.05)


def seal_all(*, timeout_s: float = 600, **kwargs) -> list[SealReport]:
    """Seal until every event this connection sees is in the log; the passes' reports.

    On PostgreSQL the sealer leaves an event for later while any transaction older than
    the one that wrote it is still open, anywhere on the server: the other workers of a
    parallel run (a long one: a bench run's seeding), another checkout's tests. Each
    ends, so this asks again until they have.
    """
    deadline = time.monotonic() + timeout_s
    reports = []
    while True:
        reports.append(services.log_seal(**kwargs))
        if not unsealed():
            return reports
        if time.monotonic() > deadline:
            raise AssertionError(f"Events still unsealed after {timeout_s} s: {unsealed()}")
        time.sleep(0.05)


def naive_mth(hashes: list[bytes]) -> bytes:
    """MTH of RFC 9162 §2.1.1 over leaf hashes, straight from its definition."""
    if not hashes:
        return hashlib.sha256(b"").digest()
    if len(hashes) == 1:
        return hashes[0]
    k = 1
    while k * 2 < len(hashes):
        k *= 2
    return hashlib.sha256(b"\x01" + naive_mth(hashes[:k]) + naive_mth(hashes[k:])).digest()


def leaf_of(event: Event) -> bytes:
    return leaves.event_leaf(event=event.pk, hash=event.hash, seq=event.seq, stream=event.stream)


def expected_root(size: int) -> bytes:
    """The root of the first ``size`` leaves, each computed from its event's row now."""
    order = list(LogLeaf.objects.order_by("index").values_list("event_id", flat=True)[:size])
    events = Event.objects.in_bulk(order)
    return naive_mth([leaf_of(events[event_id]) for event_id in order])
