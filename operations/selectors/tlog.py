"""Reads of the transparency log: its size, roots and proofs from the stored subtree
hashes (O(log n) rows each, ``tlog.merkle``), its checkpoints, and the events a runner
or a person may ask a proof for."""

from collections.abc import Iterable
from dataclasses import dataclass

from approvals.people import Person

from .. import access
from ..errors import NotFound, NotSealed
from ..models import Checkpoint, Event, LogLeaf, LogNode, Runner
from ..tlog import merkle
from ..tlog.merkle import Node, Range
from .people import events_for_user


def log_last_leaf() -> LogLeaf | None:
    return LogLeaf.objects.order_by("-index").first()


def log_size() -> int:
    last = LogLeaf.objects.order_by("-index").values_list("index", flat=True).first()
    return 0 if last is None else last + 1


def log_node_hashes(nodes: Iterable[Node]) -> dict[Node, bytes]:
    """The stored hashes of ``nodes``: leaves from ``LogLeaf``, the others from
    ``LogNode``; two queries at most. A node the log does not hold is missing."""
    wanted = set(nodes)
    leaves = [index for level, index in wanted if level == 0]
    inner = [(level, index) for level, index in wanted if level > 0]
    found: dict[Node, bytes] = {}
    if leaves:
        for index, value in LogLeaf.objects.filter(index__in=leaves).values_list("index", "hash"):
            found[(0, index)] = bytes(value)
    if inner:
        rows = LogNode.objects.filter(pk__in=inner).values_list("level", "index", "hash")
        for level, index, value in rows:
            found[(level, index)] = bytes(value)
    return found


def log_range_hashes(ranges: list[Range]) -> list[bytes]:
    """MTH of each range, from one read of every stored node they need."""
    needed = {(lo, hi): merkle.range_nodes(lo, hi) for lo, hi in ranges}
    stored = log_node_hashes(node for nodes in needed.values() for node in nodes)
    return [merkle.fold([stored[node] for node in needed[key]]) for key in ranges]


def log_root(size: int) -> bytes:
    if not size:
        return merkle.EMPTY_ROOT
    return log_range_hashes([(0, size)])[0]


def checkpoint_latest() -> Checkpoint | None:
    return Checkpoint.objects.order_by("-size").first()


def checkpoint_get(size: int) -> Checkpoint:
    checkpoint = Checkpoint.objects.filter(size=size).first()
    if checkpoint is None:
        raise NotFound(f"No checkpoint was signed at size {size}.")
    return checkpoint


def checkpoints_in_order() -> Iterable[Checkpoint]:
    return Checkpoint.objects.order_by("size").iterator(chunk_size=500)


def _beyond(name: str, value: int, size: int) -> NotFound:
    """A tree size the log has not reached: there is no such tree (yet) to prove in."""
    return NotFound(
        f"The log holds {size} leaves: there is no tree of {value} ({name}) to prove in yet."
    )


def _default_size() -> int:
    latest = checkpoint_latest()
    if latest is None:
        raise NotFound("No checkpoint is signed yet: give the tree size (size=N) to prove against.")
    return latest.size


@dataclass(frozen=True)
class InclusionProof:
    event: int
    leaf_index: int
    size: int
    hashes: list[bytes]


def inclusion_proof(*, event: Event, size: int | None = None) -> InclusionProof:
    """The proof that ``event``'s leaf is in the tree of ``size`` leaves (at least 1; by
    default the latest checkpoint's)."""
    tree = log_size()
    size = _default_size() if size is None else size
    if size > tree:
        raise _beyond("size", size, tree)
    leaf = LogLeaf.objects.filter(event_id=event.pk).values_list("index", flat=True).first()
    if leaf is None or leaf >= size:
        where = "yet" if leaf is None else f"at size {size}: it is leaf {leaf}"
        raise NotSealed(
            f"Event {event.pk} is not in the log {where}. The sealer appends committed "
            "events within seconds; ask again, or for a larger size."
        )
    hashes = log_range_hashes(merkle.inclusion_ranges(leaf, size))
    return InclusionProof(event=event.pk, leaf_index=leaf, size=size, hashes=hashes)


def consistency_proof(*, first: int, second: int) -> list[bytes]:
    """The proof that the tree of ``first`` leaves (at least 1) is a prefix of the tree of
    ``second``."""
    tree = log_size()
    if second > tree:
        raise _beyond("second", second, tree)
    if first > second:
        raise NotFound(
            f"No consistency proof goes from {first} leaves to {second}: a tree is proved a "
            "prefix of a larger one (first at most second)."
        )
    return log_range_hashes(merkle.consistency_ranges(first, second))


def event_get_for_runner(*, runner: Runner, event_id: int) -> Event:
    event = Event.objects.filter(access.runner_event_filter(runner), pk=event_id).first()
    if event is None:
        raise NotFound(f"No event {event_id}.")
    return event


def event_get_for_user(*, user: Person, event_id: int) -> Event:
    event = events_for_user(user).filter(pk=event_id).first()
    if event is None:
        raise NotFound(f"No event {event_id}.")
    return event
