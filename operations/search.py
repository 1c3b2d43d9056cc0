"""Substring search over what people know an operation by (issue: "search that finds").

One text per operation, the haystack: its id, operation key, call id, downstream
reference, principal, idempotency key and frozen arguments (as JSON text, so argument
values are found; sensitive ones are digests), separated by line breaks, which a search
box cannot hold. On PostgreSQL a trigram GIN index over the upper-cased haystack
(migration 0010, ``pg_trgm``) answers ``LIKE '%...%'`` without reading the table; other
databases scan. Queries shorter than three characters match only exactly (a trigram
needs three).
"""

from django.db import connection
from django.db.models import Q, QuerySet, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Cast

from .models import Operation

MIN_SUBSTRING = 3
# The indexed expression: the query below must use it verbatim for the index to serve.
HAYSTACK_SQL = (
    "UPPER(id || E'\\n' || operation_key || E'\\n' || call_id || E'\\n' || downstream_id "
    "|| E'\\n' || principal || E'\\n' || idempotency_key || E'\\n' || (arguments)::text)"
)
FIELDS = ("id", "operation_key", "call_id", "downstream_id", "principal", "idempotency_key")


def _like_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def substring_filter(queryset: QuerySet[Operation], text: str) -> QuerySet[Operation]:
    """Operations of ``queryset`` whose haystack holds ``text``, case-insensitively."""
    if connection.vendor == "postgresql":
        # A constant statement; the person's text is a bound parameter.
        matching = RawSQL(  # noqa: S611
            f"SELECT id FROM operations_operation WHERE {HAYSTACK_SQL} LIKE UPPER(%s)",  # noqa: S608
            [f"%{_like_escape(text)}%"],
        )
        return queryset.filter(pk__in=matching)
    condition = Q()
    for field in FIELDS:
        condition |= Q(**{f"{field}__icontains": text})
    return queryset.alias(arguments_text=Cast("arguments", TextField())).filter(
        condition | Q(arguments_text__icontains=text)
    )
