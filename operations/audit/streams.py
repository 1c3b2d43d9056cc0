"""Runs and tools follow from the events of their streams."""

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from django.db.models import (
    OuterRef,
    Q,
    Subquery,
)

from ..canonical import sha256_hex
from ..machine import EventKind
from ..models import (
    Event,
    Run,
    Tool,
    ToolVersion,
)
from ..services.terms import (
    RUN_BUDGET_COLUMNS,
    run_budgets,
    run_terms,
)
from .chains import CHUNK
from .rows import (
    Unexplained,
    _differences,
    _first_data,
    _shown,
)


def _created_with(row: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The budgets a run was created with, and what says so: its ``run_created``
    event's ``terms`` (``services.terms.run_terms``), or for an event written before
    they were recorded there, the columns its ``budgets`` (as the runner sent them) set
    at the event's time (``services.terms.run_budgets``)."""
    created = row["created"]
    if isinstance(created.get("terms"), dict):
        return created["terms"], "its run_created event opened it with"
    budgets = created.get("budgets")
    try:
        derived = run_terms(SimpleNamespace(**run_budgets(budgets, now=row["created_event_at"])))
    except (AttributeError, TypeError, ValueError, ArithmeticError):
        # A forged event's budgets that no run could have been created with.
        derived = dict.fromkeys(RUN_BUDGET_COLUMNS, _shown(budgets))
    return derived, "its run_created event's budgets give"


def _runs() -> Iterator[Unexplained]:
    """Every run's stream starts with ``run_created``, written by the run's runner for
    its principal; its budgets are the ones that event opened it with; its status is
    the last ``to``."""
    events = Event.objects.filter(stream=OuterRef("pk"))
    created = events.filter(seq=1, kind=EventKind.RUN_CREATED)
    rows = Run.objects.annotate(
        first_kind=Subquery(events.filter(seq=1).values("kind")[:1]),
        last_to=Subquery(events.order_by("-seq").values("to_status")[:1]),
        created=_first_data(created),
        created_event_at=Subquery(created.values("at")[:1]),
        created_by=Subquery(created.values("actor_runner_id")[:1]),
    ).values(
        "pk",
        "status",
        "runner_id",
        "principal",
        *RUN_BUDGET_COLUMNS,
        "first_kind",
        "last_to",
        "created",
        "created_event_at",
        "created_by",
    )
    for row in rows.order_by("pk").iterator(chunk_size=CHUNK):
        problem = None
        if row["first_kind"] != EventKind.RUN_CREATED or not isinstance(row["created"], dict):
            problem = "its stream does not start with run_created"
        elif row["created_by"] != row["runner_id"]:
            problem = (
                f"its runner_id is {_shown(row['runner_id'])}, but its run_created event "
                f"was written by runner {_shown(row['created_by'])}"
            )
        elif row["created"].get("principal") != row["principal"]:
            problem = (
                f"its principal is {_shown(row['principal'])}, but its run_created event "
                f"says {_shown(row['created'].get('principal'))}"
            )
        elif row["status"] != row["last_to"]:
            problem = f"its status is {row['status']}, but its last event left it {row['last_to']}"
        else:
            mine = run_terms(SimpleNamespace(**{key: row[key] for key in RUN_BUDGET_COLUMNS}))
            problem = _differences(mine, *_created_with(row))
        if problem:
            yield Unexplained("operations.Run", row["pk"], problem)


def _tools() -> Iterator[Unexplained]:
    """Every contract version is the one its ``contract_registered`` event hashed, and
    a tool's active version is the one its last activating event (a registration that
    activated, or a person's activation) named."""
    activating = Q(kind=EventKind.CONTRACT_ACTIVATED) | Q(
        kind=EventKind.CONTRACT_REGISTERED, data__active=True
    )
    for tool in (
        Tool.objects.order_by("pk")
        .values("pk", "active_version__number")
        .iterator(chunk_size=CHUNK)
    ):
        events = Event.objects.filter(stream=f"tool:{tool['pk']}")
        registered = {
            data.get("version"): data.get("contract_hash")
            for data in events.filter(kind=EventKind.CONTRACT_REGISTERED).values_list(
                "data", flat=True
            )
        }
        versions = ToolVersion.objects.filter(tool_id=tool["pk"]).order_by("number")
        for version in versions.values("pk", "number", "contract", "contract_hash").iterator(
            chunk_size=CHUNK
        ):
            try:
                recomputed = sha256_hex(version["contract"])
            except ValueError:  # see _recomputed_intent
                recomputed = version["contract_hash"]
            if registered.get(version["number"]) != version["contract_hash"]:
                problem = "its contract_hash is not the one its contract_registered event holds"
            elif recomputed != version["contract_hash"]:
                problem = "its contract is not the one its contract_hash was computed over"
            else:
                continue
            yield Unexplained(
                "operations.ToolVersion", f"{tool['pk']} v{version['number']}", problem
            )
        last = events.filter(activating).order_by("-seq").values_list("data", flat=True).first()
        named = last.get("version") if last else None
        if named != tool["active_version__number"]:
            yield Unexplained(
                "operations.Tool",
                tool["pk"],
                f"its active version is {tool['active_version__number']}, but its last "
                f"activating event named {named}",
            )
