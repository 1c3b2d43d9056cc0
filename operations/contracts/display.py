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

Without a display field, an argument's format is inferred from its schema (``field_for``):
``"x-currency": "EUR"`` (with ``"x-minor-units": true`` for cents) makes it money, the
JSON Schema formats ``date-time``, ``email`` and ``uri`` their display formats, and an
integer named ``*_cents`` without a currency is shown as "75,000 cents", never as a bare
number of minor units. Without ``display.summary``, the summary lists the top-level
arguments, required ones first, by their label: the display field's, else the schema's
``title``, else the name in words ("payment_id" is "Payment id", "amount_cents"
"Amount"). A value the contract marks ``x-sensitive`` shows as
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


def _cents(value: Any) -> str | None:
    """Minor units of an unnamed currency: said so ("75,000 cents")."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return f"{value:,} cents"


def _money(value: Any, field: dict[str, Any]) -> str | None:
    """The amount in words, or None when the value is not a plain decimal amount."""
    text = str(value)
    if not AMOUNT.fullmatch(text):
        return None
    return money_text(in_currency_units(Decimal(text), field), field.get("currency", ""))


def money_field(contract: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The display field that holds what an operation of this contract puts at stake:
    the first money field the summary names, else the first money field by pointer,
    else the first top-level argument its schema gives a currency (``x-currency``);
    None when the contract names none. One per contract: a second money field (a
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
    if pointer is not None:
        return pointer, money[pointer]
    # Else the first top-level argument whose schema says its currency (x-currency).
    schema = contract.get("input_schema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    for name in properties or {}:
        field = field_for(contract, _top(name))
        if field.get("format") == "money":
            return _top(name), field
    return None


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
        elif kind == "cents":
            shown = _cents(value)
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


# JSON Schema formats a reviewer reads differently, and the display format each means.
SCHEMA_FORMATS = {"date-time": "datetime", "email": "email", "uri": "url"}
# A name that says its value is in minor units of some currency.
CENTS_SUFFIX = ("_cents", "_in_cents", "_minor_units", "_minor")
CURRENCY = re.compile(r"[A-Z]{3}")


def humanize(name: str) -> str:
    """An argument's name in words: "payment_id" is "Payment id", "amount_cents"
    "Amount" (its value says "cents"), "customerEmail" "Customer email"."""
    text = name
    for suffix in CENTS_SUFFIX:
        if text.endswith(suffix) and len(text) > len(suffix):
            text = text[: -len(suffix)]
            break
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", text).replace("_", " ").replace("-", " ")
    text = " ".join(text.split()).lower()
    return (text[:1].upper() + text[1:]) if text else name


def schema_at(schema: Any, pointer: str) -> dict[str, Any] | None:
    """The subschema describing the argument at ``pointer``, through ``properties`` and
    ``items`` only; None where the schema does not say."""
    node = schema
    for token in parse_pointer(pointer):
        if not isinstance(node, dict):
            return None
        properties = node.get("properties")
        if isinstance(properties, dict) and isinstance(properties.get(token), dict):
            node = properties[token]
        elif token.isdigit() and isinstance(node.get("items"), dict):
            node = node["items"]
        else:
            return None
    return node if isinstance(node, dict) else None


def inferred_field(node: dict[str, Any] | None, name: str) -> dict[str, Any]:
    """The display field a schema implies for one argument (module docstring)."""
    node = node or {}
    currency = node.get("x-currency")
    if isinstance(currency, str) and CURRENCY.fullmatch(currency):
        return {
            "format": "money",
            "currency": currency,
            "minor_units": node.get("x-minor-units") is True,
        }
    schema_format = node.get("format")
    if isinstance(schema_format, str) and schema_format in SCHEMA_FORMATS:
        return {"format": SCHEMA_FORMATS[schema_format]}
    if name.endswith(CENTS_SUFFIX) and node.get("type") in (None, "integer"):
        return {"format": "cents"}
    return {}


def field_for(contract: dict[str, Any], pointer: str) -> dict[str, Any]:
    """How the argument at ``pointer`` reads: its display field (label, format), else
    what its schema implies, with a label always set."""
    display = contract.get("display") or {}
    declared = (display.get("fields") or {}).get(pointer)
    tokens = parse_pointer(pointer) if pointer.startswith("/") else ()
    name = tokens[-1] if tokens else pointer
    node = schema_at(contract.get("input_schema"), pointer)
    field = dict(declared) if declared else inferred_field(node, name)
    title = node.get("title") if node else None
    field["label"] = (declared or {}).get("label") or (
        title if isinstance(title, str) and title else humanize(name)
    )
    return field


def secret_paths(contract: dict[str, Any]) -> list[tuple[str, ...]]:
    """The contract's sensitive paths, once for many ``describe`` calls."""
    schema = contract.get("input_schema")
    return [tuple(path) for path in sensitive_paths(schema)] if isinstance(schema, dict) else []


def describe(
    contract: dict[str, Any],
    pointer: str,
    value: Any,
    *,
    secrets: list[tuple[str, ...]] | None = None,
) -> str:
    """One argument's value as the contract says to read it (``secrets``: the
    contract's ``secret_paths``, when the caller describes many values)."""
    if secrets is None:
        secrets = secret_paths(contract)
    return format_value(
        value, field_for(contract, pointer), sensitive=_is_sensitive(pointer, secrets)
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
    return {name: field_for(contract, _top(name))["label"] for name in properties}


def _top(name: str) -> str:
    return "/" + name.replace("~", "~0").replace("/", "~1")


def summary(contract: dict[str, Any], arguments: Any) -> str:
    """The operation in one line, from ``contract["display"]`` or the schema's titles."""
    display = contract.get("display") or {}
    schema = contract.get("input_schema", {})
    secrets = [tuple(path) for path in sensitive_paths(schema)] if isinstance(schema, dict) else []
    template = display.get("summary")
    if template:

        def fill(match: re.Match[str]) -> str:
            pointer = match.group(1)
            return format_value(
                resolve_pointer(arguments, pointer),
                field_for(contract, pointer),
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
        pointer = _top(name)
        field = field_for(contract, pointer)
        label = labels.get(name, field["label"])
        value = format_value(arguments[name], field, sensitive=_is_sensitive(pointer, secrets))
        parts.append(f"{label}: {value}")
    if len(names) > FALLBACK_FIELDS:
        parts.append("…")
    return ", ".join(parts)


def amount_pointer(contract: dict[str, Any]) -> str | None:
    """The argument that says how much is at stake: ``money_field``'s, else the first
    top-level property that reads as cents. None without one."""
    money = money_field(contract)
    if money is not None:
        return money[0]
    schema = contract.get("input_schema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    for name in properties or {}:
        if field_for(contract, _top(name)).get("format") in ("money", "cents"):
            return _top(name)
    return None


def amount(contract: dict[str, Any], arguments: Any) -> str:
    """The amount at stake, for a row that has no room for the whole summary.

    The argument ``amount_pointer`` names, as the contract reads it ("€80.00", "8,000
    cents"); else the first top-level argument whose name says it is an amount, with
    its label, so that a bare number never passes for money ("Amount: 8000"); else
    ``MISSING``.
    """
    pointer = amount_pointer(contract)
    if pointer is not None:
        value = resolve_pointer(arguments, pointer)
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            return describe(contract, pointer, value)
    if isinstance(arguments, dict):
        for name, value in arguments.items():
            numeric = isinstance(value, int | float | str) and not isinstance(value, bool)
            if "amount" in str(name).lower() and numeric:
                pointer = _top(str(name))
                label = field_for(contract, pointer)["label"]
                return _clip(f"{label}: {describe(contract, pointer, value)}")
    return MISSING
