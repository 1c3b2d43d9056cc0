"""Context every console page gets."""

from typing import Any

from django.http import HttpRequest


def search(request: HttpRequest) -> dict[str, Any]:
    """The header search box (base.html shows it when ``search_url`` is set)."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {
        "search_url": "console:search",
        "search_placeholder": "Find an operation: id, key, call id, reference",
    }
