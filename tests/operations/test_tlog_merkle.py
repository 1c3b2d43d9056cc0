"""The log's Merkle tree against RFC 9162's own definitions (no database).

A naive reference below computes MTH, PATH and PROOF straight from the RFC's recursive
definitions over a list of leaves. The log computes them from stored perfect subtrees
(``merkle.range_nodes``) as a tree grows by appending (``merkle.TreeBuilder``); both must
agree for random trees of every size from 1 to 70, every leaf and every pair of sizes,
and the RFC's verification algorithms must accept exactly the right proofs. The fixed
vectors are the RFC 6962 test data that the certificate-transparency implementations
share.
"""

import hashlib
import random

import pytest

from operations.canonical import canonical_json
from operations.tlog import leaves, merkle
from operations.tlog.merkle import (
    TreeBuilder,
    consistency_ranges,
    inclusion_ranges,
    range_hash,
    verify_consistency,
    verify_inclusion,
)

# --- the reference: RFC 9162 §2.1.1, §2.1.3.1, §2.1.4.1, as written -----------------------


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _k(n: int) -> int:
    """The largest power of two smaller than n."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


class Reference:
    """MTH, PATH and PROOF of the RFC over ``entries``, each D[lo:hi] a slice of them
    (MTH remembered per slice, so that every pair of sizes stays quick to check)."""

    def __init__(self, entries: list[bytes]) -> None:
        self.entries = entries
        self._mth: dict[tuple[int, int], bytes] = {}

    def mth(self, lo: int, hi: int) -> bytes:
        if (lo, hi) not in self._mth:
            n = hi - lo
            if n == 0:
                value = _h(b"")
            elif n == 1:
                value = _h(b"\x00" + self.entries[lo])
            else:
                k = _k(n)
                value = _h(b"\x01" + self.mth(lo, lo + k) + self.mth(lo + k, hi))
            self._mth[(lo, hi)] = value
        return self._mth[(lo, hi)]

    def path(self, m: int, lo: int, hi: int) -> list[bytes]:
        n = hi - lo
        if n == 1:
            return []
        k = _k(n)
        if m < k:
            return [*self.path(m, lo, lo + k), self.mth(lo + k, hi)]
        return [*self.path(m - k, lo + k, hi), self.mth(lo, lo + k)]

    def subproof(self, m: int, lo: int, hi: int, whole: bool) -> list[bytes]:
        n = hi - lo
        if m == n:
            return [] if whole else [self.mth(lo, hi)]
        k = _k(n)
        if m <= k:
            return [*self.subproof(m, lo, lo + k, whole), self.mth(lo + k, hi)]
        return [*self.subproof(m - k, lo + k, hi, False), self.mth(lo, lo + k)]

    def proof(self, m: int, n: int) -> list[bytes]:
        return self.subproof(m, 0, n, True)


def mth(entries: list[bytes]) -> bytes:
    return Reference(entries).mth(0, len(entries))


# --- the log's way: a tree grown leaf by leaf, read from its stored subtrees -------------


def _grown(entries: list[bytes]) -> tuple[TreeBuilder, dict]:
    builder = TreeBuilder()
    stored: dict = {}
    for entry in entries:
        stored.update(builder.append(merkle.leaf_hash(entry)))
    return builder, stored


def _hashes(ranges, stored) -> list[bytes]:
    return [range_hash(lo, hi, stored.__getitem__) for lo, hi in ranges]


SIZES = range(1, 71)


@pytest.mark.parametrize("size", SIZES)
def test_root_every_leaf_and_every_smaller_size_of_a_random_tree(size):
    rng = random.Random(size)
    entries = [rng.randbytes(rng.randrange(0, 40)) for _ in range(size)]
    reference = Reference(entries)
    builder, stored = _grown(entries)
    # One stored hash per complete perfect subtree: 2n - popcount(n) of them.
    assert len(stored) == 2 * size - bin(size).count("1")
    root = reference.mth(0, size)
    assert builder.root() == range_hash(0, size, stored.__getitem__) == root
    for m in range(size):
        served = _hashes(inclusion_ranges(m, size), stored)
        assert served == reference.path(m, 0, size), m
        leaf = merkle.leaf_hash(entries[m])
        assert verify_inclusion(index=m, size=size, leaf=leaf, proof=served, root=root)
    for m in range(1, size + 1):
        served = _hashes(consistency_ranges(m, size), stored)
        assert served == reference.proof(m, size), m
        first = reference.mth(0, m)
        assert verify_consistency(
            first=m, second=size, first_root=first, second_root=root, proof=served
        )


def test_every_pair_of_sizes_up_to_70():
    """Every prefix of one random tree of 70 leaves: each root, each leaf's proof at
    each size, and each pair of sizes' consistency proof, from one stored tree."""
    rng = random.Random(70_70)
    entries = [rng.randbytes(rng.randrange(0, 40)) for _ in range(70)]
    reference = Reference(entries)
    _, stored = _grown(entries)
    for n in range(1, 71):
        root = reference.mth(0, n)
        assert range_hash(0, n, stored.__getitem__) == root
        for m in range(n):
            served = _hashes(inclusion_ranges(m, n), stored)
            assert served == reference.path(m, 0, n), (m, n)
            leaf = merkle.leaf_hash(entries[m])
            assert verify_inclusion(index=m, size=n, leaf=leaf, proof=served, root=root)
        for m in range(1, n + 1):
            served = _hashes(consistency_ranges(m, n), stored)
            assert served == reference.proof(m, n), (m, n)
            assert verify_consistency(
                first=m, second=n, first_root=reference.mth(0, m), second_root=root, proof=served
            )


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 31, 32, 33, 70])
def test_verification_refuses_every_wrong_proof(size):
    rng = random.Random(1000 + size)
    entries = [rng.randbytes(8) for _ in range(size)]
    _, stored = _grown(entries)
    root = mth(entries)
    bogus = _h(b"bogus")
    for m in range(size):
        leaf = merkle.leaf_hash(entries[m])
        good = _hashes(inclusion_ranges(m, size), stored)
        wrong = [
            dict(index=m, size=size, leaf=bogus, proof=good, root=root),
            dict(index=m, size=size, leaf=leaf, proof=good, root=bogus),
            dict(index=m, size=size, leaf=leaf, proof=[*good, bogus], root=root),
            dict(index=size, size=size, leaf=leaf, proof=good, root=root),
        ]
        if good:
            wrong.append(dict(index=m, size=size, leaf=leaf, proof=good[:-1], root=root))
            wrong.append(dict(index=m, size=size, leaf=leaf, proof=[bogus, *good[1:]], root=root))
        if size > 1:
            wrong.append(dict(index=(m + 1) % size, size=size, leaf=leaf, proof=good, root=root))
        for case in wrong:
            assert not verify_inclusion(**case), case
    for m in range(1, size):
        good = _hashes(consistency_ranges(m, size), stored)
        first = mth(entries[:m])
        assert verify_consistency(
            first=m, second=size, first_root=first, second_root=root, proof=good
        )
        for case in (
            dict(first=m, second=size, first_root=bogus, second_root=root, proof=good),
            dict(first=m, second=size, first_root=first, second_root=bogus, proof=good),
            dict(first=m, second=size, first_root=first, second_root=root, proof=good[:-1]),
            dict(first=m, second=size, first_root=first, second_root=root, proof=[*good, bogus]),
            dict(first=m, second=size, first_root=first, second_root=root, proof=[]),
        ):
            assert not verify_consistency(**case), (m, size)


def test_equal_sizes_and_the_empty_tree():
    root = mth([b"a", b"b"])
    assert consistency_ranges(2, 2) == []
    assert verify_consistency(first=2, second=2, first_root=root, second_root=root, proof=[])
    assert not verify_consistency(
        first=2, second=2, first_root=root, second_root=_h(b"x"), proof=[]
    )
    assert not verify_consistency(
        first=2, second=2, first_root=root, second_root=root, proof=[root]
    )
    assert verify_consistency(
        first=0, second=2, first_root=merkle.EMPTY_ROOT, second_root=root, proof=[]
    )
    assert TreeBuilder().root() == merkle.EMPTY_ROOT == _h(b"")
    with pytest.raises(ValueError, match="not in a tree of 0 leaves"):
        inclusion_ranges(0, 0)
    with pytest.raises(ValueError, match="No consistency proof"):
        consistency_ranges(3, 2)
    with pytest.raises(ValueError, match="not a range of the tree's recursion"):
        merkle.range_nodes(1, 3)


def test_a_root_reads_one_stored_hash_per_binary_digit_of_the_size():
    assert merkle.root_nodes(70) == [(6, 0), (2, 16), (1, 34)]
    assert merkle.root_nodes(64) == [(6, 0)]
    for size in (1, 1000, 10**6, 2**40 + 12345):
        assert len(merkle.root_nodes(size)) == bin(size).count("1")


def test_a_builder_resumes_from_the_frontier_alone():
    entries = [bytes([n]) for n in range(50)]
    whole, stored = _grown(entries)
    part, _ = _grown(entries[:37])
    resumed = TreeBuilder(37, {key: stored[key] for key in merkle.root_nodes(37)})
    assert resumed.frontier == part.frontier
    for entry in entries[37:]:
        resumed.append(merkle.leaf_hash(entry))
    assert resumed.root() == whole.root() == mth(entries)
    with pytest.raises(ValueError, match="lacks"):
        TreeBuilder(37, {})


# --- RFC 6962 test vectors (shared by the certificate-transparency implementations) ------

LEAVES = [
    bytes.fromhex(x)
    for x in (
        *("", "00", "10", "2021", "3031", "40414243", "5051525354555657"),
        "606162636465666768696a6b6c6d6e6f",
    )
]
ROOTS = [
    bytes.fromhex(x)
    for x in (
        "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
        "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
        "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
        "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
        "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
        "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
    )
]


def test_the_rfc_6962_vectors():
    _, stored = _grown(LEAVES)
    for size in range(1, 9):
        assert range_hash(0, size, stored.__getitem__) == ROOTS[size - 1]
    inclusion = [
        bytes.fromhex(x)
        for x in (
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        )
    ]
    assert _hashes(inclusion_ranges(5, 8), stored) == inclusion
    leaf = merkle.leaf_hash(LEAVES[5])
    assert verify_inclusion(index=5, size=8, leaf=leaf, proof=inclusion, root=ROOTS[7])
    assert not verify_inclusion(index=4, size=8, leaf=leaf, proof=inclusion, root=ROOTS[7])
    six_to_eight = [
        bytes.fromhex(x)
        for x in (
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        )
    ]
    assert _hashes(consistency_ranges(6, 8), stored) == six_to_eight
    assert verify_consistency(
        first=6, second=8, first_root=ROOTS[5], second_root=ROOTS[7], proof=six_to_eight
    )
    two_to_five = [
        bytes.fromhex("5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e"),
        bytes.fromhex("bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"),
    ]
    assert _hashes(consistency_ranges(2, 5), stored) == two_to_five
    assert verify_consistency(
        first=2, second=5, first_root=ROOTS[1], second_root=ROOTS[4], proof=two_to_five
    )


# --- the leaf's entry ------------------------------------------------------------------


def test_the_leaf_entry_is_rfc_8785_canonical_json_for_any_stream():
    rng = random.Random(8785)
    alphabet = [chr(c) for c in range(0x00, 0x80)] + ["é", "\u2028", "\u2029", "\U0001f600", "\x7f"]
    cases = [
        (1, "0" * 64, 1, "op_abc"),
        (2**53 - 1, "ab" * 32, 2**53 - 1, 'a"b\\c\n\t\b\f\r\x00\x1f'),
    ]
    for _ in range(500):
        stream = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 30)))
        cases.append(
            (rng.randrange(0, 2**53), rng.randbytes(32).hex(), rng.randrange(1, 10**6), stream)
        )
    for event, digest, seq, stream in cases:
        general = canonical_json({"event": event, "hash": digest, "seq": seq, "stream": stream})
        assert leaves.entry(event=event, hash=digest, seq=seq, stream=stream) == general, stream
    # Beyond the integers every JSON reader holds exactly, both refuse alike.
    with pytest.raises(ValueError, match="exceeds safe integer domain"):
        canonical_json({"event": 2**53, "hash": "x", "seq": 1, "stream": "s"})
    with pytest.raises(ValueError, match="exceeds safe integer domain"):
        leaves.entry(event=2**53, hash="x", seq=1, stream="s")
