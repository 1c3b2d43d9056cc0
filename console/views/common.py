"""Helpers shared by the console's view modules."""

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.contrib import messages
from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest

from approvals.errors import Refusal
from operations import services
from operations.errors import NotFound
from operations.params import parse_count

from ..middleware import AuthenticatedHttpRequest, HtmxHttpRequest


def found(getter: Callable[..., Any], **kwargs: Any) -> Any:
    """Call an access function; a ``NotFound`` becomes a 404."""
    try:
        return getter(**kwargs)
    except NotFound as exc:
        raise Http404(str(exc)) from exc


def partial(request: HtmxHttpRequest, template: str, name: str) -> str:
    """The whole page, or only the named partial when htmx asks for it."""
    return f"{template}#{name}" if request.htmx and request.GET.get("partial") else template


def text_param(request: HttpRequest, name: str, max_length: int = 200) -> str | None:
    value = (request.GET.get(name) or "").strip()
    return value[:max_length] or None


def count_param(request: HttpRequest, name: str, *, maximum: int) -> int | None:
    """A whole number from 0 to ``maximum``, or None when the parameter is absent or
    empty; anything else is a 400 page that says what was expected."""
    raw = (request.GET.get(name) or "").strip()
    if not raw:
        return None
    value = parse_count(raw, maximum=maximum)
    if value is None:
        raise BadRequest(f"{name} must be a whole number from 0 to {maximum}.")
    return value


def datetime_param(request: HttpRequest, name: str) -> datetime | None:
    """A ``datetime-local`` value (``2025-01-02T03:04``), read as UTC."""
    raw = (request.GET.get(name) or "").strip()
    if not raw:
        return None
    for fmt in ("%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return datetime.strptime(raw, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


# The session key of the inbox ticks a refused bulk action kept ("request id:intent
# hash" values), read once by the next inbox page.
KEPT_TICKS = "inbox_kept_ticks"


def route_save(request: AuthenticatedHttpRequest, *, name: str, owner: dict[str, Any]) -> None:
    """Save the Slack channel of a tool's or a group's requests (``owner``: ``tool`` or
    ``group``) from the form, and say what came of it."""
    try:
        channel = services.route_set(
            user=request.user, channel=request.POST.get("slack_channel", "")[:100], **owner
        )
    except (Refusal, ValueError) as exc:
        messages.error(request, f"Nothing was saved. {getattr(exc, 'detail', exc)}")
        return
    if channel == "-":
        messages.success(request, f"{name}'s requests are kept out of Slack now.")
    elif channel:
        messages.success(request, f"{name}'s requests now go to {channel}.")
    else:
        messages.success(request, f"{name} has no channel of its own now.")
