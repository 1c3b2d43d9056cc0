"""The Cedar schema of one tool, generated from its contract, and the values a policy
reads, in Cedar's JSON form (docs/policies.md, Types). Pure.

JSON types map to Cedar's: string to String, integer to Long, number to decimal (four
fractional digits at most), boolean to Boolean, array to Set, object to Record. A
property marked ``x-sensitive``, or of a type Cedar cannot hold, is left out: a policy
naming it is refused by the validator, and it never reaches the context.
"""

from decimal import Decimal, InvalidOperation
from typing import Any

# Cedar's Long and decimal ranges: a value outside them is left out of the context
# (and a policy reading it then cannot be evaluated: a person decides).
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
DECIMAL_LIMIT = Decimal("922337203685477.5807")
REGISTER = "register"
ACTIVATE = "activate"
# ---------------------------------------------------------------------------------------
# The schema, generated from the active contracts


def _record(attributes: dict[str, Any]) -> dict[str, Any]:
    return {"type": "Record", "attributes": attributes}


def _type_of(schema: Any, depth: int = 0) -> dict[str, Any] | None:
    """The Cedar type of a JSON schema, or None when Cedar cannot hold it (left out)."""
    if not isinstance(schema, dict) or depth > 16 or schema.get("x-sensitive") is True:
        return None
    json_type = schema.get("type")
    if json_type == "string":
        return {"type": "String"}
    if json_type == "integer":
        return {"type": "Long"}
    if json_type == "number":
        return {"type": "Extension", "name": "decimal"}
    if json_type == "boolean":
        return {"type": "Boolean"}
    if json_type == "array":
        element = _type_of(schema.get("items"), depth + 1)
        return {"type": "Set", "element": element} if element is not None else None
    if json_type == "object":
        return _record(_attributes(schema, depth + 1))
    return None


def _attributes(schema: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    attributes = {}
    for name, child in properties.items():
        typed = _type_of(child, depth)
        if typed is not None:
            attributes[name] = {**typed, "required": name in required}
    return attributes


def _entity_types() -> dict[str, Any]:
    string = {"type": "String"}
    return {
        "Runner": {"shape": _record({"owner": string})},
        "Tool": {"shape": _record({"name": string, "effect_class": string, "owner": string})},
    }


REGISTER_CONTEXT_BASE = {
    "effect_class": {"type": "String"},
    "principal": {"type": "String"},
    "run": _record(
        {
            "tool_calls": {"type": "Long"},
            "spend": {"type": "Extension", "name": "decimal"},
            "turns": {"type": "Long"},
        }
    ),
    "time": _record(
        {
            "date": {"type": "String"},
            "weekday": {"type": "String"},
            "hour": {"type": "Long"},
            "minute": {"type": "Long"},
            "unix": {"type": "Long"},
        }
    ),
}
ACTIVATE_CONTEXT = {
    "first_version": {"type": "Boolean"},
    "effect_class": {"type": "String"},
    "version": {"type": "Long"},
}


def schema_for(input_schema: dict[str, Any] | None) -> dict[str, Any]:
    """The Cedar schema for one tool: ``arguments`` typed from its input schema (a tool
    not yet registered: no arguments at all)."""
    arguments = _record(_attributes(input_schema or {}))
    applies = {"principalTypes": ["Runner"], "resourceTypes": ["Tool"]}
    return {
        "": {
            "entityTypes": _entity_types(),
            "actions": {
                REGISTER: {
                    "appliesTo": {
                        **applies,
                        "context": _record({**REGISTER_CONTEXT_BASE, "arguments": arguments}),
                    }
                },
                ACTIVATE: {"appliesTo": {**applies, "context": _record(ACTIVATE_CONTEXT)}},
            },
        }
    }


# ---------------------------------------------------------------------------------------
# Values in Cedar's form


def decimal_value(value: Any) -> dict[str, Any] | None:
    """A JSON number as Cedar's decimal (four fractional digits at most), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        return None
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return None
    if (
        not number.is_finite()
        or abs(number) > DECIMAL_LIMIT
        or number != number.quantize(Decimal("0.0001"))
    ):
        return None
    text = format(number.quantize(Decimal("0.0001")), "f")
    return {"__extn": {"fn": "decimal", "arg": text}}


def _value(typed: dict[str, Any], value: Any) -> Any:
    """``value`` in Cedar's JSON form for the schema type ``typed``; ``_ABSENT`` when it
    cannot be represented (then left out)."""
    cedar_type = typed["type"]
    if cedar_type == "String":
        return value if isinstance(value, str) else _ABSENT
    if cedar_type == "Boolean":
        return value if isinstance(value, bool) else _ABSENT
    if cedar_type == "Long":
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not LONG_MIN <= value <= LONG_MAX
        ):
            return _ABSENT
        return value
    if cedar_type == "Extension":
        converted = decimal_value(value)
        return _ABSENT if converted is None else converted
    if cedar_type == "Set":
        if not isinstance(value, list):
            return _ABSENT
        items = [_value(typed["element"], item) for item in value]
        return _ABSENT if any(item is _ABSENT for item in items) else items
    if cedar_type == "Record":
        return _record_value(typed["attributes"], value)
    return _ABSENT


_ABSENT = object()


def _record_value(attributes: dict[str, Any], value: Any) -> Any:
    if not isinstance(value, dict):
        return _ABSENT
    out = {}
    for name, typed in attributes.items():
        if name in value:
            converted = _value(typed, value[name])
            if converted is not _ABSENT:
                out[name] = converted
    return out


def arguments_record(input_schema: dict[str, Any], arguments: Any) -> dict[str, Any]:
    """The frozen arguments as the record a policy reads: only what the schema declares
    and Cedar can hold; sensitive fields never."""
    record = _record_value(_attributes(input_schema), arguments)
    return record if isinstance(record, dict) else {}
