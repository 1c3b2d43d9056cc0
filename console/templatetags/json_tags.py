"""JSON values as text for the console: ``{% load json_tags %}``.

The output is plain text, to be passed through ``reveal`` (console_tags) which escapes
it and makes invisible characters visible.
"""

import json

from django import template

from ..presenters import flatten

register = template.Library()


@register.filter
def json_text(value) -> str:
    """A string as it is; any other JSON value as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


@register.filter
def pretty_json(value) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, indent=2)


# An event's data in the trace: a one-line gist of at most this many characters, the
# whole as labelled rows behind it.
GIST_LENGTH = 80


@register.filter
def data_fields(value) -> list[tuple[str, str]]:
    """JSON as ``(pointer, value as text)`` rows, one per leaf (``presenters.flatten``)."""
    return [(path, json_text(leaf)) for path, leaf in flatten(value).items()]


@register.filter
def data_gist(value) -> str:
    """The first leaves of JSON on one line: ``result: committed · downstream_id: re_1``."""
    parts = [f"{path.lstrip('/')}: {text}" for path, text in data_fields(value)]
    gist = " · ".join(parts)
    return gist if len(gist) <= GIST_LENGTH else gist[: GIST_LENGTH - 1] + "…"
