"""Standing grants' families: which intents one standing grant covers (docs/policies.md,
Standing grants).

Pure functions over a grant's terms and an operation's frozen arguments; no Django
import. A pin that cannot be judged (an absent argument, a string where a number is
compared) does not hold: when in doubt, a person decides, as without a standing grant.
"""

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from .policy import is_missing, json_equal, parse_pointer, resolve_pointer

# What each pin operator means, in the words the console shows.
PIN_OPERATORS = {"eq": "equal to", "lte": "at most", "gte": "at least", "in": "one of"}
MAX_PINS = 50


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def pins_problem(pins: Any) -> str | None:
    """Why ``pins`` cannot be a standing grant's pins, or None.

    Each pin is ``{"path": <JSON pointer into the arguments>, "op": "eq" | "lte" |
    "gte" | "in", "value": ...}``; ``lte`` and ``gte`` compare numbers, ``in`` takes a
    non-empty list.
    """
    if not isinstance(pins, list):
        return "Pins are a list."
    if len(pins) > MAX_PINS:
        return f"At most {MAX_PINS} pins."
    for pin in pins:
        if not isinstance(pin, dict) or set(pin) != {"path", "op", "value"}:
            return 'Each pin is {"path", "op", "value"}.'
        path, op, value = pin["path"], pin["op"], pin["value"]
        try:
            tokens = parse_pointer(path) if isinstance(path, str) else None
        except ValueError:
            tokens = None
        if not tokens:
            return f"Pin {path!r}: the path is a JSON pointer to an argument, like /amount_cents."
        if op not in PIN_OPERATORS:
            return f"Pin {path}: the operator is one of {', '.join(PIN_OPERATORS)}."
        if op in ("lte", "gte") and not _is_number(value):
            return f"Pin {path}: {PIN_OPERATORS[op]} compares with a number."
        if op == "in" and not (isinstance(value, list) and value):
            return f"Pin {path}: one of takes a non-empty list of values."
    return None


def pin_holds(pin: dict[str, Any], arguments: Any) -> bool:
    actual = resolve_pointer(arguments, pin["path"])
    if is_missing(actual):
        return False
    op, expected = pin["op"], pin["value"]
    if op == "eq":
        return json_equal(actual, expected)
    if op == "in":
        return any(json_equal(actual, item) for item in expected)
    if not (_is_number(actual) and _is_number(expected)):
        return False
    return bool(actual <= expected) if op == "lte" else bool(actual >= expected)


def amount_at(arguments: Any, path: str) -> Decimal | None:
    """The non-negative number at ``path`` as a decimal, or None when there is none: a
    use counted against a maximum sum must say how much it spends, and a negative amount
    would give the sum back."""
    value = resolve_pointer(arguments, path)
    if is_missing(value) or not _is_number(value):
        return None
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return None
    if not amount.is_finite() or amount < 0:
        return None
    return amount


@dataclass(frozen=True)
class Family:
    """The intents a standing grant covers: one tool, one principal (or any: ``""``),
    one run (or any: ``""``), and arguments that hold every pin."""

    tool: str
    principal: str = ""
    run_id: str = ""
    pins: list[dict[str, Any]] = field(default_factory=list)

    def includes(self, *, tool: str, principal: str, run_id: str, arguments: Any) -> bool:
        return (
            tool == self.tool
            and (not self.principal or principal == self.principal)
            and (not self.run_id or run_id == self.run_id)
            and all(pin_holds(pin, arguments) for pin in self.pins)
        )
