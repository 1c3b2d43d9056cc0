"""What the audit's state checks share: the finding, and reading events beside rows."""

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Any

from django.db.models import (
    IntegerField,
    JSONField,
    QuerySet,
    Subquery,
)
from django.db.models.fields.json import KT

from ..machine import EventKind
from ..models import (
    Event,
)
from .chains import CHUNK


@dataclass(frozen=True)
class Unexplained:
    """A state row that no event explains: which row, and what is missing."""

    model: str
    pk: str
    problem: str

    def describe(self) -> str:
        return f"{self.model} {self.pk}: {self.problem}"


class _Count(Subquery):
    """The number of rows of a subquery, as a column of the outer query."""

    template = "(SELECT COUNT(*) FROM (%(subquery)s) _counted)"
    output_field = IntegerField()


def _events(kinds: EventKind | tuple[EventKind, ...], *, stream: Any, **data: Any) -> QuerySet:
    """Events of ``kinds`` in ``stream`` whose data holds each of ``data`` (compared as
    text, the form of the ids the services write there)."""
    queryset = Event.objects.filter(
        stream=stream, kind__in=(kinds,) if isinstance(kinds, str) else kinds
    )
    for key, value in data.items():
        queryset = queryset.alias(**{f"data_{key}": KT(f"data__{key}")}).filter(
            **{f"data_{key}": value}
        )
    return queryset


def _first_data(queryset: QuerySet) -> Subquery:
    return Subquery(queryset.values("data")[:1], output_field=JSONField())


def _same_time(recorded: Any, value: datetime | None) -> bool:
    """Whether an event's timestamp (RFC 3339 text in its data) is ``value``."""
    if not isinstance(recorded, str) or value is None:
        return recorded is None and value is None
    try:
        return datetime.fromisoformat(recorded) == value
    except ValueError:
        return False


def _shown(value: Any) -> str:
    """A value of a row or of an event's data in a problem's sentence, as JSON."""
    return json.dumps(value, sort_keys=True, default=str)


def _batches(rows: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    iterator = iter(rows)
    while batch := list(islice(iterator, CHUNK)):
        yield batch


def _differences(mine: dict[str, Any], theirs: dict[str, Any], source: str) -> str | None:
    """Each column of ``mine`` (a row's terms) that ``theirs`` (a record) holds otherwise."""
    differ = [
        f"its {key} is {_shown(value)}, but {source} {_shown(theirs[key])}"
        for key, value in mine.items()
        if key in theirs and theirs[key] != value
    ]
    return "; ".join(differ) or None
