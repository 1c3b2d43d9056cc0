"""Checkpoints as C2SP signed notes, byte for byte (no database).

The signed-note vector is the one of Go's reference implementation
(golang.org/x/mod/sumdb/note): Ed25519 signatures are deterministic, so signing its text
with its key must give its note exactly, key id included. The checkpoint vector pins
the checkpoint's text (origin, size, root, one ``time`` line) and its note.
"""

import base64
import hashlib
from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from operations.tlog import notes
from operations.tlog.notes import CheckpointBody, NoteError

# golang.org/x/mod/sumdb/note, note_test.go.
GO_SIGNER = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VERIFIER = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
GO_NOTE = (
    GO_TEXT + "\n\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2p"
    "ZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
)

# The RFC 6962 test tree of 8 leaves (test_tlog_merkle.py) as this log would sign it.
ROOT_8 = bytes.fromhex("5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328")
ORIGIN = "audit.example.com/effectgate-audit"
CHECKPOINT_NOTE = (
    "audit.example.com/effectgate-audit\n"
    "8\n"
    "XcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\n"
    "time 2025-01-02T03:04:05Z\n"
    "\n"
    "\u2014 audit.example.com/effectgate-audit VW+7tVrn4KwjPEvU9TegSdS5Yr+3EZ4p+4xG5ASpbKKlvZK5q"
    "inTi/BbdGvNcgrfY/+EeppAneU/U9xXyBYBmpwSEw4=\n"
)


def _go_key() -> Ed25519PrivateKey:
    # PRIVATE+KEY+<name>+<id>+<base64(0x01 || seed)>; the base64 may hold '+'.
    seed = base64.b64decode(GO_SIGNER.split("+", 4)[4])
    assert seed[0] == 1
    return Ed25519PrivateKey.from_private_bytes(seed[1:])


def test_signing_the_go_vector_gives_its_note_exactly():
    key = _go_key()
    assert notes.sign(GO_TEXT, name="PeterNeumann", key=key) == GO_NOTE
    assert notes.key_id("PeterNeumann", key.public_key()) == bytes.fromhex("c74f20a3")
    assert notes.verifier_key("PeterNeumann", key.public_key()) == GO_VERIFIER
    assert notes.open_note(GO_NOTE, name="PeterNeumann", keys=[key.public_key()]) == GO_TEXT


def test_a_checkpoint_vector_byte_for_byte():
    key = _go_key()
    body = CheckpointBody(
        origin=ORIGIN, size=8, root=ROOT_8, time=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    )
    note = notes.sign(body.text(), name=ORIGIN, key=key)
    assert note == CHECKPOINT_NOTE
    # The key id, computed here from its definition, and the signature over the text.
    text, (signature,) = notes.split(note)
    raw = notes.raw_public_key(key.public_key())
    assert signature.key_id == hashlib.sha256(ORIGIN.encode() + b"\n\x01" + raw).digest()[:4]
    key.public_key().verify(signature.signature, text.encode())
    assert CheckpointBody.parse(notes.open_note(note, name=ORIGIN, keys=[key.public_key()])) == body


def test_a_changed_byte_or_another_key_does_not_verify():
    key = _go_key()
    public = key.public_key()
    for changed in (
        CHECKPOINT_NOTE.replace("\n8\n", "\n9\n"),
        CHECKPOINT_NOTE.replace("03:04:05", "03:04:06"),
        CHECKPOINT_NOTE.replace("XcnaeacG", "XcnaeacH"),
    ):
        with pytest.raises(NoteError, match="does not verify"):
            notes.open_note(changed, name=ORIGIN, keys=[public])
    other = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(NoteError, match=r"no signature of .* by a known key"):
        notes.open_note(CHECKPOINT_NOTE, name=ORIGIN, keys=[other])
    with pytest.raises(NoteError, match=r"no signature of other\.example"):
        notes.open_note(CHECKPOINT_NOTE, name="other.example", keys=[public])


def test_a_witness_cosignature_beside_ours_is_ignored():
    key, witness = _go_key(), Ed25519PrivateKey.generate()
    body = CheckpointBody(origin=ORIGIN, size=1, root=bytes(32), time=datetime.now(UTC))
    ours = notes.sign(body.text(), name=ORIGIN, key=key)
    theirs = notes.sign(body.text(), name="witness.example", key=witness).split("\n\n")[1]
    both = ours + theirs
    assert notes.open_note(both, name=ORIGIN, keys=[key.public_key()]) == body.text()
    assert notes.open_note(both, name="witness.example", keys=[witness.public_key()])


@pytest.mark.parametrize(
    "note",
    [
        "no signature block\n",
        "text\n\n\u2014 name\n",
        "text\n\n- name AAAAAAAA\n",
        "text\n\n\u2014 name !!!!\n",
        "text\n\n\u2014 name AAAA\n",
        "text\n\n\u2014 name AAAAAAAA",
        "te\rxt\n\n\u2014 name AAAAAAAA\n",
        "text\n\n\u2014 na+me AAAAAAAA\n",
    ],
)
def test_malformed_notes_are_refused(note):
    with pytest.raises(NoteError):
        notes.open_note(note, name="name", keys=[_go_key().public_key()])


@pytest.mark.parametrize(
    "text",
    [
        "origin\n8\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\n",
        "origin\n08\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\ntime 2025-01-02T03:04:05Z\n",
        "origin\n8\nXcnaeacG\ntime 2025-01-02T03:04:05Z\n",
        "origin\n8\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\ntime 2025-13-02T03:04:05Z\n",
        "origin\n8\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\ntime 2025-01-02 03:04:05\n",
        "\n8\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\ntime 2025-01-02T03:04:05Z\n",
        "origin\n8\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\ntime 2025-01-02T03:04:05Z",
    ],
)
def test_malformed_checkpoints_are_refused(text):
    with pytest.raises(NoteError):
        CheckpointBody.parse(text)


def test_key_names_hold_no_space_or_plus():
    for name in ("", "a b", "a+b", "a\tb", "a\u00a0b", "a\x01b"):
        with pytest.raises(NoteError):
            notes.check_key_name(name)
    assert notes.check_key_name("effectgate.example.com:8443/effectgate-audit")
