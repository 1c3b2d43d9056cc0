"""Small formatting filters of the runs, tools and dashboard pages: ``{% load page_tags %}``."""

from django import template

from ..charts import duration_text

register = template.Library()


@register.filter
def seconds(value) -> str:
    """``86400`` -> ``1 d``; ``None`` -> an em dash."""
    if value is None or value == "":
        return "—"
    try:
        return duration_text(float(value))
    except (TypeError, ValueError):
        return str(value)
