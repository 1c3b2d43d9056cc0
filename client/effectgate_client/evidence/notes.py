"""C2SP signed notes and tlog checkpoints, read and verified (Ed25519).

A checkpoint is the note text ``<origin>\\n<size>\\n<base64 root>\\n`` followed by
extension lines (Effectgate writes one, ``time <RFC 3339 UTC>``); the signed note is that
text, an empty line, and signature lines ``\\u2014 <key name> <base64(key id (4 bytes) ||
signature)>``. An Ed25519 signature covers the text's UTF-8 bytes; the key id is the
first four bytes of SHA-256(key name || "\\n" || 0x01 || the 32-byte public key).
Written from the C2SP specifications for this verifier (c2sp.org/signed-note,
c2sp.org/tlog-checkpoint), sharing no code with the server.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)

EM_DASH = "\u2014"
ED25519 = b"\x01"
MAX_NOTE_BYTES = 64 * 1024
_SIZE = re.compile(r"0|[1-9][0-9]{0,18}")
_TIME = re.compile(r"time (\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)")


class NoteError(ValueError):
    """A note that is malformed, or whose signature does not verify."""


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM (SubjectPublicKeyInfo, as the server publishes it
    at /.well-known/effectgate-audit-key)."""
    try:
        key = load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise NoteError("the key file holds no public key in PEM") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise NoteError("the key file holds a public key that is not Ed25519")
    return key


def key_id(name: str, key: Ed25519PublicKey) -> bytes:
    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(name.encode() + b"\n" + ED25519 + raw).digest()[:4]


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    time: datetime | None
    key_id: bytes


def open_checkpoint(note: str, *, key: Ed25519PublicKey, origin: str) -> Checkpoint:
    """The checkpoint in ``note`` once its signature by ``key``, named ``origin``,
    verifies; other signatures (a witness's cosignature) are ignored."""
    if len(note.encode()) > MAX_NOTE_BYTES:
        raise NoteError(f"the note is longer than {MAX_NOTE_BYTES} bytes")
    text, separator, block = note.rpartition("\n\n")
    if not separator or not block.endswith("\n"):
        raise NoteError("the note has no signature block (an empty line, then signatures)")
    text += "\n"
    if any((ord(c) < 0x20 and c != "\n") or ord(c) == 0x7F for c in text):
        raise NoteError("the note's text holds a control character")
    wanted = key_id(origin, key)
    found = False
    for line in block[:-1].split("\n"):
        dash, _, rest = line.partition(" ")
        name, _, encoded = rest.partition(" ")
        if dash != EM_DASH or not name or not encoded or " " in encoded:
            raise NoteError(f"{line[:80]!r} is not a signature line")
        try:
            blob = base64.b64decode(encoded, validate=True)
        except binascii.Error as exc:
            raise NoteError(f"the signature of {name} is not base64") from exc
        if base64.b64encode(blob).decode() != encoded:
            raise NoteError(f"the signature of {name} is not in canonical base64")
        if name != origin or blob[:4] != wanted:
            continue
        try:
            key.verify(blob[4:], text.encode())
        except InvalidSignature:
            raise NoteError(
                f"the signature of {name} (key id {wanted.hex()}) does not verify with the "
                "given key: the note was changed after it was signed"
            ) from None
        found = True
        break
    if not found:
        raise NoteError(
            f"the note has no signature of {origin} by the given key (key id {wanted.hex()})"
        )
    return _parse(text, key_id=wanted)


def _parse(text: str, *, key_id: bytes) -> Checkpoint:
    lines = text.split("\n")[:-1]
    if len(lines) < 3:
        raise NoteError("a checkpoint has at least an origin, a size and a root hash")
    origin, size, root, *extensions = lines
    if not _SIZE.fullmatch(size):
        raise NoteError(f"the checkpoint's size {size[:40]!r} is not a decimal number")
    try:
        digest = base64.b64decode(root, validate=True)
    except binascii.Error as exc:
        raise NoteError("the checkpoint's root hash is not base64") from exc
    if len(digest) != 32 or base64.b64encode(digest).decode() != root:
        raise NoteError("the checkpoint's root hash is not 32 bytes in canonical base64")
    at = None
    for line in extensions:
        matched = _TIME.fullmatch(line)
        if matched is not None:
            try:
                at = datetime.strptime(matched.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            except ValueError as exc:
                raise NoteError(f"the checkpoint's time {matched.group(1)!r} is no date") from exc
    return Checkpoint(origin=origin, size=int(size), root=digest, time=at, key_id=key_id)
