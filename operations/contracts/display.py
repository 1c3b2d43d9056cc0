"""What an operation will do, in words: the contract's ``display`` applied to its frozen
arguments ("Refund €750.00 to pay_1").

``display.summary`` holds placeholders, JSON pointers into the arguments in braces
(``{/amount_cents}``); ``display.fields`` may give a pointer a label and a format:

- ``money``: an amount in ``currency`` (ISO 4217), in minor units (cents) when
  ``minor_units`` is true; shown with the currency's symbol where it has a common one,
  never rounded (an amount with more decimals than the currency has shows them all);
- ``datetime``: an RFC 3339 string, shown in UTC;
- ``email``, ``url``: shown as text, never as a link (a summary is not a place to
  click); ``text``: as it is.

Without ``display``, the summary lists the top-level arguments, required ones first, by
their schema ``title`` (or name). A value the contract marks ``x-sensitive`` shows as
"(sensitive)" (only those: a runner cannot hide a value by making it look like a
digest). Whatever a runner sent, formatting never fails and never grows: a value that
does not fit its format is shown as text, each at most ``MAX_VALUE`` characters. The
text is plain: templates escape it and reveal hidden characters (``reveal``).

``money_field`` names the field that holds what an operation puts at stake (the
dashboard adds it up); ``money_text`` writes an amount, a sum too, in its currency.
"""

import re
from datetime import UTC, datetime
from decimal import Context, Decimal, InvalidOperation
from typing import Any

from approvals.policy import is_missing, parse_pointer, resolve_pointer

from .validation import DISPLAY_PLACEHOLDER, sensitive_paths

SYMBOLS = {"EUR": "€", "USD": "$", "GBP": "£", "JPY": "¥", "CHF": "CHF "}
# Currencies whose minor unit is not a hundredth.
MINOR_DIGITS = {"JPY": 0, "KRW": 0, "BHD": 3, "KWD": 3, "TND": 3}
MISSING = "—"
FALLBACK_FIELDS = 4
MAX_VALUE = 200
# A plain amount without its sign; matched in full (with match(), a "$" would also admit
# a final newline).
UNSIGNED_AMOUNT = r"[0-9]{1,30}(\.[0-9]{1,30})?"
AMOUNT = re.compile("-?" + UNSIGNED_AMOUNT)
EXACT = Context(prec=80)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def in_currency_units(amount: Decimal, field: dict[str, Any]) -> Decimal:
    """An amount as a money field holds it (in minor units when ``minor_units``), in
    the currency's units: exact, never rounded (``1250`` cents is ``12.50``)."""
    if not field.get("minor_units"):
        return amount
    return amount.scaleb(-MINOR_DIGITS.get(field.get("currency", ""), 2), context=EXACT)


def money_text(amount: Decimal, currency: str) -> str:
    """An amount in ``currency``'s units as people read it: ``€1,250.00``, ``¥3,000``,
    ``12.345 KWD``; never rounded (more decimals than the currency has show them all)."""
    digits = MINOR_DIGITS.get(currency, 2)
    exponent = amount.as_tuple().exponent
    shown = max(digits, -exponent) if isinstance(exponent, int) else digits
    number = f"{abs(amount):,.{shown}f}"
    sign = "-" if amount < 0 else ""
    symbol = SYMBOLS.get(currency)
    return f"{sign}{symbol}{number}" if symbol else f"{sign}{number} {currency}"


def _money(value: Any, field: dict[str, Any]) -> str | None:
    """The amount in words, or None when the value is not a plain decimal amount."""
    text = str(value)
    if not AMOUNT.fullmatch(text):
        return None
    return money_text(in_currency_units(Decimal(text), field), field.get("currency", ""))


def money_field(contract: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The display field that holds what an operation of this contract puts at stake:
    the first money field the summary names, else the first money field by pointer;
    None when the contract declares none. One per contract: a second money field (a
    fee, the original amount) is not added to it."""
    display = contract.get("display") or {}
    fields = display.get("fields") or {}
    money = {
        pointer: field
        for pointer, field in fields.items()
        if isinstance(field, dict) and field.get("format") == "money" and field.get("currency")
    }
    named = [p for p in DISPLAY_PLACEHOLDER.findall(display.get("summary") or "") if p in money]
    pointer = named[0] if named else min(money, default=None)
    return None if pointer is None else (pointer, money[pointer])


def _datetime(value: Any) -> str | None:
    moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if moment.tzinfo is None:
        return moment.strftime("%Y-%m-%d %H:%M")
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def format_value(
    value: Any, field: dict[str, Any] | None = None, *, sensitive: bool = False
) -> str:
    """One argument's value as a reviewer reads it."""
    if is_missing(value) or value is None:
        return MISSING
    if sensitive:
        return "(sensitive)"
    kind = (field or {}).get("format", "text")
    shown: str | None = None
    try:
        if kind == "money" and not isinstance(value, bool):
            shown = _money(value, field or {})
        elif kind == "datetime":
            shown = _datetime(value)
    except (ArithmeticError, InvalidOperation, OverflowError, ValueError):
        shown = None
    if shown is None:
        if isinstance(value, dict | list):
            shown = "…" if value else ("{}" if isinstance(value, dict) else "[]")
        elif isinstance(value, bool):
            shown = "yes" if value else "no"
        else:
            shown = str(value)
    return _clip(shown)


def _is_sensitive(pointer: str, secrets: list[tuple[str, ...]]) -> bool:
    """Whether ``pointer`` reaches into a field the contract marks ``x-sensitive``
    (``"*"`` in a sensitive path stands for any array index)."""
    tokens = parse_pointer(pointer)
    return any(
        len(tokens) >= len(secret)
        and all(part == "*" or part == token for part, token in zip(secret, tokens, strict=False))
        for secret in secrets
    )


def summary_labels(contract: dict[str, Any]) -> dict[str, str] | None:
    """The label the summary gives each top-level argument when the contract's display
    has no summary template (``display.summary``): the display field's label, else the
    schema's ``title``, else the name. None when a template writes the summary."""
    display = contract.get("display") or {}
    if display.get("summary"):
        return None
    schema = contract.get("input_schema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return {}
    fields = display.get("fields", {})
    labels = {}
    for name, child in properties.items():
        pointer = "/" + name.replace("~", "~0").replace("/", "~1")
        title = child.get("title") if isinstance(child, dict) else None
        labels[name] = fields.get(pointer, {}).get("label") or title or name
    return labels


def summary(contract: dict[str, Any], arguments: Any) -> str:
    """The operation in one line, from ``contract["display"]`` or the schema's titles."""
    display = contract.get("display") or {}
    fields = display.get("fields", {})
    schema = contract.get("input_schema", {})
    secrets = [tuple(path) for path in sensitive_paths(schema)] if isinstance(schema, dict) else []
    template = display.get("summary")
    if template:

        def fill(match: re.Match[str]) -> str:
            pointer = match.group(1)
            return format_value(
                resolve_pointer(arguments, pointer),
                fields.get(pointer),
                sensitive=_is_sensitive(pointer, secrets),
            )

        return DISPLAY_PLACEHOLDER.sub(fill, template)
    if not isinstance(arguments, dict):
        return format_value(arguments)
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}
    required = schema.get("required", []) if isinstance(schema, dict) else []
    labels = summary_labels(contract) or {}
    # Required arguments first, in the schema's order: extra ones a runner adds cannot
    # push the real ones out of the summary.
    names = [name for name in required if name in arguments]
    names += [name for name in properties if name in arguments and name not in names]
    names += [name for name in arguments if name not in names]
    parts = []
    for name in names[:FALLBACK_FIELDS]:
        pointer = "/" + name.replace("~", "~0").replace("/", "~1")
        label = labels.get(name, name)
        value = format_value(
            arguments[name], fields.get(pointer), sensitive=_is_sensitive(pointer, secrets)
        )
        parts.append(f"{label}: {value}")
    if len(names) > FALLBACK_FIELDS:
        parts.append("…")
    return ", ".join(parts)
