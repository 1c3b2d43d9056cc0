"""A person's saved views: named filters of a console list. Preferences, not ledger
state: they change nothing anyone else sees, so they write no audit event."""

from urllib.parse import parse_qsl, urlencode

from approvals.errors import DecisionRefused
from approvals.people import Person

from .. import errors
from ..models import SavedView

MAX_PER_PERSON = 50
# The list filters a view may keep (anything else in a query string is dropped: a saved
# view never carries a page cursor or a stray parameter).
KEPT = {
    SavedView.ListName.OPERATIONS: ("q", "status", "tool", "run", "principal", "since", "until"),
    SavedView.ListName.RECONCILIATION: (
        "queue",
        "tool",
        "effect_class",
        "run",
        "min_age_m",
        "snoozed",
    ),
}


def clean_query(list_name: str, query: str) -> str:
    kept = KEPT[SavedView.ListName(list_name)]
    pairs = [(k, v.strip()) for k, v in parse_qsl(query, keep_blank_values=False)]
    return urlencode([(k, v) for k, v in pairs if k in kept and v])


def saved_view_save(*, user: Person, list_name: str, name: str, query: str) -> SavedView:
    """Save (or replace, by name) the filters ``query`` of ``list_name`` for ``user``."""
    name = " ".join(name.split())[:80]
    if not name:
        raise errors.InvalidRequest("Give the view a name.")
    if list_name not in SavedView.ListName.values:
        raise errors.InvalidRequest(f"No list named {list_name!r}.")
    query = clean_query(list_name, query)
    if len(query) > SavedView._meta.get_field("query").max_length:  # type: ignore[operator]
        raise errors.InvalidRequest("These filters are too long to save as a view.")
    existing = SavedView.objects.filter(user=user, list_name=list_name, name=name).first()
    if existing is None and SavedView.objects.filter(user=user).count() >= MAX_PER_PERSON:
        raise DecisionRefused(f"You have {MAX_PER_PERSON} saved views; delete one first.")
    view, _ = SavedView.objects.update_or_create(
        user=user, list_name=list_name, name=name, defaults={"query": query}
    )
    return view


def saved_view_delete(*, user: Person, view_id: int) -> None:
    deleted, _ = SavedView.objects.filter(user=user, pk=view_id).delete()
    if not deleted:
        raise errors.NotFound("No such saved view.")
