"""Which test modules the marker expression (``-m``) deselects whole, read from their source.

Collection imports every test module, also those whose every test ``make check``'s
``-m "not slow and not browser"`` then deselects, and some of those are the heaviest to
import: the MCP gateway tests load the MCP SDK, and schemathesis reads the OpenAPI
document and builds every operation's cases while the module is collected. A module
whose top-level ``pytestmark`` alone rules it out, whatever marks its tests add, need
not be imported at all (``pytest_ignore_collect`` in tests/conftest.py).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path

from _pytest.mark.expression import Expression


class _MarkWithArguments(Exception):
    """The expression asks for a mark's arguments, which the source does not settle."""


def module_marks(source: str) -> frozenset[str]:
    """The names of the marks a module gives all its tests with ``pytestmark =
    pytest.mark.NAME`` or a list of them; other items of the list are not read."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets
        ):
            items = (
                node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            )
            return frozenset(name for item in items if (name := _mark_name(item)) is not None)
    return frozenset()


def _mark_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "pytest"
    ):
        return node.attr
    return None


def never_selected(expression: str, marks: frozenset[str]) -> bool:
    """Whether ``expression`` is false for a test with ``marks`` and any others besides:
    every mark the expression names and ``marks`` lacks is tried both absent and present.
    An expression that asks for a mark's arguments is never settled here."""
    compiled = Expression.compile(expression)
    others = sorted(compiled.idents() - marks)
    try:
        return not any(
            compiled.evaluate(_matcher(marks | set(itertools.compress(others, present))))
            for present in itertools.product((False, True), repeat=len(others))
        )
    except _MarkWithArguments:
        return False


def _matcher(marks: frozenset[str]) -> Callable[..., bool]:
    def matcher(name: str, /, **kwargs: object) -> bool:
        if kwargs:
            raise _MarkWithArguments(name)
        return name in marks

    return matcher


def deselected_whole(path: Path, *, expression: str, patterns: list[str]) -> bool:
    """Whether the test module at ``path`` (a file matching ``patterns``, pytest's
    ``python_files``) has a ``pytestmark`` that ``expression`` never selects."""
    if not expression or path.suffix != ".py" or not any(fnmatch(path.name, p) for p in patterns):
        return False
    source = path.read_text(encoding="utf-8")
    # Most modules have no pytestmark: they are not parsed.
    if "pytestmark" not in source:
        return False
    return never_selected(expression, module_marks(source))
