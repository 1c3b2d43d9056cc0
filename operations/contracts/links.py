"""The URLs a contract's templates give for one operation, filled in: its lookup's
(``reconcile.url``, what each automatic probe asks) and its provider console link
(``reconcile.console_url``, docs/api.md, Reconciliation: where a person who reconciles
opens the provider's own record of the effect; Effectgate never fetches it). Pure.
"""

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .validation import (
    CONSOLE_URL_PLACEHOLDER,
    URL_PLACEHOLDER,
    console_url_problems,
    fill_url_template,
    url_template_problems,
)


def lookup_url(template: str, *, idempotency_key: str, operation_id: str) -> str:
    """The lookup template with its placeholders filled in, never through ``str.format``.

    A version stored before templates were checked may hold one that is no longer
    accepted (``{idempotency_key:>100000000}``): it raises ValueError.
    """
    problems = url_template_problems(template)
    if problems:
        raise ValueError(problems[0]["message"])
    values = {"idempotency_key": idempotency_key, "operation_id": operation_id}
    return fill_url_template(template, URL_PLACEHOLDER, values)


@dataclass(frozen=True)
class ConsoleLink:
    """``host`` is what the console names ("Open in pay.example.com"); ``url`` is None
    when the template needs the downstream reference and the operation has none yet."""

    host: str
    url: str | None


def console_link(
    contract: dict[str, Any], *, idempotency_key: str, downstream_id: str
) -> ConsoleLink | None:
    """The operation's link into the provider's console, or None without a template.

    The template is checked again before it is filled: a version stored before the
    check existed, or edited in the database, gives no link rather than a bad one.
    """
    template = (contract.get("reconcile") or {}).get("console_url")
    if not isinstance(template, str) or console_url_problems(template):
        return None
    parts = urlsplit(template)
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    if "{downstream_id}" in template and not downstream_id:
        return ConsoleLink(host=host, url=None)
    values = {"idempotency_key": idempotency_key, "downstream_id": downstream_id}
    return ConsoleLink(host=host, url=fill_url_template(template, CONSOLE_URL_PLACEHOLDER, values))
