"""The MACs of events written before the event key was set (``audit mac --backfill``).

The one write of the event table besides inserting and archiving: ``mac`` goes from ""
to the MAC under the current key, and nothing else changes (the event's hash, which the
MAC covers, is already in the row and its chain). Only the database's owner may run
it: the runtime role holds no UPDATE on the table (``effectgate db roles``), and the
append-only trigger lets it through only while it is ignored, here. A MAC says "this
event was in the ledger when the key's holder vouched for it": the command verifies the
chains first, and docs/deployment.md says to compare them with an anchor kept before.
"""

from django.conf import settings
from django.db import transaction
from django.db.models import Case, CharField, Value, When

from ..eventmac import event_mac
from ..models import Event
from ..triggers import TRIGGER_NAME, ignored

CHUNK = 500


def event_macs_missing() -> int:
    return Event.objects.filter(mac="").count()


def event_macs_backfill(*, up_to_id: int, chunk: int = CHUNK) -> int:
    """Write the MAC of each event with none and an id up to ``up_to_id`` (the last one
    the caller verified), ``chunk`` events per transaction; how many were written."""
    if not settings.AUDIT_EVENT_KEY:
        raise ValueError("no event key: set AUDIT_EVENT_KEY or AUDIT_EVENT_KEY_FILE")
    written, after = 0, 0
    while True:
        with transaction.atomic(), ignored(f"operations.Event:{TRIGGER_NAME}"):
            rows = list(
                Event.objects.filter(mac="", id__gt=after, id__lte=up_to_id)
                .order_by("id")
                .values_list("id", "hash")[:chunk]
            )
            if not rows:
                return written
            macs = Case(
                *(When(pk=pk, then=Value(event_mac(digest))) for pk, digest in rows),
                output_field=CharField(),
            )
            written += Event.objects.filter(pk__in=[pk for pk, _ in rows], mac="").update(mac=macs)
        after = rows[-1][0]
