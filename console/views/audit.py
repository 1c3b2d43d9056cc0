"""The audit log: every event of every stream a person may read, filtered, paged by
key, and exported as CSV or JSON lines without loading the export into memory."""

import csv
import json
from collections.abc import Iterator
from typing import Any

from django.contrib.auth.decorators import login_required
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from operations import selectors
from operations.machine import EventKind

from ..middleware import AuthenticatedHttpRequest
from ..pagination import keyset_page
from .common import datetime_param, text_param

# Suggestions for the action filter: every kind of event the ledger writes; any text can
# be typed.
KNOWN_KINDS = list(EventKind)

EXPORT_FIELDS = [
    "id",
    "at",
    "stream",
    "seq",
    "kind",
    "actor",
    "tool_name",
    "operation_id",
    "run_id",
    "from_status",
    "to_status",
    "data",
    "prev_hash",
    "hash",
]


def _filters(request: HttpRequest) -> dict[str, Any]:
    return {
        "actor": text_param(request, "actor"),
        "kind": text_param(request, "kind", 40),
        "tool": text_param(request, "tool", 100),
        "since": datetime_param(request, "since"),
        "until": datetime_param(request, "until"),
    }


@require_GET
@login_required
def audit(request: AuthenticatedHttpRequest) -> HttpResponse:
    filters = _filters(request)
    queryset = selectors.audit_events(user=request.user, **filters).select_related(
        "actor_user", "actor_runner"
    )
    context = {
        "page": keyset_page(request, queryset, cast=int),
        "filters": filters,
        "raw": {name: request.GET.get(name, "") for name in ("since", "until")},
        "kinds": KNOWN_KINDS,
        "tools": selectors.tools_visible_to_user(request.user).order_by("name"),
    }
    return render(request, "console/audit.html", context)


class _Echo:
    """A file-like object whose write() hands the line back (csv.writer into a stream)."""

    def write(self, value: str) -> str:
        return value


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    """A CSV cell that a spreadsheet will not run as a formula (runner-written text)."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def _records(queryset) -> Iterator[dict[str, Any]]:
    # values() and iterator(): plain rows fetched in chunks (a server-side cursor on
    # PostgreSQL), so memory stays flat however long the export is.
    for row in queryset.values(*EXPORT_FIELDS).iterator(chunk_size=2000):
        row["at"] = row["at"].isoformat().replace("+00:00", "Z")
        yield row


def _csv_lines(queryset) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(EXPORT_FIELDS)
    for row in _records(queryset):
        row["data"] = json.dumps(row["data"], sort_keys=True, ensure_ascii=False)
        yield writer.writerow([_cell(row[name]) for name in EXPORT_FIELDS])


def _json_lines(queryset) -> Iterator[str]:
    for row in _records(queryset):
        yield json.dumps(row, cls=DjangoJSONEncoder, ensure_ascii=False) + "\n"


@require_GET
@login_required
def audit_export(request: AuthenticatedHttpRequest, fmt: str) -> StreamingHttpResponse:
    if fmt not in {"csv", "jsonl"}:
        raise Http404("Export as csv or jsonl.")
    # Oldest first, as a log reads; the same filters as the page.
    queryset = selectors.audit_events(user=request.user, **_filters(request)).order_by("id")
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    if fmt == "csv":
        response = StreamingHttpResponse(_csv_lines(queryset), content_type="text/csv")
    else:
        response = StreamingHttpResponse(
            _json_lines(queryset), content_type="application/jsonl; charset=utf-8"
        )
    response["Content-Disposition"] = f'attachment; filename="effectgate-audit-{stamp}.{fmt}"'
    response["Cache-Control"] = "no-store"
    return response
