"""JSON values as text for the console: ``{% load json_tags %}``.

The output is plain text, to be passed through ``reveal`` (console_tags) which escapes
it and makes invisible characters visible.
"""

import json

from django import template

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
