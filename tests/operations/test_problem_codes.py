"""``problem_codes()`` lists every code an API problem can carry, with its one status: the
list the clients' typed errors are held to. These find every way the source makes a
problem and fail when the list misses one."""

import ast
import json
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from operations.http import problems
from tests.conftest import make_runner

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("operations", "approvals", "console")


def _sources() -> list[Path]:
    return sorted(
        path
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


def _literal(node: ast.AST) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _problem_calls() -> tuple[set[tuple[str, int]], list[str]]:
    """The ``(code, status)`` of each ``problem(<status>, "<code>", ...)`` call, and where
    a call passes its code otherwise (``path:function``)."""
    literal, dynamic = set(), []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "problem"):
                    continue
                status, code = (_literal(arg) for arg in node.args[:2])
                if isinstance(status, int) and isinstance(code, str):
                    literal.add((code, status))
                else:
                    dynamic.append(f"{path.relative_to(ROOT)}:{function.name}")
    return literal, dynamic


def _refusal_classes() -> set[tuple[str, int]]:
    """The ``(code, status)`` each class body in the source assigns
    (``code, status, title = "retry_later", 409, "..."``)."""
    found = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            values: dict[str, object] = {}
            for statement in node.body:
                if not isinstance(statement, ast.Assign) or len(statement.targets) != 1:
                    continue
                target, value = statement.targets[0], statement.value
                if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                    for name, item in zip(target.elts, value.elts, strict=True):
                        values[getattr(name, "id", "")] = _literal(item)
                elif isinstance(target, ast.Name):
                    values[target.id] = _literal(value)
            code, status = values.get("code"), values.get("status")
            if isinstance(code, str) and isinstance(status, int):
                found.add((code, status))
    return found


def test_every_problem_call_in_the_source_is_listed_with_its_status():
    codes = problems.problem_codes()
    literal, dynamic = _problem_calls()
    assert ("internal_error", 500) in literal
    assert ("not_found", 404) in literal
    missing = sorted(pair for pair in literal if codes.get(pair[0]) != pair[1])
    assert not missing, f"problem() calls whose (code, status) problem_codes() lacks: {missing}"
    # The only calls that pass a code they did not write: the exception handler's, for a
    # Refusal and for a DRF exception, both of which problem_codes() walks.
    assert sorted(set(dynamic)) == ["operations/http/problems.py:exception_handler"], dynamic
    assert len(dynamic) == 2, dynamic


def test_every_refusal_class_in_the_source_is_listed_with_its_status():
    codes = problems.problem_codes()
    declared = _refusal_classes()
    assert {("tool_not_owned", 403), ("invalid_principal", 400), ("policy_invalid", 422)} <= (
        declared
    )
    missing = sorted(pair for pair in declared if codes.get(pair[0]) != pair[1])
    assert not missing, f"refusals whose (code, status) problem_codes() lacks: {missing}"


def test_the_drf_exceptions_the_handler_maps_are_listed():
    codes = problems.problem_codes()
    expected = {
        "not_authenticated": 401,
        "forbidden": 403,
        "not_found": 404,
        "method_not_allowed": 405,
        "not_acceptable": 406,
        "unsupported_media_type": 415,
        "malformed_json": 400,
        "invalid_request": 400,
        "rate_limited": 429,
        "payload_too_large": 413,
    }
    assert {code: codes.get(code) for code in expected} == expected
    assert all(400 <= status < 600 for status in codes.values())


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "body", "content_type", "headers"),
    [
        ("GET", "/api/v1/tools", None, None, {}),  # no token
        ("DELETE", "/api/v1/runs", None, None, {"auth": True}),
        ("POST", "/api/v1/runs", "principal=x", "text/plain", {"auth": True}),
        ("POST", "/api/v1/runs", "{", "application/json", {"auth": True}),
        ("POST", "/api/v1/runs", '{"nope": 1}', "application/json", {"auth": True}),
        ("POST", "/api/v1/runs", '{"n": 1e300}', "application/json", {"auth": True}),
        ("GET", "/api/v1/tools", None, None, {"auth": True, "HTTP_ACCEPT": "text/html"}),
        ("GET", "/api/v1/nothing", None, None, {"auth": True}),
        ("GET", "/api/v1/operations/op_x", None, None, {"auth": True}),
    ],
)
def test_what_the_handlers_answer_is_listed(method, path, body, content_type, headers):
    client = APIClient()
    extra = dict(headers)
    if extra.pop("auth", False):
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {make_runner().token}")
    kwargs = {"content_type": content_type} if content_type else {}
    response = client.generic(method, path, body or "", **kwargs, **extra)
    answer = json.loads(response.content)
    assert response.status_code >= 400, answer
    assert problems.problem_codes()[answer["code"]] == response.status_code == answer["status"]
