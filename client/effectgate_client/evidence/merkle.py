"""RFC 9162 §2.1: the hashes of a Merkle tree and the verification of its proofs.

Written from the RFC for this verifier, sharing no code with the server (the client
distribution cannot import it): a leaf's hash is ``SHA-256(0x00 || entry)``, an interior
node's ``SHA-256(0x01 || left || right)``. ``verify_inclusion`` is §2.1.3.2 and
``verify_consistency`` §2.1.4.2, step for step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

HASH_SIZE = 32


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def verify_inclusion(
    *, index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> bool:
    """Whether ``proof`` proves the leaf hash ``leaf`` at ``index`` in the tree of
    ``size`` leaves whose root hash is ``root`` (RFC 9162 §2.1.3.2)."""
    # 1. leaf_index must be less than tree_size.
    if not 0 <= index < size:
        return False
    # 2. fn = leaf_index, sn = tree_size - 1, r = the leaf hash.
    fn, sn, r = index, size - 1, leaf
    # 3. For each value p in the inclusion path:
    for p in proof:
        # a. If sn is 0, stop: the proof is too long.
        if sn == 0:
            return False
        # b. If LSB(fn) is set or fn equals sn: r = HASH(0x01 || p || r); then, unless
        #    LSB(fn) is set, right-shift fn and sn until LSB(fn) is set or fn is 0.
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        # c. Otherwise r = HASH(0x01 || r || p).
        else:
            r = node_hash(r, p)
        # d. Right-shift fn and sn once.
        fn, sn = fn >> 1, sn >> 1
    # 4. sn must be 0 and r the expected root.
    return sn == 0 and r == root


def verify_consistency(
    *, first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> bool:
    """Whether ``proof`` proves that the tree of ``first`` leaves (root ``first_root``) is
    a prefix of the tree of ``second`` leaves (root ``second_root``) (RFC 9162 §2.1.4.2).
    Equal sizes need an empty proof and equal roots."""
    if not 0 < first <= second:
        return False
    if first == second:
        return not proof and first_root == second_root
    path = list(proof)
    # 1. If the consistency proof is empty, stop and fail.
    if not path:
        return False
    # 2. If first is an exact power of two, prepend first_hash to the path.
    if first & (first - 1) == 0:
        path.insert(0, first_root)
    # 3. fn = first - 1, sn = second - 1.
    fn, sn = first - 1, second - 1
    # 4. While LSB(fn) is set, right-shift both.
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    # 5. fr = sr = the first value of the path.
    fr = sr = path[0]
    # 6. For each subsequent value c:
    for c in path[1:]:
        # a. If sn is 0, stop and fail.
        if sn == 0:
            return False
        # b. If LSB(fn) is set or fn equals sn: fr = HASH(0x01 || c || fr), sr = HASH(0x01
        #    || c || sr); then, unless LSB(fn) is set, right-shift both until LSB(fn) is
        #    set or fn is 0.
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        # c. Otherwise sr = HASH(0x01 || sr || c).
        else:
            sr = node_hash(sr, c)
        # d. Right-shift both once.
        fn, sn = fn >> 1, sn >> 1
    # 7. fr and sr must be the two roots and sn 0.
    return fr == first_root and sr == second_root and sn == 0
