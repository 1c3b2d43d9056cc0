"""docs/api.md keeps up with the server.

A newcomer integrates from docs/api.md (and docs/client.md) alone, so these fail when
the server grows something the reference does not name: an endpoint of the OpenAPI
document, a problem ``code``, a webhook event type. They also keep the docs
self-contained (no reference to documents outside the repository) and every ```json
block parseable. Each failure names what is missing and where to add it.
"""

import ast
import inspect
import json
import re
from pathlib import Path

import pytest
from drf_spectacular.generators import SchemaGenerator

from approvals import errors as approval_errors
from approvals.errors import Refusal
from operations import errors as operation_errors
from operations.http import problems, serializers
from operations.machine import EventKind, Status
from tests.docs.blocks import DOCS, ROOT, all_blocks, fenced_blocks

API_MD = DOCS / "api.md"
API_PREFIX = "/api/v1"
HTTP_METHODS = ("get", "put", "post", "patch", "delete")

# Inline code spans: `POST /operations`, `retry_later`.
CODE_SPAN = re.compile(r"`([^`\n]+)`")
# A span that names an endpoint: the method in capitals, one space, the path.
ENDPOINT_SPAN = re.compile(r"^(GET|PUT|POST|PATCH|DELETE) (/\S*)$")


def _spans(text: str) -> set[str]:
    return set(CODE_SPAN.findall(text))


def _api_text() -> str:
    return API_MD.read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section, up to the next second-level heading."""
    lines = text.splitlines()
    try:
        start = lines.index(f"## {heading}")
    except ValueError:
        pytest.fail(f"docs/api.md has no '## {heading}' section")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return "\n".join(lines[start:end])


def _python_files(*packages: str) -> list[Path]:
    return sorted(
        path
        for package in packages
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


def _tree(path: Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _string(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


# --- endpoints ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def openapi_endpoints() -> set[str]:
    """Every endpoint of the OpenAPI document, as docs/api.md writes it:
    ``POST /operations/{operation_id}/attempts``."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    endpoints = set()
    for path, item in schema["paths"].items():
        assert path.startswith(API_PREFIX + "/"), path
        for method in item:
            if method in HTTP_METHODS:
                endpoints.add(f"{method.upper()} {path.removeprefix(API_PREFIX)}")
    assert endpoints, "the OpenAPI document lists no endpoint"
    return endpoints


def test_every_endpoint_of_the_openapi_document_is_documented(openapi_endpoints):
    spans = _spans(_api_text())
    missing = sorted(openapi_endpoints - spans)
    assert not missing, (
        "docs/api.md does not document these endpoints of the OpenAPI document (write each "
        "as a code span, e.g. `POST /operations/{operation_id}/attempts`, with its body, "
        "answers and refusals):\n  " + "\n  ".join(missing)
    )


def test_every_documented_endpoint_exists(openapi_endpoints):
    # A query string is documentation (`GET /operations?status=&run=`), not the path.
    documented = {
        span.partition("?")[0] for span in _spans(_api_text()) if ENDPOINT_SPAN.match(span)
    }
    unknown = sorted(documented - openapi_endpoints)
    assert not unknown, (
        "docs/api.md names endpoints the server does not have (a removed endpoint, or a "
        "path parameter spelt otherwise than in the OpenAPI document):\n  " + "\n  ".join(unknown)
    )


# --- problem codes -----------------------------------------------------------------------


def _refusal_codes() -> set[str]:
    """The ``code`` of every typed refusal the services and approvals raise."""
    codes = set()
    for module in (operation_errors, approval_errors):
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, Refusal):
                codes.add(value.code)
    return codes


def _literal_codes(path: Path) -> set[str]:
    """Codes written as literals in the HTTP layer: ``problem(404, "not_found", ...)``,
    ``code="..."``, ``{"code": "..."}`` and the fallback of ``next(..., "...")``."""
    codes = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name == "problem" and len(node.args) > 1 and (code := _string(node.args[1])):
                codes.add(code)
            if name == "next" and len(node.args) == 2 and (code := _string(node.args[1])):
                codes.add(code)
            for keyword in node.keywords:
                if keyword.arg == "code" and (code := _string(keyword.value)):
                    codes.add(code)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if _string(key) == "code" and (code := _string(value)):
                    codes.add(code)
    return codes


def _server_problem_codes() -> set[str]:
    codes = _refusal_codes() | set(problems.problem_codes())
    codes |= {code for _, code in problems._DRF_CODES}
    for module in (problems, operation_errors):
        codes |= _literal_codes(Path(inspect.getfile(module)))
    codes |= _literal_codes(ROOT / "operations" / "http" / "views.py")
    return codes


def test_every_problem_code_is_documented():
    codes = _server_problem_codes()
    # The collection itself must keep working: these come from each source above.
    assert {"stale_attempt", "decision_refused", "not_acceptable", "internal_error"} <= codes
    spans = _spans(_section(_api_text(), "Errors"))
    missing = sorted(codes - spans)
    assert not missing, (
        "the Errors section of docs/api.md names no problem with these codes (add each, as "
        "a code span, to its table and to the refusals of the endpoints that answer it):\n  "
        + "\n  ".join(missing)
    )


def test_the_table_of_codes_is_the_servers_list_with_its_statuses():
    """The table "Every code the server answers" is ``problem_codes()``, status for status."""
    documented: dict[str, int] = {}
    for line in _section(_api_text(), "Errors").splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            for code in CODE_SPAN.findall(cells[1]):
                documented[code] = int(cells[0])
    assert documented == problems.problem_codes()


# --- webhook event types -----------------------------------------------------------------


def _server_event_types() -> set[str]:
    """Every webhook event type the outbox can be given: the subscribable list, one
    ``operation.<status>`` per status, and every literal ``event_type="..."`` in the
    server's code."""
    types = set(serializers.EVENT_TYPES)
    types |= {f"operation.{status.value}" for status in Status}
    for path in _python_files("operations", "approvals"):
        for node in ast.walk(_tree(path)):
            is_event_type = isinstance(node, ast.keyword) and node.arg == "event_type"
            if is_event_type and (value := _string(node.value)) is not None:
                types.add(value)
    return types


def test_every_webhook_event_type_is_documented():
    types = _server_event_types()
    assert {"approval.decided", "approval.escalated", "operation.superseded"} <= types
    section = _spans(_section(_api_text(), "Webhooks"))
    missing = sorted(types - section)
    assert not missing, (
        "the Webhooks section of docs/api.md does not document these event types (name "
        "each as a code span and say what its `data` carries):\n  " + "\n  ".join(missing)
    )


# --- the docs stand on their own (and refer to nothing outside: test_references.py) ------


# --- event kinds --------------------------------------------------------------------------


def _documented_event_kinds() -> tuple[set[str], set[str]]:
    """The kinds the Reading section names: those of an operation's stream (the ``kind``
    row of the event table) and those of the other streams (the paragraph after it)."""
    section = _section(_api_text(), "Reading")
    row = next((line for line in section.splitlines() if line.startswith("| `kind` |")), "")
    others = next(
        (part for part in section.split("\n\n") if part.startswith("The ledger's other streams")),
        "",
    )
    assert row, "the event table of docs/api.md's Reading section has no `kind` row"
    assert others, "docs/api.md's Reading section no longer lists the other streams' kinds"
    return _spans(row.split("|")[2]), _spans(others)


def test_the_documented_event_kinds_are_exactly_the_ones_the_server_writes():
    on_operations, elsewhere = _documented_event_kinds()
    assert {"registered", "claimed", "webhook_redelivery"} <= on_operations
    assert {"run_created", "token_created", "signed_in", "archived"} <= elsewhere
    assert not on_operations & elsewhere, "a kind is listed on two kinds of stream"
    written = {kind.value for kind in EventKind}
    documented = on_operations | elsewhere
    assert not written - documented, (
        "docs/api.md's Reading section does not list these event kinds "
        f"(operations.machine.EventKind): {sorted(written - documented)}"
    )
    assert not documented - written, (
        f"docs/api.md's Reading section lists kinds no code writes: {sorted(documented - written)}"
    )


def _json_problem(content: str) -> str | None:
    """None when the block is JSON as it stands, or the members of an object (wrapped in
    braces); otherwise what the parser says."""
    try:
        json.loads(content)
        return None
    except ValueError as error:
        first = error
    try:
        json.loads("{" + content + "}")
        return None
    except ValueError as error:
        return f"as it stands: {first}; wrapped in braces: {error}"


def test_fenced_block_parser_finds_blocks():
    text = (
        'x\n```json\n{"a": 1}\n```\n- item\n\n  ```json\n  "b": 2\n  ```\n'
        "```text output\n...\n```\n"
    )
    assert [(b.line, b.lang, b.info, b.text) for b in fenced_blocks(text)] == [
        (2, "json", (), '{"a": 1}'),
        (7, "json", (), '"b": 2'),
        (10, "text", ("output",), "..."),
    ]


def test_every_json_block_parses():
    found = []
    checked = 0
    for block in all_blocks():
        if block.lang != "json":
            continue
        checked += 1
        if (error := _json_problem(block.text)) is not None:
            found.append(f"{block.where}: {error}")
    assert checked, "no ```json block found: the fence parser is broken"
    assert not found, (
        "these ```json blocks are not JSON, as they stand or wrapped in braces (no comments "
        "and no ... placeholders; use ```text for a schematic block):\n  " + "\n  ".join(found)
    )
