"""The Merkle tree of RFC 9162 §2.1 over the ledger's leaves (pure: no Django).

A leaf's hash is ``SHA-256(0x00 || entry)``, an interior node's ``SHA-256(0x01 || left
|| right)``, and the tree of ``n`` leaves splits at ``k``, the largest power of two
smaller than ``n`` (§2.1.1). The empty tree's hash is ``SHA-256("")``.

The log keeps the hash of every complete perfect subtree as leaves arrive: a node is
``(level, index)``, the subtree of the ``2**level`` leaves from ``index << level``.
Every range a proof names starts at a multiple of the smallest power of two at least
its length, so its hash is the right fold of at most ``log2(n) + 1`` stored nodes
(``range_nodes``): a root or a proof reads O(log n) stored hashes, never the leaves.

- ``inclusion_ranges`` and ``consistency_ranges`` are PATH (§2.1.3.1) and PROOF
  (§2.1.4.1) as the ranges whose hashes the proof lists, in the RFC's order;
- ``verify_inclusion`` and ``verify_consistency`` are the verification algorithms of
  §2.1.3.2 and §2.1.4.2, word for word;
- ``TreeBuilder`` appends leaves to a tree it knows only by its right edge (the
  ``frontier``), and says which nodes each new leaf completes.
"""

import hashlib
from collections.abc import Callable, Iterable, Sequence

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()

# (level, index): the perfect subtree of 2**level leaves that starts at leaf index << level.
Node = tuple[int, int]
# [lo, hi): the leaves from lo up to hi, excluded.
Range = tuple[int, int]


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def split_point(n: int) -> int:
    """The largest power of two smaller than ``n`` (``n`` > 1): where MTH splits."""
    if n < 2:
        raise ValueError(f"A tree of {n} leaves does not split.")
    return 1 << ((n - 1).bit_length() - 1)


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def range_nodes(lo: int, hi: int) -> list[Node]:
    """The perfect subtrees, left to right, whose hashes fold into MTH(D[lo:hi]).

    The range must start at a multiple of the smallest power of two at least its length
    (the whole tree, and every range PATH and PROOF name, do): then MTH splits it into an
    aligned perfect subtree of ``k`` leaves and a rest that is aligned again, so the
    subtrees are those of the binary digits of ``hi - lo``, largest first.
    """
    n = hi - lo
    if lo < 0 or n < 1:
        raise ValueError(f"[{lo}, {hi}) holds no leaf.")
    if lo % (1 << (n - 1).bit_length()):
        raise ValueError(f"[{lo}, {hi}) is not a range of the tree's recursion.")
    nodes = []
    while lo < hi:
        n = hi - lo
        size = n if _is_power_of_two(n) else split_point(n)
        level = size.bit_length() - 1
        nodes.append((level, lo >> level))
        lo += size
    return nodes


def fold(hashes: Sequence[bytes]) -> bytes:
    """The hash of a range from its ``range_nodes`` hashes: H(h1, H(h2, ... H(hk-1, hk)))."""
    if not hashes:
        raise ValueError("No hash to fold.")
    folded = hashes[-1]
    for left in reversed(hashes[:-1]):
        folded = node_hash(left, folded)
    return folded


def range_hash(lo: int, hi: int, node: Callable[[Node], bytes]) -> bytes:
    """MTH(D[lo:hi]) from the stored hashes ``node`` gives."""
    return fold([node(key) for key in range_nodes(lo, hi)])


def root_nodes(size: int) -> list[Node]:
    """The stored nodes of the root of a tree of ``size`` leaves (none when empty)."""
    return range_nodes(0, size) if size else []


def inclusion_ranges(index: int, size: int) -> list[Range]:
    """PATH(index, D[0:size]) (RFC 9162 §2.1.3.1): the ranges whose hashes make the
    inclusion proof of the leaf ``index``, from the leaf's sibling up to the root's
    other child."""
    if not 0 <= index < size:
        raise ValueError(f"Leaf {index} is not in a tree of {size} leaves.")
    ranges = []
    lo, hi, m = 0, size, index
    while hi - lo > 1:
        k = split_point(hi - lo)
        if m < k:
            ranges.append((lo + k, hi))
            hi = lo + k
        else:
            ranges.append((lo, lo + k))
            lo, m = lo + k, m - k
    return ranges[::-1]


def consistency_ranges(first: int, second: int) -> list[Range]:
    """PROOF(first, D[0:second]) (RFC 9162 §2.1.4.1, SUBPROOF with b = true): the ranges
    whose hashes prove that the tree of ``first`` leaves is a prefix of the tree of
    ``second``. Empty when the sizes are equal."""
    if not 1 <= first <= second:
        raise ValueError(f"No consistency proof from {first} to {second} leaves.")
    ranges = []
    lo, hi, m, whole = 0, second, first, True
    while m != hi - lo:
        k = split_point(hi - lo)
        if m <= k:
            ranges.append((lo + k, hi))
            hi = lo + k
        else:
            ranges.append((lo, lo + k))
            lo, m, whole = lo + k, m - k, False
    if not whole:
        ranges.append((lo, hi))
    return ranges[::-1]


def verify_inclusion(
    *, index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes
) -> bool:
    """RFC 9162 §2.1.3.2: whether ``proof`` proves the leaf hash ``leaf`` at ``index`` in
    the tree of ``size`` leaves whose hash is ``root``."""
    if not 0 <= index < size:
        return False
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(
    *, first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 §2.1.4.2: whether ``proof`` proves that the tree of ``first`` leaves
    (hash ``first_root``) is a prefix of the tree of ``second`` (hash ``second_root``).

    Equal sizes need an empty proof and equal roots, and any tree is consistent with the
    empty tree (``first`` 0, empty proof), as the RFC's algorithm leaves to the caller.
    """
    if not 0 <= first <= second:
        return False
    if first == second:
        return not proof and first_root == second_root
    if first == 0:
        return not proof
    path = list(proof)
    if not path:
        return False
    if _is_power_of_two(first):
        path.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return fr == first_root and sr == second_root and sn == 0


class TreeBuilder:
    """A tree known by its right edge, growing one leaf at a time.

    ``frontier`` holds the hashes of ``root_nodes(size)``, the complete subtrees on the
    right edge (at most one per level). ``append`` adds a leaf and returns every node it
    completes, the leaf itself first (level 0): what the log stores as it grows.
    """

    def __init__(self, size: int = 0, frontier: dict[Node, bytes] | None = None) -> None:
        self.size = size
        self.frontier = dict(frontier or {})
        missing = set(root_nodes(size)) - set(self.frontier)
        if missing:
            raise ValueError(f"The frontier of a tree of {size} leaves lacks {sorted(missing)}.")

    def append(self, leaf: bytes) -> list[tuple[Node, bytes]]:
        index = self.size
        completed = [((0, index), leaf)]
        level, position, value = 0, index, leaf
        while position & 1:
            value = node_hash(self.frontier.pop((level, position - 1)), value)
            level, position = level + 1, position >> 1
            completed.append(((level, position), value))
        self.frontier[(level, position)] = value
        self.size += 1
        return completed

    def extend(self, leaves: Iterable[bytes]) -> list[tuple[Node, bytes]]:
        return [node for leaf in leaves for node in self.append(leaf)]

    def root(self) -> bytes:
        if not self.size:
            return EMPTY_ROOT
        return fold([self.frontier[key] for key in root_nodes(self.size)])
