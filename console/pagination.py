"""Keyset pagination for the console's long lists.

Lists are ordered by a unique, creation-ordered key (the prefixed ids and event ids
sort in creation order), newest first. A page is asked for with ``?before=<key>``
(older items) or ``?after=<key>`` (newer items): the database seeks in the key's
index, so page 1000 costs what page 1 costs, with no OFFSET and no count of the table.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet
from django.http import HttpRequest

PAGE_SIZE = 50


@dataclass(frozen=True)
class KeysetPage:
    items: list[Any]
    newer: Any = None  # key for ?after=: the page before this one, if any
    older: Any = None  # key for ?before=: the page after this one, if any
    first: bool = True  # this is the newest page

    @property
    def has_other_pages(self) -> bool:
        return self.newer is not None or self.older is not None or not self.first


def _cursor(request: HttpRequest, name: str, cast: Callable[[str], Any]) -> Any:
    raw = request.GET.get(name)
    if not raw:
        return None
    try:
        return cast(raw)
    except ValueError:
        return None


def keyset_page(
    request: HttpRequest,
    queryset: QuerySet[Any],
    *,
    key: str = "id",
    cast: Callable[[str], Any] = str,
    size: int | None = None,
) -> KeysetPage:
    """The page of ``queryset`` (newest first by ``key``) that the request asks for."""
    size = size or PAGE_SIZE
    before = _cursor(request, "before", cast)
    after = _cursor(request, "after", cast)
    if after is not None and before is None:
        rows = list(queryset.filter(**{f"{key}__gt": after}).order_by(key)[: size + 1])
        more_newer = len(rows) > size
        rows = rows[:size]
        rows.reverse()
        if not rows:
            return KeysetPage(items=[], first=False)
        return KeysetPage(
            items=rows,
            newer=getattr(rows[0], key) if more_newer else None,
            older=getattr(rows[-1], key),
            first=not more_newer,
        )
    if before is not None:
        queryset = queryset.filter(**{f"{key}__lt": before})
    rows = list(queryset.order_by(f"-{key}")[: size + 1])
    more_older = len(rows) > size
    rows = rows[:size]
    return KeysetPage(
        items=rows,
        newer=getattr(rows[0], key) if (before is not None and rows) else None,
        older=getattr(rows[-1], key) if more_older else None,
        first=before is None,
    )
