"""What an argument schema provably says about one place in the arguments.

Approval rules, the concurrency key and ``"x-sensitive"`` marks name places in the
arguments by JSON pointer. A rule on a place the schema cannot produce is a misspelt
path (it would ask a person for every operation, or with ``"when_missing": "skip"`` for
none), and a new contract version may only activate by itself when each protected
place keeps its type and its presence. Both questions are answered here, from the schema
alone, by ``locate``:

1. Follow the pointer from the root schema, token by token, through ``properties`` (a
   declared object member) or ``items`` (an array element: a decimal index, or ``*``
   for every element, as ``contracts.sensitive_paths`` writes it). A member reachable
   only through ``additionalProperties`` or ``patternProperties`` is not declared, so
   not proven.
2. Refuse every schema object on the way that uses a keyword this walk does not
   follow (``$ref``, ``allOf``, ``anyOf``, ``oneOf``, ``not``, ``if``/``then``/``else``,
   ``dependentSchemas``, ``patternProperties``, ``dependentRequired``, ``prefixItems``).
   Such a keyword can narrow the place's type or make it required without the walk
   seeing it, and the comparison of two versions is only sound when nothing is hidden.
3. Answer with the JSON types the place may hold and whether every valid document has
   it: each member on the way is ``required`` by a schema that only admits objects. The
   types come from ``type``, narrowed by ``enum`` and ``const`` (``number`` holds
   ``integer``); at the place itself ``allOf``, ``anyOf`` and ``oneOf`` of such schemas
   are followed too, so ``{"anyOf": [{"type": "integer"}, {"type": "null"}]}`` (an
   optional value as generators write it) is integer or null. The other keywords of
   step 2 are refused there as well.

Pure functions, no Django import.
"""

from dataclasses import dataclass
from typing import Any

# "number" stands for the numbers that are not integers; a declared "number" is both.
JSON_TYPES = frozenset({"null", "boolean", "object", "array", "string", "integer", "number"})
WILDCARD = "*"

_APPLICATORS = (
    "$ref",
    "$dynamicRef",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
)
_COMBINATIONS = ("allOf", "anyOf", "oneOf")
_ON_MEMBER_STEP = ("patternProperties", "dependentRequired")
_ON_ELEMENT_STEP = ("prefixItems",)


class Unproven(ValueError):
    """The schema does not prove that the place exists; the message says why."""


@dataclass(frozen=True)
class Place:
    types: frozenset[str]
    required: bool


def format_pointer(tokens: tuple[str, ...]) -> str:
    return "".join("/" + token.replace("~", "~0").replace("/", "~1") for token in tokens)


def format_types(types: frozenset[str]) -> str:
    names = set(types)
    if {"integer", "number"} <= names:
        names.discard("integer")
    return " or ".join(sorted(names)) if names else "nothing"


def _value_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def schema_types(node: Any) -> frozenset[str]:
    """The JSON types a value valid against ``node`` may have (applicators aside)."""
    if node is True:
        return JSON_TYPES
    if node is False:
        return frozenset()
    types = JSON_TYPES
    declared = node.get("type")
    if declared is not None:
        names = [declared] if isinstance(declared, str) else declared
        types = frozenset(
            kind
            for name in names
            for kind in (("integer", "number") if name == "number" else (name,))
        )
    if "enum" in node:
        types &= {_value_type(value) for value in node["enum"]}
    if "const" in node:
        types &= {_value_type(node["const"])}
    return types


def _is_index(name: str) -> bool:
    return name.isascii() and name.isdigit() and (name == "0" or not name.startswith("0"))


def _refuse_unfollowed(node: Any, keywords: tuple[str, ...], where: str) -> None:
    if not isinstance(node, dict):
        return
    used = [keyword for keyword in keywords if keyword in node]
    if used:
        raise Unproven(
            f"{where} uses {', '.join(used)}, which Effectgate does not follow; declare the "
            "place with plain properties and items"
        )


def locate(schema: Any, tokens: tuple[str, ...], *, wildcard: bool = False) -> Place:
    """The place at ``tokens`` in documents valid against ``schema``, or raise Unproven.

    ``wildcard`` lets ``*`` stand for every element of an array (sensitive marks);
    approval rules and concurrency keys name one element by its index.
    """
    node = schema
    required = True
    for depth, token in enumerate(tokens):
        where = format_pointer(tokens[:depth]) or "the top level"
        if node is True:
            raise Unproven(f"{where} has no schema, so nothing in it is declared")
        if node is False:
            raise Unproven(f"{where} admits no value")
        _refuse_unfollowed(node, _APPLICATORS, where)
        types = schema_types(node)
        members = node.get("properties") or {}
        items = node.get("items")
        if token in members:
            if "object" not in types:
                raise Unproven(f"{where} declares properties but cannot be an object")
            _refuse_unfollowed(node, _ON_MEMBER_STEP, where)
            required = required and types == {"object"} and token in node.get("required", [])
            node = members[token]
        elif items is not None and (_is_index(token) or (wildcard and token == WILDCARD)):
            if "array" not in types:
                raise Unproven(f"{where} declares items but cannot be an array")
            _refuse_unfollowed(node, _ON_ELEMENT_STEP, where)
            required = False
            node = items
        else:
            raise Unproven(
                f'no property "{token}" is declared under properties at {where}'
                + (" (and it is not an array index)" if items is not None else "")
            )
    place = format_pointer(tokens) or "the top level"
    types = _place_types(node, place)
    if not types:
        raise Unproven(f"{place} admits no value")
    return Place(types=types, required=required)


def _place_types(node: Any, place: str) -> frozenset[str]:
    types = schema_types(node)
    if not isinstance(node, dict):
        return types
    _refuse_unfollowed(node, tuple(k for k in _APPLICATORS if k not in _COMBINATIONS), place)
    for keyword in _COMBINATIONS:
        if keyword in node:
            branches = [_place_types(branch, place) for branch in node[keyword]]
            if keyword == "allOf":
                types &= frozenset.intersection(*branches)
            else:
                types &= frozenset().union(*branches)
    return types
