"""Context every console page gets."""

from typing import Any

from django.http import HttpRequest

from operations import access, selectors

# A detail page highlights the list it belongs to in the navigation (nav_link's
# nav_section); a view's own context still wins.
SECTIONS = {
    "console:operation": "console:operations",
    "console:search": "console:operations",
    "console:run": "console:runs",
    "console:tool": "console:tools",
    "console:approval": "console:inbox",
    "console:policy": "console:policies",
}


def search(request: HttpRequest) -> dict[str, Any]:
    """The header search box (base.html shows it when ``search_url`` is set)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    context: dict[str, Any] = {
        "search_url": "console:search",
        "search_placeholder": "Find: a key, id, argument value, principal…",
    }
    # htmx polls ask for fragments, which show no navigation.
    if user.pk is not None and not request.headers.get("HX-Request"):
        context["nav_counts"] = selectors.nav_counts(user=user)
        # The Policies link, for those who may read them (the pages answer 403 otherwise).
        context["may_manage_policies"] = access.may_manage_policies(user)
    match = getattr(request, "resolver_match", None)
    section = SECTIONS.get(match.view_name) if match is not None else None
    if section:
        context["nav_section"] = section
    return context
