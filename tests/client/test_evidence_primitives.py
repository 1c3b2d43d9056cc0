"""The verifier's own RFC 9162 and C2SP code (client/effectgate_client/evidence), held to
the RFC's definitions and to what the server writes: every leaf and size pair of trees
up to 40 leaves, every consistency pair, signed notes of the server's signer. Pure: no
database, no server running.

The verifier cannot import the server (the client distribution stands alone); the test
can, and that is what ties the two together.
"""

import ast
import base64
import hashlib
import string
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from effectgate_client.evidence import checks, merkle, notes
from operations.canonical import intent_hash as server_intent_hash
from operations.tlog import leaves as server_leaves
from operations.tlog import merkle as server_merkle
from operations.tlog import notes as server_notes

CLIENT = Path(checks.__file__).parent


def _mth(hashes: list[bytes]) -> bytes:
    """MTH of RFC 9162 §2.1.1, straight from its definition."""
    if len(hashes) == 1:
        return hashes[0]
    k = 1
    while k * 2 < len(hashes):
        k *= 2
    return hashlib.sha256(b"\x01" + _mth(hashes[:k]) + _mth(hashes[k:])).digest()


LEAVES = [merkle.leaf_hash(f"entry {i}".encode()) for i in range(40)]


def _proof(ranges: list[tuple[int, int]]) -> list[bytes]:
    return [_mth(LEAVES[lo:hi]) for lo, hi in ranges]


def test_every_inclusion_proof_the_server_builds_verifies_and_no_other_does():
    for size in range(1, len(LEAVES) + 1):
        root = _mth(LEAVES[:size])
        for index in range(size):
            proof = _proof(server_merkle.inclusion_ranges(index, size))
            leaf = LEAVES[index]
            assert merkle.verify_inclusion(
                index=index, size=size, leaf=leaf, proof=proof, root=root
            )
            assert not merkle.verify_inclusion(
                index=index, size=size, leaf=LEAVES[(index + 1) % 40], proof=proof, root=root
            )
            if size > 1:
                assert not merkle.verify_inclusion(
                    index=(index + 1) % size, size=size, leaf=leaf, proof=proof, root=root
                )
                assert not merkle.verify_inclusion(
                    index=index, size=size, leaf=leaf, proof=proof[:-1], root=root
                )
            assert not merkle.verify_inclusion(
                index=index, size=size, leaf=leaf, proof=[*proof, root], root=root
            )
            for at in range(len(proof)):
                bent = [*proof[:at], bytes([proof[at][0] ^ 1]) + proof[at][1:], *proof[at + 1 :]]
                assert not merkle.verify_inclusion(
                    index=index, size=size, leaf=leaf, proof=bent, root=root
                )


def test_every_consistency_proof_the_server_builds_verifies_and_no_other_does():
    for second in range(1, len(LEAVES) + 1):
        second_root = _mth(LEAVES[:second])
        for first in range(1, second + 1):
            first_root = _mth(LEAVES[:first])
            proof = _proof(server_merkle.consistency_ranges(first, second))
            kwargs = {"first": first, "second": second, "proof": proof}
            assert merkle.verify_consistency(
                first_root=first_root, second_root=second_root, **kwargs
            )
            # Another history of the first tree, or of the second, is not consistent.
            other = _mth([LEAVES[39], *LEAVES[1:first]]) if first > 1 else LEAVES[39]
            assert not merkle.verify_consistency(
                first_root=other, second_root=second_root, **kwargs
            )
            assert not merkle.verify_consistency(
                first_root=first_root, second_root=hashlib.sha256(b"other").digest(), **kwargs
            )
            for at in range(len(proof)):
                bent = [*proof[:at], bytes([proof[at][0] ^ 1]) + proof[at][1:], *proof[at + 1 :]]
                assert not merkle.verify_consistency(
                    first=first,
                    second=second,
                    first_root=first_root,
                    second_root=second_root,
                    proof=bent,
                )


def test_the_leaf_and_the_intent_hash_are_the_servers():
    for stream, seq in (("op_01abc", 1), ("tool:réfund", 12), ("user:7", 9_007_199_254_740_991)):
        digest = hashlib.sha256(stream.encode()).hexdigest()
        server = server_leaves.event_leaf(event=42, hash=digest, seq=seq, stream=stream)
        assert (
            merkle.leaf_hash(checks.entry(event=42, hash=digest, seq=seq, stream=stream)) == server
        )
    arguments = {"amount_cents": 12_000, "payment_id": "pay_é", "nested": [1.5, None, True]}
    assert checks.intent_hash(tool="refund", arguments=arguments, principal="user:ann") == (
        server_intent_hash(tool="refund", arguments=arguments, principal="user:ann")
    )


def _signed(key: Ed25519PrivateKey, origin: str = "example.com/effectgate-audit", size: int = 7):
    body = server_notes.CheckpointBody(
        origin=origin,
        size=size,
        root=hashlib.sha256(b"root").digest(),
        time=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    )
    return server_notes.sign(body.text(), name=origin, key=key), body


def test_a_checkpoint_the_server_signed_opens_with_its_public_key_only():
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    note, body = _signed(key)
    opened = notes.open_checkpoint(note, key=key.public_key(), origin=body.origin)
    assert (opened.origin, opened.size, opened.root, opened.time) == (
        body.origin,
        body.size,
        body.root,
        body.time,
    )
    assert opened.key_id == server_notes.key_id(body.origin, key.public_key())
    with pytest.raises(notes.NoteError, match="no signature of"):
        notes.open_checkpoint(note, key=other.public_key(), origin=body.origin)
    with pytest.raises(notes.NoteError, match="no signature of"):
        notes.open_checkpoint(note, key=key.public_key(), origin="elsewhere.example/log")
    # A witness's cosignature beside the log's is ignored, before it or after it.
    cosigned, _ = _signed(other)
    cosignature = cosigned.rpartition("\n\n")[2]
    text, _, signature = note.rpartition("\n\n")
    for block in (f"{signature}{cosignature}", f"{cosignature}{signature}"):
        assert (
            notes.open_checkpoint(
                f"{text}\n\n{block}", key=key.public_key(), origin=body.origin
            ).size
            == body.size
        )
    # The text changed after signing: refused, whatever line.
    for changed in (note.replace("\n7\n", "\n8\n"), note.replace("time 2026", "time 2027")):
        with pytest.raises(notes.NoteError, match="does not verify"):
            notes.open_checkpoint(changed, key=key.public_key(), origin=body.origin)
    # The signature in another base64 spelling of the same bytes: refused too.
    blob = signature.split(" ")[-1].strip()
    alphabet = string.ascii_uppercase + string.ascii_lowercase + string.digits + "+/"
    data = blob.rstrip("=")
    padding_bit = data[:-1] + alphabet[alphabet.index(data[-1]) ^ 1] + blob[len(data) :]
    assert base64.b64decode(padding_bit) == base64.b64decode(blob)
    with pytest.raises(notes.NoteError, match="canonical"):
        notes.open_checkpoint(
            note.replace(blob, padding_bit), key=key.public_key(), origin=body.origin
        )


def test_the_verifier_imports_nothing_of_the_server():
    """The client distribution ships without the server: the verifier's modules import
    only the standard library, rfc8785, cryptography and each other."""
    allowed = {"__future__", "rfc8785", "cryptography"}
    for path in CLIENT.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    continue
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in allowed or top in sys.stdlib_module_names, (path, name)
