"""Template helpers of the browser console: ``{% load console_tags %}``.

``reveal``  text that a runner or a model wrote, escaped, with every invisible or
            bidirectional-control character shown as a visible marker: nobody
            approves something other than what they read.
``badge``   a state badge for an operation, attempt, approval, run or effect class.
``reltime`` a ``<time>`` element that console.js renders as relative time, keeping the
            absolute UTC time in its title.
``nav_link`` a navigation entry that appears only once its URL name exists.
``count_text`` a count read up to ``selectors.NAV_COUNT_CAP``, as "99+" beyond.
"""

import re
import unicodedata
from datetime import UTC, datetime

from django import template
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from operations import selectors
from operations.contracts import display
from operations.text import is_hidden

register = template.Library()

# Names for the C0/C1 controls, which the Unicode character database leaves unnamed.
_CONTROL_NAMES = {
    0x00: "NULL",
    0x07: "BELL",
    0x08: "BACKSPACE",
    0x0B: "LINE TABULATION",
    0x0C: "FORM FEED",
    0x0D: "CARRIAGE RETURN",
    0x1B: "ESCAPE",
    0x7F: "DELETE",
    0x85: "NEXT LINE",
}

_CATEGORY_NAMES = {
    "Cc": "CONTROL CHARACTER",
    "Co": "PRIVATE USE CHARACTER",
    "Cs": "SURROGATE",
    "Cn": "UNASSIGNED CODE POINT",
}


def _char_name(char: str) -> str:
    code = ord(char)
    name = unicodedata.name(char, None) or _CONTROL_NAMES.get(code)
    if name is None:
        name = _CATEGORY_NAMES.get(unicodedata.category(char), "CHARACTER")
    return name


def _marker(char: str) -> str:
    code = f"U+{ord(char):04X}"
    return (
        f'<span class="visible-controls" title="{code} {escape(_char_name(char))}">'
        f"\u27e8{code}\u27e9</span>"
    )


@register.filter(is_safe=False)
def reveal(value) -> SafeString:
    """Escape ``value`` and replace each invisible or control character with a marker.

    The value is treated as untrusted text even when it is already marked safe, so the
    result contains no markup but the markers built here.
    """
    if value is None:
        return mark_safe("")
    parts: list[str] = []
    plain: list[str] = []
    for char in str(value):
        if is_hidden(char):
            if plain:
                parts.append(escape("".join(plain)))
                plain = []
            parts.append(_marker(char))
        else:
            plain.append(char)
    if plain:
        parts.append(escape("".join(plain)))
    # Every piece is either escape()d text or a marker whose variable parts are a
    # hexadecimal code point and an escape()d character name.
    return mark_safe("".join(parts))  # noqa: S308


@register.filter
def reveal_text(value) -> str:
    """``reveal`` for an attribute (``aria-label``, ``title``): each invisible or control
    character as the plain text ``[U+202E]``, no markup; the template escapes the rest."""
    if value is None:
        return ""
    return "".join(f"[U+{ord(char):04X}]" if is_hidden(char) else char for char in str(value))


_CSS_TOKEN = re.compile(r"[^a-z0-9_-]+")


@register.filter
def badge(value) -> SafeString:
    """``awaiting_approval`` -> ``<span class="badge badge-awaiting_approval">awaiting
    approval</span>``. Works for any status-like string (TextChoices included)."""
    if value is None or str(value) == "":
        return mark_safe("")
    status = str(value)
    css = _CSS_TOKEN.sub("-", status.lower()).strip("-") or "unknown"
    return format_html('<span class="badge badge-{}">{}</span>', css, status.replace("_", " "))


def _as_utc(value: datetime) -> datetime:
    if timezone.is_naive(value):
        value = timezone.make_aware(value)
    return value.astimezone(UTC)


@register.filter
def reltime(value) -> SafeString | str:
    """A datetime as ``<time datetime="ISO" title="absolute UTC" data-relative>``.

    The text is the absolute UTC time; console.js replaces it with "3 min ago" or
    "in 2 h" and keeps the absolute time in the title. ``None`` renders as an empty
    string, so ``{{ value|reltime|default:"—" }}`` works.
    """
    if value is None or value == "":
        return ""
    if not isinstance(value, datetime):
        return escape(str(value))
    moment = _as_utc(value)
    iso = moment.isoformat(timespec="seconds").replace("+00:00", "Z")
    absolute = moment.strftime("%Y-%m-%d %H:%M:%S UTC")
    return format_html(
        '<time datetime="{}" title="{}" data-relative>{}</time>', iso, absolute, absolute
    )


@register.filter
def count_text(count: int) -> str:
    """A count read at most up to ``selectors.NAV_COUNT_CAP``: "99+" when it reached it."""
    return f"{selectors.NAV_COUNT_CAP - 1}+" if count >= selectors.NAV_COUNT_CAP else str(count)


@register.simple_tag(takes_context=True)
def nav_link(
    context, url_name: str, label: str, section: str = "", count: int = 0, count_label: str = ""
) -> SafeString:
    """``<li><a href=...>label</a></li>`` for ``url_name``, or nothing when the URL name
    does not exist (yet). The link is marked ``aria-current="page"`` when the current
    view is ``url_name`` or when the page's context sets ``nav_section`` to ``section``
    (or to ``url_name``), e.g. an operation's page highlighting "Operations"."""
    try:
        href = reverse(url_name)
    except NoReverseMatch:
        return mark_safe("")
    request = context.get("request")
    match = getattr(request, "resolver_match", None)
    active_section = context.get("nav_section")
    current = (match is not None and match.view_name == url_name) or (
        bool(active_section) and active_section in {url_name, section}
    )
    badge = (
        format_html(
            ' <span class="nav-count" title="{1}">{0}'
            '<span class="visually-hidden"> {1}</span></span>',
            count_text(count),
            count_label,
        )
        if count
        else ""
    )
    if current:
        return format_html('<li><a href="{}" aria-current="page">{}{}</a></li>', href, label, badge)
    return format_html('<li><a href="{}">{}{}</a></li>', href, label, badge)


@register.filter
def op_summary(op) -> str:
    """What the operation will do, in words (``operations.contracts.display``; plain text: pipe it
    through ``reveal``)."""
    return display.summary(op.tool_version.contract, op.arguments)
