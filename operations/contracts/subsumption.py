"""Whether a new argument schema admits a value the active one refuses, at one place.

A new contract version may activate by itself only when every place the active version
protects (an approval rule, the concurrency key, a sensitive field) admits no new value,
there and at every ancestor on its path (``contracts._place_weakenings``). ``widenings``
answers for one place with the reasons it cannot prove that; empty means proven. The
proof is sound, not complete: whatever it cannot decide is a reason, and the version
waits for a person.

How one schema is proven to admit no more than another (``new ⊆ old``):

1. A schema is the conjunction of its keywords; ``allOf`` members and ``$ref`` targets
   are more keywords on the same value, so both sides are flattened into lists of
   schema objects. ``new ⊆ old`` holds when every keyword of every old object is
   implied by the new list.
2. When the new list allows only listed values (``enum``, ``const``), each listed value
   is validated against both sides: exact, whatever else either side says.
3. Otherwise keyword by keyword, each under its type (a string keyword says nothing
   about numbers): ``type``; bounds (``minimum``, ``maximum``, exclusive forms,
   ``multipleOf``, by exact fractions); sizes (``minLength``, ``maxLength``,
   ``minItems``, ``maxItems``, ``minProperties``, ``maxProperties``); ``pattern`` and
   ``format`` (the same one must stay: regular languages are not compared);
   ``uniqueItems``; ``required``; ``dependentRequired``; members (for every name either
   side declares, the schemas that govern it, from ``properties``, the
   ``patternProperties`` it matches, or ``additionalProperties``; other names only
   while the patterns are unchanged or the new object is closed); elements (``items``
   and ``prefixItems`` position by position, up to the new ``maxItems``); ``contains``,
   ``propertyNames``, ``dependentSchemas``, ``not``, ``anyOf`` (each new branch inside
   an old one, or the whole new schema inside one branch); ``oneOf``, ``if``/``then``/
   ``else`` and ``unevaluated*`` only when unchanged. Recursive definitions are
   compared coinductively: a pair already under comparison is assumed to hold, which
   is sound because every loop reads deeper into the arguments (``safety``).
4. At an ancestor of the place, what counts is which members and elements can exist
   and the ancestor's own keywords: a sibling declared by both versions is another
   place, compared only if it is protected itself.

Annotations (``title``, ``description``, ``default``, ``examples``...) admit nothing;
``contracts`` compares the titles approvers read as a display change. Pure: no Django.
"""

import json
from fractions import Fraction
from typing import Any

from approvals.policy import json_equal

from .paths import JSON_TYPES, format_types, schema_types
from .safety import TooComplex, bounded, compiled_pattern, validator_for

MAX_STEPS = 5_000
NUMBERS = frozenset({"integer", "number"})
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$schema",
        "$id",
        "$anchor",
        "$defs",
        "definitions",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
    }
)
_UNCHANGED_ONLY = ("oneOf", "unevaluatedItems", "unevaluatedProperties", "$dynamicRef")
_FALSE = object()


def _show(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 60 else text[:59] + "…"


def _anchors(document: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$anchor"), str):
                found[node["$anchor"]] = node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


class _Side:
    """One version's whole input schema, to resolve its references."""

    def __init__(self, document: Any) -> None:
        self.document = document
        self.anchors = _anchors(document)
        self.validator = validator_for(document)

    def target(self, ref: str) -> Any:
        if not ref.startswith("#"):
            return None
        fragment = ref[1:]
        if fragment and not fragment.startswith("/"):
            return self.anchors.get(fragment)
        node = self.document
        for raw in fragment.split("/")[1:]:
            token = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and token in node:
                node = node[token]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
        return node

    def flatten(self, schema: Any) -> list[Any]:
        """The schema objects whose conjunction ``schema`` is; ``[_FALSE]`` admits nothing.

        An unresolvable reference flattens to ``None`` entries, which nothing implies.
        """
        found: list[Any] = []
        seen: set[int] = set()
        stack = [schema]
        while stack:
            node = stack.pop()
            if node is True:
                continue
            if node is False:
                return [_FALSE]
            if not isinstance(node, dict):
                found.append(None)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            found.append(node)
            if isinstance(node.get("$ref"), str):
                stack.append(self.target(node["$ref"]))
            stack.extend(node.get("allOf") or [])
        return found

    def valid(self, schemas: list[Any], value: Any) -> bool:
        def check(schema: Any) -> bool:
            return bool(bounded(lambda: self.validator.evolve(schema=schema).is_valid(value)))

        return all(check(schema) for schema in schemas)


def _bound(nodes: list[dict[str, Any]], inclusive: str, exclusive: str, *, lower: bool):
    """The strongest bound of ``nodes`` as (value, exclusive), or None."""
    best: tuple[Fraction, bool] | None = None
    for node in nodes:
        for keyword, strict in ((inclusive, False), (exclusive, True)):
            value = node.get(keyword)
            if isinstance(value, int | float) and not isinstance(value, bool):
                bound = (Fraction(value), strict)
                if best is None or _tighter(bound, best, lower=lower):
                    best = bound
    return best


def _tighter(a: tuple[Fraction, bool], b: tuple[Fraction, bool], *, lower: bool) -> bool:
    """Whether bound ``a`` admits no value bound ``b`` refuses."""
    if a[0] != b[0]:
        return a[0] > b[0] if lower else a[0] < b[0]
    return a[1] or not b[1]


def _size(nodes: list[dict[str, Any]], keyword: str, *, smallest: bool) -> int | None:
    values = [n[keyword] for n in nodes if isinstance(n.get(keyword), int)]
    if not values:
        return None
    return min(values) if smallest else max(values)


class _Proof:
    def __init__(self, new: Any, old: Any) -> None:
        self.new, self.old = _Side(new), _Side(old)
        self.assumed: set[tuple[tuple[int, ...], int]] = set()
        self.steps = 0

    # --- one schema inside another ---------------------------------------------------

    def inside(
        self,
        news: list[Any],
        old: Any,
        where: str,
        *,
        child: str | None = None,
        types_compared: bool = False,
    ) -> list[str]:
        """Reasons the conjunction ``news`` may admit a value ``old`` refuses.

        ``child`` marks an ancestor of the protected place: the next token on the path.
        ``types_compared``: the caller compared the JSON types already (at the place).
        """
        self.steps += 1
        if self.steps > MAX_STEPS:
            return [f"at {where or '/'}: the schemas are too large to compare"]
        flat_new: list[Any] = []
        for schema in news:
            flat_new.extend(self.new.flatten(schema))
        if _FALSE in flat_new:
            return []
        if None in flat_new:
            # An unresolvable reference on the new side admits nothing at validation time
            # (it fails); it still proves nothing here.
            return [f"at {where or '/'}: a reference cannot be followed"]
        olds = self.old.flatten(old)
        if _FALSE in olds:
            return [f"at {where or '/'}: admits values; the active version admitted none"]
        if None in olds:
            return [f"at {where or '/'}: a reference of the active version cannot be followed"]
        key = (tuple(sorted(id(n) for n in flat_new)), id(old))
        if child is None and key in self.assumed:
            return []
        self.assumed.add(key)
        values = self._listed(flat_new)
        if values is not None:
            return self._listed_inside(values, flat_new, olds, where)
        reasons: list[str] = []
        for node in olds:
            reasons.extend(
                self._implied(flat_new, node, where, child=child, types_compared=types_compared)
            )
        return list(dict.fromkeys(reasons))

    def _listed(self, nodes: list[dict[str, Any]]) -> list[Any] | None:
        values: list[Any] | None = None
        for node in nodes:
            listed = [node["const"]] if "const" in node else node.get("enum")
            if isinstance(listed, list):
                values = (
                    listed
                    if values is None
                    else [v for v in values if any(json_equal(v, w) for w in listed)]
                )
        return values

    def _listed_inside(
        self, values: list[Any], news: list[dict[str, Any]], olds: list[Any], where: str
    ) -> list[str]:
        reasons = []
        for value in values[:200]:
            try:
                if self.new.valid(news, value) and not self.old.valid(olds, value):
                    reasons.append(
                        f"at {where or '/'}: {_show(value)} is admitted, and was refused"
                    )
            except TooComplex:
                return [f"at {where or '/'}: the listed values cannot be checked"]
        if len(values) > 200:
            reasons.append(f"at {where or '/'}: too many listed values to check")
        return reasons

    def _implied(
        self,
        news: list[dict[str, Any]],
        old: dict[str, Any],
        where: str,
        *,
        child: str | None,
        types_compared: bool,
    ) -> list[str]:
        """Reasons some keyword of the single schema object ``old`` is not implied."""
        reasons: list[str] = []

        def why(text: str) -> None:
            reasons.append(f"at {where or '/'}: {text}")

        types = frozenset(JSON_TYPES)
        for node in news:
            types &= schema_types(node)
        if not types:
            return []
        wider = types - schema_types(old)
        if wider and not types_compared:
            why(f"{format_types(frozenset(wider))} is admitted, and was refused")
        if "enum" in old or "const" in old:
            why("only listed values (enum or const) were admitted; now others are")
        for keyword in _UNCHANGED_ONLY:
            if keyword in old and not any(self._same(n, old) for n in news):
                why(f"{keyword} changed, and cannot be compared")
        if types & NUMBERS:
            self._numbers(news, old, types, why)
        if "string" in types:
            self._strings(news, old, why)
        if "array" in types:
            reasons.extend(self._arrays(news, old, where, child))
        if "object" in types:
            reasons.extend(self._objects(news, old, where, child))
        reasons.extend(self._applicators(news, old, where))
        return reasons

    # --- keywords by type ------------------------------------------------------------

    def _numbers(self, news, old, types, why) -> None:
        for lower, inclusive, exclusive in (
            (True, "minimum", "exclusiveMinimum"),
            (False, "maximum", "exclusiveMaximum"),
        ):
            before = _bound([old], inclusive, exclusive, lower=lower)
            after = _bound(news, inclusive, exclusive, lower=lower)
            if before is not None and (after is None or not _tighter(after, before, lower=lower)):
                side = "lower" if lower else "upper"
                why(f"the {side} bound is {_show_bound(after)}, was {_show_bound(before)}")
        step = old.get("multipleOf")
        if isinstance(step, int | float) and not isinstance(step, bool):
            integers = types & NUMBERS == {"integer"}
            proven = (integers and Fraction(step) == 1) or any(
                isinstance(n.get("multipleOf"), int | float)
                and (Fraction(n["multipleOf"]) / Fraction(step)).denominator == 1
                for n in news
            )
            if not proven:
                why(f"values are no longer all multiples of {step}")

    def _strings(self, news, old, why) -> None:
        for keyword, smallest in (("maxLength", True), ("minLength", False)):
            if keyword in old:
                after = _size(news, keyword, smallest=smallest)
                if after is None or (after > old[keyword] if smallest else after < old[keyword]):
                    why(
                        f"{keyword} is {after if after is not None else 'gone'}, was {old[keyword]}"
                    )
        for keyword in ("pattern", "format"):
            if keyword in old and not any(n.get(keyword) == old[keyword] for n in news):
                why(f"the {keyword} {_show(old[keyword])} no longer applies")

    def _arrays(self, news, old, where, child) -> list[str]:
        reasons: list[str] = []

        def why(text: str) -> None:
            reasons.append(f"at {where or '/'}: {text}")

        longest = _size(news, "maxItems", smallest=True)
        for keyword, smallest in (("maxItems", True), ("minItems", False)):
            if keyword in old:
                after = _size(news, keyword, smallest=smallest)
                if after is None or (after > old[keyword] if smallest else after < old[keyword]):
                    why(
                        f"{keyword} is {after if after is not None else 'gone'}, was {old[keyword]}"
                    )
        if old.get("uniqueItems") is True and not (
            any(n.get("uniqueItems") is True for n in news)
            or (longest is not None and longest <= 1)
        ):
            why("elements need no longer be unique")
        if child is None:
            reasons.extend(self._elements(news, old, where, longest))
        if "contains" in old:
            reasons.extend(self._contains(news, old, where))
        return reasons

    def _elements(self, news, old, where, longest) -> list[str]:
        def governing(node: dict[str, Any], index: int | None) -> Any:
            prefix = node.get("prefixItems") or []
            if index is not None and index < len(prefix):
                return prefix[index]
            return node.get("items", True)

        positions = max(
            [len(old.get("prefixItems") or [])] + [len(n.get("prefixItems") or []) for n in news]
        )
        reasons = []
        for index in range(positions if longest is None else min(positions, longest)):
            reasons.extend(
                self.inside(
                    [governing(n, index) for n in news], governing(old, index), f"{where}/{index}"
                )
            )
        if longest is None or longest > positions:
            reasons.extend(
                self.inside([governing(n, None) for n in news], governing(old, None), f"{where}/*")
            )
        return reasons

    def _contains(self, news, old, where) -> list[str]:
        least = old.get("minContains", 1)
        for node in news:
            if "contains" not in node or node.get("minContains", 1) < least:
                continue
            if "maxContains" in old and not (
                self._same(node["contains"], old["contains"])
                and node.get("maxContains", float("inf")) <= old["maxContains"]
            ):
                continue
            if not self.inside([node["contains"]], old["contains"], f"{where} (contains)"):
                return []
        return [f"at {where or '/'}: contains changed, and cannot be compared"]

    def _objects(self, news, old, where, child) -> list[str]:
        reasons: list[str] = []

        def why(text: str) -> None:
            reasons.append(f"at {where or '/'}: {text}")

        # At an ancestor, whether a sibling must be present is the sibling's concern, and
        # the next place on the path is compared by paths.locate.
        required = {name for n in news for name in n.get("required", [])}
        missing = [name for name in old.get("required", []) if name not in required]
        if missing and child is None:
            why(f"{', '.join(missing)} no longer required")
        for keyword, smallest in (("maxProperties", True), ("minProperties", False)):
            if keyword in old:
                after = _size(news, keyword, smallest=smallest)
                if after is None or (after > old[keyword] if smallest else after < old[keyword]):
                    why(
                        f"{keyword} is {after if after is not None else 'gone'}, was {old[keyword]}"
                    )
        for name, all_needs in (old.get("dependentRequired") or {}).items():
            needs = all_needs if child is None else [n for n in all_needs if n == child]
            have = required | {
                d for n in news for d in (n.get("dependentRequired") or {}).get(name, [])
            }
            if set(needs) - have:
                why(f"with {name}, {', '.join(sorted(set(needs) - have))} no longer required")
        for name, schema in (old.get("dependentSchemas") or {}).items():
            if not any(
                name in (n.get("dependentSchemas") or {})
                and not self.inside([n["dependentSchemas"][name]], schema, where)
                for n in news
            ):
                why(f"the dependent schema of {name} changed, and cannot be compared")
        if "propertyNames" in old and not self._names_inside(news, old["propertyNames"], where):
            why("more member names are admitted")
        reasons.extend(self._members(news, old, where, child))
        return reasons

    def _names_inside(self, news, names_schema, where) -> bool:
        for node in news:
            if "propertyNames" in node and not self.inside(
                [node["propertyNames"]], names_schema, f"{where} (names)"
            ):
                return True
            if _closed(node):
                try:
                    if self.old.valid([names_schema], None) or all(
                        self.old.valid([names_schema], name) for name in node.get("properties", {})
                    ):
                        return True
                except TooComplex:
                    return False
        return False

    def _members(self, news, old, where, child) -> list[str]:
        declared_old = old.get("properties") or {}
        declared_new = {name for n in news for name in (n.get("properties") or {})}
        reasons = []
        for name in sorted(set(declared_old) | declared_new):
            if child is not None and name in declared_old and name in declared_new:
                # The path itself, or a sibling: another place (docstring, step 4).
                continue
            olds = self._governing(old, name)
            if False in olds:
                reasons.append(f"at {where or '/'}: a member {name!r} is admitted, and was refused")
                continue
            for governing in olds:
                reasons.extend(
                    self.inside(
                        [g for n in news for g in self._governing(n, name)],
                        governing,
                        f"{where}/{_escape(name)}",
                    )
                )
        reasons.extend(self._others_inside(news, old, where))
        return reasons

    def _governing(self, node: dict[str, Any], name: str) -> list[Any]:
        """The schemas that apply to member ``name`` of an object valid against ``node``."""
        found = []
        if name in (node.get("properties") or {}):
            found.append(node["properties"][name])
        matched = [
            s
            for p, s in (node.get("patternProperties") or {}).items()
            if compiled_pattern(p).search(name)
        ]
        found.extend(matched)
        if not found and "additionalProperties" in node:
            found.append(node["additionalProperties"])
        return found

    def _others_inside(self, news, old, where) -> list[str]:
        """Reasons members no ``properties`` names may be admitted more than before."""
        patterns = old.get("patternProperties") or {}
        extra = old.get("additionalProperties", True)
        if not patterns and (extra is True or extra == {}):
            return []
        found: list[str] | None = None
        for node in news:
            if _closed(node):
                return []
            theirs = node.get("patternProperties") or {}
            if theirs.keys() == patterns.keys() and all(
                self._same(theirs[p], patterns[p]) for p in patterns
            ):
                found = self.inside([node.get("additionalProperties", True)], extra, f"{where}/*")
                if not found:
                    return []
                if extra is False:
                    found = [
                        f"at {where or '/'}: members it does not declare are admitted, and were "
                        "refused (additionalProperties)"
                    ]
        return found or [
            f"at {where or '/'}: patternProperties or additionalProperties changed: other "
            "member names may be admitted"
        ]

    def _applicators(self, news, old, where) -> list[str]:
        reasons = []
        if "anyOf" in old and not self._any_inside(news, old["anyOf"], where):
            reasons.append(f"at {where or '/'}: anyOf changed, and cannot be compared")
        if "not" in old and not any(
            "not" in n and not self.inside([old["not"]], n["not"], where) for n in news
        ):
            # not X ⊆ not Y exactly when Y ⊆ X: the roles swap.
            reasons.append(f"at {where or '/'}: not changed, and cannot be compared")
        if any(k in old for k in ("if", "then", "else")) and not any(
            all(
                (k in n) == (k in old) and (k not in old or self._same(n[k], old[k]))
                for k in ("if", "then", "else")
            )
            for n in news
        ):
            reasons.append(f"at {where or '/'}: if/then/else changed, and cannot be compared")
        return reasons

    def _any_inside(self, news, branches, where) -> bool:
        if any(not self.inside(news, branch, where) for branch in branches):
            return True
        for node in news:
            theirs = node.get("anyOf")
            if isinstance(theirs, list) and all(
                any(not self.inside([mine], branch, where) for branch in branches)
                for mine in theirs
            ):
                return True
        return False

    def _same(self, a: Any, b: Any) -> bool:
        """Structural equality of a new and an old schema, references followed."""
        pairs = [(a, b)]
        seen: set[tuple[int, int]] = set()
        while pairs:
            x, y = pairs.pop()
            if isinstance(x, dict) and isinstance(y, dict):
                if (id(x), id(y)) in seen:
                    continue
                seen.add((id(x), id(y)))
                keys = {k for k in x.keys() | y.keys() if k not in ANNOTATIONS}
                if any((k in x) != (k in y) for k in keys):
                    return False
                for k in keys:
                    if k == "$ref":
                        pairs.append((self.new.target(x[k]), self.old.target(y[k])))
                    elif k in ("enum", "const", "required", "type", "pattern", "format"):
                        if not json_equal(x[k], y[k]):
                            return False
                    else:
                        pairs.append((x[k], y[k]))
            elif isinstance(x, list) and isinstance(y, list):
                if len(x) != len(y):
                    return False
                pairs.extend(zip(x, y, strict=True))
            elif not json_equal(x, y):
                return False
        return True


def _closed(node: dict[str, Any]) -> bool:
    return node.get("additionalProperties") is False and not node.get("patternProperties")


def _show_bound(bound: tuple[Fraction, bool] | None) -> str:
    if bound is None:
        return "none"
    value = bound[0]
    shown = str(value.numerator) if value.denominator == 1 else str(float(value))
    return f"{shown} (exclusive)" if bound[1] else shown


def _walk(schema: Any, tokens: tuple[str, ...]) -> list[Any]:
    """The schema at each step of a path that ``paths.locate`` already proved."""
    nodes = [schema]
    for token in tokens:
        node = nodes[-1]
        members = node.get("properties") or {}
        nodes.append(members[token] if token in members else node["items"])
    return nodes


def widenings(old: Any, new: Any, tokens: tuple[str, ...]) -> list[str]:
    """Reasons the new schema may admit, at the place ``tokens`` or an ancestor on its
    path, a value the old one refused (module docstring). Both schemas declare the place
    (``paths.locate``); its type and presence are compared there.
    """
    proof = _Proof(new, old)
    old_nodes, new_nodes = _walk(old, tokens), _walk(new, tokens)
    reasons: list[str] = []
    for depth, token in enumerate(tokens):
        where = _pointer(tokens[:depth])
        reasons.extend(proof.inside([new_nodes[depth]], old_nodes[depth], where, child=token))
    # At the place itself the type is compared by locate, which also follows anyOf.
    reasons.extend(
        proof.inside([new_nodes[-1]], old_nodes[-1], _pointer(tokens), types_compared=True)
    )
    return list(dict.fromkeys(reasons))


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _pointer(tokens: tuple[str, ...]) -> str:
    return "".join("/" + _escape(t) for t in tokens)
