"""Checkpoints as C2SP signed notes (pure: no Django).

A checkpoint (C2SP ``tlog-checkpoint``) is the note text::

    <origin>\\n<tree size>\\n<base64 root hash>\\ntime <RFC 3339 UTC, seconds, Z>\\n

(one extension line, ``time``), and the signed note (C2SP ``signed-note``) is that text,
an empty line, and one signature line per signer::

    \\u2014 <key name> <base64(key id (4 bytes) || Ed25519 signature (64 bytes))>\\n

The signature is Ed25519 over the text's UTF-8 bytes; the key name is the origin; the
key id is the first four bytes of SHA-256(key name || "\\n" || 0x01 || public key), 0x01
being the signature type of Ed25519. Go's ``golang.org/x/mod/sumdb/note`` and every
witness that reads C2SP checkpoints read these notes.
"""

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

EM_DASH = "\u2014"
ED25519_TYPE = b"\x01"
# At most this many signature lines are read (Go's reader allows as many).
MAX_SIGNATURES = 100
MAX_NOTE_BYTES = 64 * 1024
_SIZE = re.compile(r"0|[1-9][0-9]{0,18}")
_TIME = re.compile(r"time (\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)")


class NoteError(ValueError):
    """A note or checkpoint that is malformed or whose signature does not verify."""


def check_key_name(name: str) -> str:
    """A signed note's key name: not empty, no space of any kind, no ``+``."""
    if not name or "+" in name or any(char.isspace() for char in name):
        raise NoteError(f"{name!r} cannot name a key: it must be non-empty, without spaces or '+'.")
    if any(ord(char) < 0x20 or ord(char) == 0x7F for char in name):
        raise NoteError(f"{name!r} cannot name a key: it holds a control character.")
    return name


def raw_public_key(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id(name: str, key: Ed25519PublicKey) -> bytes:
    """The 4-byte key id of an Ed25519 key named ``name``."""
    digest = hashlib.sha256(name.encode() + b"\n" + ED25519_TYPE + raw_public_key(key))
    return digest.digest()[:4]


def verifier_key(name: str, key: Ed25519PublicKey) -> str:
    """The key as Go's note package writes a verifier: ``name+hex id+base64(0x01 || key)``."""
    encoded = base64.b64encode(ED25519_TYPE + raw_public_key(key)).decode()
    return f"{check_key_name(name)}+{key_id(name, key).hex()}+{encoded}"


def format_time(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class CheckpointBody:
    """What a checkpoint says: the log's origin, its size, its root hash, and when."""

    origin: str
    size: int
    root: bytes
    time: datetime

    def text(self) -> str:
        if not self.origin or any(char in self.origin for char in "\r\n"):
            raise NoteError(f"{self.origin!r} cannot be a checkpoint's origin.")
        if self.size < 0 or len(self.root) != 32:
            raise NoteError("A checkpoint has a size of at least 0 and a 32-byte root hash.")
        root = base64.b64encode(self.root).decode()
        return f"{self.origin}\n{self.size}\n{root}\ntime {format_time(self.time)}\n"

    @classmethod
    def parse(cls, text: str) -> "CheckpointBody":
        """The checkpoint of a note's text, as this log writes it, strictly."""
        lines = text.split("\n")
        if len(lines) != 5 or lines[-1] != "":
            raise NoteError("A checkpoint is four lines: origin, size, root hash, time.")
        origin, size, root, time, _ = lines
        if not origin:
            raise NoteError("The checkpoint's origin line is empty.")
        if not _SIZE.fullmatch(size):
            raise NoteError(f"The checkpoint's size {size[:40]!r} is not a decimal number.")
        try:
            digest = base64.b64decode(root, validate=True)
        except binascii.Error as exc:
            raise NoteError("The checkpoint's root hash is not base64.") from exc
        if len(digest) != 32 or base64.b64encode(digest).decode() != root:
            raise NoteError("The checkpoint's root hash is not 32 bytes in standard base64.")
        found = _TIME.fullmatch(time)
        if found is None:
            raise NoteError("The checkpoint's last line is not 'time <RFC 3339 UTC>'.")
        try:
            at = datetime.strptime(found.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError as exc:
            raise NoteError(f"The checkpoint's time {found.group(1)!r} is no date.") from exc
        return cls(origin=origin, size=int(size), root=digest, time=at)


def sign(text: str, *, name: str, key: Ed25519PrivateKey) -> str:
    """The signed note of ``text`` (which ends with a newline), signed by ``key`` as
    ``name``."""
    _check_text(text)
    check_key_name(name)
    signature = key.sign(text.encode())
    blob = base64.b64encode(key_id(name, key.public_key()) + signature).decode()
    return f"{text}\n{EM_DASH} {name} {blob}\n"


@dataclass(frozen=True)
class Signature:
    name: str
    key_id: bytes
    signature: bytes


def split(note: str) -> tuple[str, list[Signature]]:
    """A signed note's text and its signature lines, checked for form only."""
    if len(note.encode()) > MAX_NOTE_BYTES:
        raise NoteError(f"The note is longer than {MAX_NOTE_BYTES} bytes.")
    text, separator, block = note.rpartition("\n\n")
    if not separator:
        raise NoteError("The note has no signature block (an empty line, then signatures).")
    text += "\n"
    _check_text(text)
    if not block.endswith("\n"):
        raise NoteError("The note's last signature line does not end with a newline.")
    lines = block[:-1].split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise NoteError(f"The note has more than {MAX_SIGNATURES} signatures.")
    signatures = []
    for line in lines:
        dash, _, rest = line.partition(" ")
        name, _, encoded = rest.partition(" ")
        if dash != EM_DASH or not name or not encoded or " " in encoded:
            raise NoteError(f"{line[:80]!r} is not a signature line ('\u2014 name signature').")
        check_key_name(name)
        try:
            blob = base64.b64decode(encoded, validate=True)
        except binascii.Error as exc:
            raise NoteError(f"The signature of {name} is not base64.") from exc
        if len(blob) < 5:
            raise NoteError(f"The signature of {name} is too short.")
        signatures.append(Signature(name=name, key_id=blob[:4], signature=blob[4:]))
    return text, signatures


def open_note(note: str, *, name: str, keys: list[Ed25519PublicKey]) -> str:
    """The text of ``note`` once a signature by one of ``keys``, named ``name``, verifies;
    signatures of other keys are ignored (a witness's cosignature, say)."""
    text, signatures = split(note)
    wanted = {key_id(name, key): key for key in keys}
    for signature in signatures:
        key = wanted.get(signature.key_id)
        if signature.name != name or key is None:
            continue
        try:
            key.verify(signature.signature, text.encode())
        except InvalidSignature:
            raise NoteError(
                f"The signature of {name} (key id {signature.key_id.hex()}) does not verify."
            ) from None
        return text
    ids = ", ".join(key.hex() for key in wanted) or "none"
    raise NoteError(f"The note has no signature of {name} by a known key (key ids {ids}).")


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise NoteError("A note's text ends with a newline.")
    if any((ord(char) < 0x20 and char != "\n") or ord(char) == 0x7F for char in text):
        raise NoteError("A note's text holds a control character other than newline.")
