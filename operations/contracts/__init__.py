"""Tool contracts: what a runner declares about a tool, checked as hostile input.

- ``validation``: the contract's own schema, defaults, sensitive fields, lookup URLs;
  ``normalize_contract`` is the one way in.
- ``safety``: what an argument schema may hold and the validator that applies it in
  bounded time, reaching nothing outside it.
- ``arguments``: arguments validated against a contract and frozen (sensitive values
  digested), and the concurrency value they hold (``concurrency_value``).
- ``paths``: what a schema provably says about one place in the arguments.
- ``subsumption`` and ``strength``: whether a new version protects at least as much.
- ``display``: what an operation will do, in words.
- ``links``: an operation's lookup URL and provider console link, filled in.

Pure: no Django model or HTTP import.
"""

from .arguments import concurrency_value
from .display import summary_labels
from .links import ConsoleLink, console_link, lookup_url
from .strength import weakenings
from .validation import (
    APPROVAL_MODE_RANK,
    CONTRACT_SCHEMA,
    DISPLAY_FORMATS,
    DISPLAY_PLACEHOLDER,
    URL_PLACEHOLDERS,
    normalize_contract,
    sensitive_paths,
    url_template_problems,
)

__all__ = [
    "APPROVAL_MODE_RANK",
    "CONTRACT_SCHEMA",
    "DISPLAY_FORMATS",
    "DISPLAY_PLACEHOLDER",
    "URL_PLACEHOLDERS",
    "ConsoleLink",
    "concurrency_value",
    "console_link",
    "lookup_url",
    "normalize_contract",
    "sensitive_paths",
    "summary_labels",
    "url_template_problems",
    "weakenings",
]
