"""Template helpers of the reconciliation pages: ``{% load evidence_tags %}``.

``code_words``  an outcome or error code in words (``console.evidence``), plain text:
                pipe it through ``reveal``; ``outcome_words`` a posted outcome's.
``hash_breaks`` a hash or key that wraps only between groups of 16 characters.
"""

from django import template
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from .. import evidence

register = template.Library()

HASH_GROUP = 16


@register.filter
def code_words(code, detail="") -> str:
    """``{{ op.error_code|code_words:op.error_detail|reveal }}``."""
    return evidence.code_in_words(str(code or ""), str(detail or ""))


@register.filter
def outcome_words(outcome) -> str:
    """A posted outcome's code and detail in words: ``{{ attempt.outcome|outcome_words }}``
    (either may be absent)."""
    if not isinstance(outcome, dict):
        return ""
    return evidence.code_in_words(str(outcome.get("code") or ""), str(outcome.get("detail") or ""))


@register.filter
def hash_breaks(value) -> SafeString:
    """The value escaped, with a ``<wbr>`` after every 16 characters: a 64-character
    hash wraps into even groups, never one character on a line of its own, and copies
    as one string."""
    text = str(value or "")
    groups = [escape(text[i : i + HASH_GROUP]) for i in range(0, len(text), HASH_GROUP)]
    # Each group is escape()d; the only markup added is <wbr>.
    return mark_safe("<wbr>".join(groups))  # noqa: S308
