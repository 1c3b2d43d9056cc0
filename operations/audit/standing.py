"""Standing grants follow from their events (the stream ``sgr:<id>``)."""

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from django.db.models import (
    Exists,
    OuterRef,
    Subquery,
    Value,
)
from django.db.models.fields.json import KT
from django.db.models.functions import Concat

from approvals.models import (
    StandingGrant,
    StandingGrantSignature,
)

from ..machine import EventKind
from ..models import (
    Event,
)
from ..services.terms import (
    money_text,
    standing_grant_terms,
)
from .chains import CHUNK
from .rows import Unexplained, _Count, _differences, _events, _first_data


def _signers(grant_ids: list[str]) -> dict[str, list[int]]:
    """The people who signed each of the standing grants ``grant_ids``, sorted."""
    found: dict[str, list[int]] = {}
    signatures = StandingGrantSignature.objects.filter(grant_id__in=grant_ids)
    for grant_id, user_id in signatures.values_list("grant_id", "user_id").order_by(
        "grant_id", "user_id"
    ):
        found.setdefault(grant_id, []).append(user_id)
    return found


STANDING_TERM_COLUMNS = (
    "tool",
    "principal",
    "run_id",
    "pins",
    "max_uses",
    "sum_path",
    "max_sum",
    "expires_at",
    "approvals_required",
)


def _standing_grant_problem(row: dict[str, Any]) -> str | None:
    issued = row["issued"] if isinstance(row["issued"], dict) else None
    if issued is None or not isinstance(issued.get("terms"), dict):
        return "its stream does not start with the standing_grant_issued event that issued it"
    terms = standing_grant_terms(
        SimpleNamespace(**{column: row[column] for column in STANDING_TERM_COLUMNS})
    )
    differs = _differences(terms, issued["terms"], "its standing_grant_issued event says")
    if differs:
        return differs
    if row["status"] != row["last_to"]:
        return f"its status is {row['status']}, but its last event left it {row['last_to']}"
    if row["uses"] != row["used_events"]:
        return (
            f"it counts {row['uses']} uses, but {row['used_events']} standing_grant_used "
            "events record one"
        )
    if row["sum_path"] and money_text(row["sum_used"]) != (row["last_sum"] or "0.000000"):
        return (
            f"its sum_used is {money_text(row['sum_used'])}, but its last standing_grant_used "
            f"event left it {row['last_sum']}"
        )
    if row["signature_rows"] != row["signing_events"]:
        return (
            f"it has {row['signature_rows']} signatures, but {row['signing_events']} "
            "standing_grant_issued and standing_grant_signed events"
        )
    if row["activated"] and row["signature_rows"] < row["approvals_required"]:
        return (
            f"it was activated on {row['signature_rows']} signatures, but was issued "
            f"requiring {row['approvals_required']}"
        )
    return None


def _standing_grants() -> Iterator[Unexplained]:
    """Every standing grant's stream starts with the ``standing_grant_issued`` event
    whose terms are its columns (the family, the limits, the expiry, the quorum); its
    status is the one its last event left; it counts one use per
    ``standing_grant_used`` event, and the sum the last one left; it has one signature
    per ``standing_grant_issued`` and ``standing_grant_signed`` event, and, once
    activated, at least as many as its quorum."""
    stream = Concat(Value("sgr:"), OuterRef("pk"))
    events = Event.objects.filter(stream=stream)
    used = _events(EventKind.STANDING_GRANT_USED, stream=stream)
    rows = StandingGrant.objects.annotate(
        issued=_first_data(events.filter(seq=1, kind=EventKind.STANDING_GRANT_ISSUED)),
        last_to=Subquery(events.order_by("-seq").values("to_status")[:1]),
        used_events=_Count(used.values("pk")),
        last_sum=Subquery(used.order_by("-seq").values(text=KT("data__sum_used"))[:1]),
        signing_events=_Count(
            _events(
                (EventKind.STANDING_GRANT_ISSUED, EventKind.STANDING_GRANT_SIGNED), stream=stream
            ).values("pk")
        ),
        activated=Exists(_events(EventKind.STANDING_GRANT_ACTIVATED, stream=stream)),
        signature_rows=_Count(
            StandingGrantSignature.objects.filter(grant=OuterRef("pk")).values("pk")
        ),
    ).values(
        "pk",
        "status",
        "uses",
        "sum_used",
        "issued",
        "last_to",
        "used_events",
        "last_sum",
        "signing_events",
        "activated",
        "signature_rows",
        *STANDING_TERM_COLUMNS,
    )
    for row in rows.order_by("pk").iterator(chunk_size=CHUNK):
        problem = _standing_grant_problem(row)
        if problem:
            yield Unexplained("approvals.StandingGrant", row["pk"], problem)
