"""The transparency log's tables (docs/security.md, Audit integrity): its leaves, the
hashes of its complete subtrees and its signed checkpoints. Written only by
``services.seal``; insert-only, like the events (``operations.triggers``).
"""

from django.db import models

from . import Event


class LogLeaf(models.Model):
    """One event, appended to the log at ``index`` (0, 1, 2...) by the sealer.

    The leaf's hash (RFC 9162: SHA-256 of 0x00 and the entry ``tlog.leaves.entry``) is
    kept here; the hashes above it are ``LogNode`` rows. The event is named without a
    foreign-key constraint: archiving removes old events from the ledger while their
    leaves stay in the log, whose roots were signed with them. ``txid`` is the event's
    inserting transaction on PostgreSQL (its hidden ``txid`` column, migration 0019),
    where the sealer resumes from; NULL on SQLite and for events from before the log.
    """

    index = models.BigIntegerField(primary_key=True)
    event = models.OneToOneField(
        Event, on_delete=models.DO_NOTHING, db_constraint=False, related_name="leaf"
    )
    hash = models.BinaryField(max_length=32)
    txid = models.BigIntegerField(null=True)

    def __str__(self) -> str:
        return f"leaf {self.index} (event {self.event_id})"


class LogNode(models.Model):
    """The hash of a complete perfect subtree of the log: the ``2**level`` leaves from
    ``index << level`` (level 1 and up; a leaf's own hash is on its ``LogLeaf``).

    Written as the leaves that complete it arrive, so a root or a proof of any size
    reads at most two rows per level (``tlog.merkle.range_nodes``).
    """

    pk = models.CompositePrimaryKey("level", "index")
    level = models.PositiveSmallIntegerField()
    index = models.BigIntegerField()
    hash = models.BinaryField(max_length=32)

    def __str__(self) -> str:
        return f"node {self.level}/{self.index}"


class Checkpoint(models.Model):
    """A signed statement of the log's size and root hash at a time: ``note`` is the
    C2SP signed note, the columns what it says (``tlog.notes``). One per size."""

    size = models.BigIntegerField(primary_key=True)
    root = models.BinaryField(max_length=32)
    time = models.DateTimeField()
    origin = models.CharField(max_length=255)
    note = models.TextField()

    def __str__(self) -> str:
        return f"checkpoint {self.size}"
