"""What an operation will do, in words: the contract's ``display`` applied to its frozen
arguments ("Refund €750.00 to pay_1").

``display.summary`` holds placeholders, JSON pointers into the arguments in braces
(``{/amount_cents}``); ``display.fields`` may give a pointer a label and a format:

- ``money``: an amount in ``currency`` (ISO 4217), in minor units (cents) when
  ``minor_units`` is true; shown with the currency's symbol where it has a common one;
- ``datetime``: an RFC 3339 string, shown in UTC;
- ``email``, ``url``: shown as text, never as a link (a summary is not a place to
  click); ``text``: as it is.

Without ``display``, the summary lists the top-level arguments by their schema
``title`` (or name). A digest of a sensitive value shows as "(sensitive)". The text is
plain: templates escape it and reveal hidden characters (``console_tags.reveal``).
"""

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from approvals.policy import is_missing, resolve_pointer

from .arguments import SENSITIVE_PREFIX
from .contracts import DISPLAY_PLACEHOLDER

SYMBOLS = {"EUR": "€", "USD": "$", "GBP": "£", "JPY": "¥", "CHF": "CHF "}
# Currencies whose minor unit is not a hundredth.
MINOR_DIGITS = {"JPY": 0, "KRW": 0, "BHD": 3, "KWD": 3, "TND": 3}
MISSING = "—"
FALLBACK_FIELDS = 4


def _money(value: Any, field: dict[str, Any]) -> str:
    currency = field.get("currency", "")
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return str(value)
    digits = MINOR_DIGITS.get(currency, 2)
    if field.get("minor_units"):
        amount = amount.scaleb(-digits)
    text = f"{amount:,.{digits}f}"
    symbol = SYMBOLS.get(currency)
    return f"{symbol}{text}" if symbol else f"{text} {currency}"


def _datetime(value: Any) -> str:
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    if moment.tzinfo is None:
        return moment.strftime("%Y-%m-%d %H:%M")
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def format_value(value: Any, field: dict[str, Any] | None = None) -> str:
    """One argument's value as a reviewer reads it."""
    if is_missing(value) or value is None:
        return MISSING
    if isinstance(value, str) and value.startswith(SENSITIVE_PREFIX):
        return "(sensitive)"
    kind = (field or {}).get("format", "text")
    if kind == "money" and not isinstance(value, bool):
        return _money(value, field or {})
    if kind == "datetime":
        return _datetime(value)
    if isinstance(value, dict | list):
        return "…" if value else ("{}" if isinstance(value, dict) else "[]")
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def summary(contract: dict[str, Any], arguments: Any) -> str:
    """The operation in one line, from ``contract["display"]`` or the schema's titles."""
    display = contract.get("display") or {}
    fields = display.get("fields", {})
    template = display.get("summary")
    if template:
        return DISPLAY_PLACEHOLDER.sub(
            lambda match: format_value(
                resolve_pointer(arguments, match.group(1)), fields.get(match.group(1))
            ),
            template,
        )
    properties = contract.get("input_schema", {}).get("properties", {})
    if not isinstance(arguments, dict):
        return format_value(arguments)
    parts = []
    for name, value in list(arguments.items())[:FALLBACK_FIELDS]:
        pointer = "/" + name.replace("~", "~0").replace("/", "~1")
        field = fields.get(pointer, {})
        schema = properties.get(name) if isinstance(properties, dict) else None
        label = field.get("label") or (schema or {}).get("title") or name
        parts.append(f"{label}: {format_value(value, field)}")
    if len(arguments) > FALLBACK_FIELDS:
        parts.append("…")
    return ", ".join(parts)


def labelled(contract: dict[str, Any], pointer: str) -> str | None:
    """The label ``display.fields`` gives an argument's pointer, if any."""
    field = (contract.get("display") or {}).get("fields", {}).get(pointer)
    return field.get("label") if field else None
