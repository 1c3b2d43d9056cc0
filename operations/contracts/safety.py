"""What an argument schema may hold, and the validator that applies it safely.

A contract's ``input_schema`` comes from a runner, or through the MCP gateway from an
upstream server: it is hostile. Applying it to arguments must reach nothing outside the
document, take time linear in what it reads, and never crash. Three layers:

1. ``schema_problems`` refuses at registration (422 ``invalid_contract``, naming the
   place) what cannot be applied safely:

   a. a ``$ref`` that is not a fragment of the document itself (``#/$defs/x``,
      ``#anchor``): any other reference would be fetched or looked up somewhere;
      ``$dynamicRef`` and an ``$id`` below the top (which changes what ``#`` means);
      a reference to a place the document does not have;
   b. references that loop without reading deeper into the arguments (``#/$defs/a``
      pointing at itself, through ``allOf``, ``not``...): the validator would recurse
      until Python gives up; and chains or fan-outs of such references longer or wider
      than ``MAX_CHAIN`` / ``MAX_EXPANSION``;
   c. a ``pattern`` or ``patternProperties`` key that RE2 cannot compile (back
      references, look-around): every pattern is matched in linear time or not at all;
      ``unevaluatedProperties`` beside ``patternProperties``, whose implementation would
      match them with Python's backtracking engine.

2. ``validator_for`` builds a Draft 2020-12 validator whose reference registry
   retrieves nothing (a version stored before the checks above fails closed instead of
   fetching), and whose ``pattern``, ``patternProperties`` and ``additionalProperties``
   match with RE2.

3. ``bounded`` runs a validation under a budget of keyword evaluations
   (``WORK_LIMIT``): a schema and a document that combine into exponential work (nested
   ``allOf`` over a recursive definition) are refused instead of holding a worker.
   Recursion and unresolvable references end the same way.

Pure functions, no Django import.
"""

import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import unquote

import re2
import referencing
import referencing.exceptions
from jsonschema import Draft202012Validator, ValidationError, validators
from jsonschema.protocols import Validator

MAX_CHAIN = 16
MAX_EXPANSION = 1_000
WORK_LIMIT = 200_000
# One argument string: long enough for any email body or note an agent writes.
MAX_STRING = 65_536

# Keywords whose value is one schema, a list of schemas, or a map of names to schemas.
_ONE = (
    "additionalProperties",
    "contains",
    "else",
    "if",
    "items",
    "not",
    "propertyNames",
    "then",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("$defs", "definitions", "dependentSchemas", "patternProperties", "properties")
# Keywords that apply their schemas to the same value: a loop through them never ends.
_IN_PLACE_ONE = ("not", "if", "then", "else")
_IN_PLACE_LIST = ("allOf", "anyOf", "oneOf")

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


class WorkLimitExceeded(Exception):
    """The validation read more than ``WORK_LIMIT`` keywords."""


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _children(node: dict[str, Any], pointer: str) -> Iterator[tuple[str, str, Any]]:
    """(keyword, pointer, subschema) for every schema directly inside ``node``."""
    for keyword in _ONE:
        if keyword in node:
            yield keyword, f"{pointer}/{keyword}", node[keyword]
    for keyword in _LIST:
        if isinstance(node.get(keyword), list):
            for index, child in enumerate(node[keyword]):
                yield keyword, f"{pointer}/{keyword}/{index}", child
    for keyword in _MAP:
        if isinstance(node.get(keyword), dict):
            for name, child in node[keyword].items():
                yield keyword, f"{pointer}/{keyword}/{_escape(name)}", child


def _resolve(document: Any, fragment: str, anchors: dict[str, str]) -> str | None:
    """The pointer of the schema a ``#...`` reference names, or None."""
    if fragment and not fragment.startswith("/"):
        return anchors.get(fragment)
    node = document
    for raw in fragment.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return fragment if isinstance(node, dict | bool) else None


def _at(document: Any, pointer: str) -> Any:
    node = document
    for raw in pointer.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def _pattern_problem(pattern: Any, where: str) -> dict[str, str] | None:
    if not isinstance(pattern, str):
        return None
    try:
        re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        return {
            "path": where,
            "message": f"the pattern {pattern[:80]!r} cannot be matched in linear time "
            f"(RE2: {reason}); back references and look-around are not supported",
        }
    return None


def schema_problems(schema: Any, *, prefix: str = "/input_schema") -> list[dict[str, str]]:
    """Everything in ``schema`` that cannot be applied safely (module docstring, step 1).

    ``schema`` already passed the draft 2020-12 meta-schema check.
    """
    problems: list[dict[str, str]] = []
    nodes: dict[str, Any] = {}
    refs: dict[str, str] = {}
    anchors: dict[str, str] = {}
    unevaluated = any(isinstance(n, dict) and "unevaluatedProperties" in n for n in _walk(schema))
    stack: list[tuple[str, Any]] = [("", schema)]
    while stack:
        pointer, node = stack.pop()
        if pointer in nodes:
            continue
        nodes[pointer] = node
        if not isinstance(node, dict):
            continue
        problems.extend(_node_problems(node, pointer, prefix, unevaluated=unevaluated))
        anchor = node.get("$anchor")
        if isinstance(anchor, str):
            if anchor in anchors:
                problems.append(
                    {"path": f"{prefix}{pointer}/$anchor", "message": "duplicate $anchor"}
                )
            anchors[anchor] = pointer
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            refs[pointer] = unquote(ref[1:])
        stack.extend((child_pointer, child) for _, child_pointer, child in _children(node, pointer))
        if not stack:
            # Every place a reference names is a schema too, walked like the others.
            for target in (_resolve(schema, f, anchors) for f in refs.values()):
                if target is not None and target not in nodes:
                    stack.append((target, _at(schema, target)))
    if problems:
        return problems
    targets: dict[str, str] = {}
    for pointer, fragment in refs.items():
        target = _resolve(schema, fragment, anchors)
        if target is None:
            problems.append(
                {
                    "path": f"{prefix}{pointer}/$ref",
                    "message": f"#{fragment[:80]} is not a schema in this document",
                }
            )
        targets[pointer] = target or ""
    return problems or _expansion_problems(nodes, targets, prefix)


def _node_problems(
    node: dict[str, Any], pointer: str, prefix: str, *, unevaluated: bool
) -> list[dict[str, str]]:
    problems = []
    where = prefix + pointer
    if "$id" in node and pointer:
        problems.append({"path": f"{where}/$id", "message": "$id is allowed only at the top level"})
    if "$dynamicRef" in node:
        problems.append({"path": f"{where}/$dynamicRef", "message": "$dynamicRef is not supported"})
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        problems.append(
            {
                "path": f"{where}/$ref",
                "message": f"{ref[:80]!r} refers outside the schema; only references to its "
                "own places (#/$defs/...) are followed, nothing is fetched",
            }
        )
    problem = _pattern_problem(node.get("pattern"), f"{where}/pattern")
    if problem:
        problems.append(problem)
    patterns = node.get("patternProperties")
    if isinstance(patterns, dict):
        for key in patterns:
            problem = _pattern_problem(key, f"{where}/patternProperties/{_escape(key)}")
            if problem:
                problems.append(problem)
        if unevaluated:
            problems.append(
                {
                    "path": f"{where}/patternProperties",
                    "message": "patternProperties cannot be used with unevaluatedProperties "
                    "(its patterns would be matched by a backtracking engine)",
                }
            )
    return problems


def _walk(node: Any) -> Iterator[Any]:
    stack = [node]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _in_place(pointer: str, node: Any, targets: dict[str, str]) -> list[str]:
    """Pointers of the schemas applied to the same value as ``node``."""
    if not isinstance(node, dict):
        return []
    found = [f"{pointer}/{keyword}" for keyword in _IN_PLACE_ONE if keyword in node]
    for keyword in _IN_PLACE_LIST:
        if isinstance(node.get(keyword), list):
            found.extend(f"{pointer}/{keyword}/{i}" for i in range(len(node[keyword])))
    if isinstance(node.get("dependentSchemas"), dict):
        found.extend(
            f"{pointer}/dependentSchemas/{_escape(name)}" for name in node["dependentSchemas"]
        )
    if pointer in targets:
        found.append(targets[pointer])
    return found


def _expansion_problems(
    nodes: dict[str, Any], targets: dict[str, str], prefix: str
) -> list[dict[str, str]]:
    """Refuse loops of in-place applications, and chains or fan-outs past the limits.

    Without recursion: an iterative depth-first search colours each schema (1 on the
    current path, 2 done) and, once done, knows how many schemas applying it expands to
    and its longest chain of in-place applications.
    """
    expansion: dict[str, int] = {}
    chain: dict[str, int] = {}
    state: dict[str, int] = {}
    for start in nodes:
        if start in state:
            continue
        stack: list[tuple[str, Iterator[str]]] = [
            (start, iter(_in_place(start, nodes.get(start), targets)))
        ]
        path = [start]
        state[start] = 1
        while stack:
            pointer, pending = stack[-1]
            child = next(pending, None)
            if child is None:
                stack.pop()
                path.pop()
                state[pointer] = 2
                kids = _in_place(pointer, nodes.get(pointer), targets)
                expansion[pointer] = 1 + sum(expansion[k] for k in kids)
                chain[pointer] = 1 + max((chain[k] for k in kids), default=0)
                if expansion[pointer] > MAX_EXPANSION or chain[pointer] > MAX_CHAIN:
                    return [
                        {
                            "path": prefix + pointer,
                            "message": f"applying this schema expands to "
                            f"{expansion[pointer]} schemas in a chain of {chain[pointer]} "
                            f"(at most {MAX_EXPANSION} in chains of {MAX_CHAIN})",
                        }
                    ]
                continue
            if state.get(child) == 1:
                loop = [*path[path.index(child) :], child]
                return [
                    {
                        "path": prefix + child,
                        "message": "these references loop without reading deeper into the "
                        "arguments: " + " -> ".join("#" + p for p in loop),
                    }
                ]
            if state.get(child) is None:
                state[child] = 1
                path.append(child)
                stack.append((child, iter(_in_place(child, nodes.get(child), targets))))
    return []


# --- The validator --------------------------------------------------------------------

_budget: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "schema_budget", default=None
)


def _counted(keyword: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(keyword)
    def run(validator: Any, value: Any, instance: Any, schema: Any) -> Iterator[Any]:
        budget = _budget.get()
        if budget is not None:
            budget[0] -= 1
            if budget[0] < 0:
                raise WorkLimitExceeded
        result = keyword(validator, value, instance, schema)
        if result is not None:
            yield from result

    return run


def _search(pattern: str, text: str) -> bool:
    return compiled_pattern(pattern).search(text) is not None


@functools.lru_cache(maxsize=1024)
def compiled_pattern(pattern: str) -> Any:
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        # Only a version stored before patterns were checked can get here.
        raise referencing.exceptions.Unresolvable(ref=f"pattern {pattern[:40]!r}") from exc


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance[:80]!r} does not match {pattern[:80]!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if _search(pattern, name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _additional_properties(validator: Any, extra: Any, instance: Any, schema: Any) -> Any:
    if not validator.is_type(instance, "object"):
        return
    declared = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        name
        for name in instance
        if name not in declared and not any(_search(p, name) for p in patterns)
    ]
    if validator.is_type(extra, "object"):
        for name in extras:
            yield from validator.descend(instance[name], extra, path=name)
    elif extra is False and extras:
        shown = ", ".join(repr(name[:40]) for name in sorted(extras)[:5])
        yield ValidationError(f"Additional properties are not allowed ({shown} unexpected)")


_OVERRIDES: dict[str, Callable[..., Any]] = {
    "pattern": _pattern,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
}
SafeValidator = validators.extend(
    Draft202012Validator,
    validators={
        name: _counted(_OVERRIDES.get(name) or keyword)
        for name, keyword in Draft202012Validator.VALIDATORS.items()
    },
)


def _retrieve_nothing(uri: str) -> referencing.Resource[Any]:
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]


_REGISTRY: referencing.Registry[Any] = referencing.Registry(retrieve=_retrieve_nothing)  # type: ignore[call-arg]


def validator_for(schema: Any) -> Validator:
    """A validator for ``schema`` that fetches nothing and matches patterns with RE2."""
    return SafeValidator(schema, registry=_REGISTRY)


class TooComplex(Exception):
    """The validation was stopped; ``reason`` says why, in words for the runner."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def bounded(run: Callable[[], Any]) -> Any:
    """``run()`` under the work budget, turning every way it can blow up into TooComplex."""
    token = _budget.set([WORK_LIMIT])
    try:
        return run()
    except WorkLimitExceeded:
        raise TooComplex(
            f"validating these arguments against the tool's schema needs more than "
            f"{WORK_LIMIT} steps"
        ) from None
    except RecursionError:
        raise TooComplex("the arguments nest too deeply for the tool's schema") from None
    except referencing.exceptions.Unresolvable as exc:
        raise TooComplex(
            f"the tool's schema refers to {str(getattr(exc, 'ref', ''))[:80]!r}, which is "
            "not in it; the contract must be registered again"
        ) from None
    finally:
        _budget.reset(token)
