"""Verifying the audit trail: the hash chains, the ledger state they explain, anchors.

1. ``chains_verify``: every event stream's hash chain, recomputed. Each event stores the
   hash of its stream's previous event (``prev_hash``) and a hash over its own fields
   and that link (``services.event_hash``). Rewriting an event's fields, deleting one,
   inserting one or reordering them breaks the chain at that point. Events are read in
   (stream, seq) order through a database cursor, one chunk at a time, keeping only the
   current stream's last hash: memory stays bounded whatever the size of the table.
   Given the event keys, it also checks each event's MAC (``eventmac``): an event
   written with the database's credentials but without the key has none that holds.
2. ``state_verify``: the rows that decide what may run (decisions, grants, standing
   grants, approval requests, resolutions and their reviews, operations, runs, tools,
   people's policies) follow from the events, down to the columns that are not
   statuses (a quorum, an expiry, an escalation group, a budget), which the event that
   opens the row records (``services.terms``). Every transition writes its event beside
   the row it changes, in the same transaction; a row no event explains was written
   around the services, e.g. by SQL sent with the application's credentials. Each model
   is read in primary-key order, in chunks, with the events it needs looked up by
   correlated subqueries; a policy's few events are replayed in order, one stream at a
   time.
3. ``Anchor``: the chain heads as of a time, as a short string kept outside the
   database. A later pass recomputes the heads as of the same time; a truncated table
   or a rewritten chain no longer gives the same string, while events appended since
   do not change it.

4. ``log_verify``: the transparency log (``tlog``): every checkpoint's signature, its
   root recomputed from the events as they are now, and the consistency between
   consecutive checkpoints. What a witness kept of the checkpoints holds the log to
   them from outside the database.

The management command ``audit`` runs these (``audit verify``, ``audit anchor``).
"""

from .chains import (
    ANCHOR_PREFIX,
    Anchor,
    ChainBreak,
    ChainReport,
    MacFault,
    chains_verify,
    chains_verify_rows,
)
from .state import Unexplained, state_verify
from .tlog import LogFault, LogReport, archived_leaves, log_verify, witnessed_checkpoint

__all__ = [
    "ANCHOR_PREFIX",
    "Anchor",
    "ChainBreak",
    "ChainReport",
    "LogFault",
    "LogReport",
    "MacFault",
    "Unexplained",
    "archived_leaves",
    "chains_verify",
    "chains_verify_rows",
    "log_verify",
    "state_verify",
    "witnessed_checkpoint",
]
