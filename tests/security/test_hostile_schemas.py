"""A contract's input_schema is hostile: it reaches nothing outside itself, runs in linear
time, and cannot crash or hold a worker (operations/contracts/safety.py).

Each attack is tried at registration (``PUT /tools``: 422 ``invalid_contract`` naming the
place) and, for versions stored before the checks existed, at the registration of an
operation (422 ``invalid_arguments``, never a fetch, a file read, a 500 or a hang).
"""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from operations.contracts.safety import MAX_STRING, WORK_LIMIT
from operations.models import Operation, ToolVersion
from tests.conftest import contract


class SchemaHost:
    """An HTTP server on loopback that would hand out a permissive schema, and counts
    every request it gets: a test passes only if it got none."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                host.requests.append(self.path)
                body = json.dumps({"type": "string"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        # shutdown() waits until serve_forever notices, which it checks every
        # poll_interval (half a second by default): that would be each test's teardown.
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/latest/meta-data/"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def schema_host():
    host = SchemaHost()
    yield host
    host.close()


def _schema(note: dict, **extra) -> dict:
    return {
        "type": "object",
        "required": ["note"],
        "properties": {"note": note},
        "additionalProperties": False,
        **extra,
    }


def _put(api, name: str, schema: dict):
    return api.put(f"/api/v1/tools/{name}", contract("idempotent", input_schema=schema))


def _store_legacy(api, name: str, schema: dict) -> None:
    """A version stored before the checks existed: registered clean, then its schema
    replaced in the database as an older release would have accepted it."""
    assert _put(api, name, _schema({"type": "string"})).status_code == 201
    version = ToolVersion.objects.get(tool_id=name)
    version.contract = {**version.contract, "input_schema": schema}
    version.save(update_fields=["contract"])


@pytest.mark.parametrize(
    "ref",
    [
        "http://127.0.0.1:9/latest/meta-data/",
        "https://example.com/schema.json",
        "file:///etc/passwd",
        "/etc/passwd",
        "other.json#/x",
        "urn:example:schema",
    ],
)
def test_a_ref_outside_the_document_is_refused_at_put(api, ref):
    response = _put(api, "remote_ref", _schema({"$ref": ref}))
    assert response.status_code == 422, response.json()
    problem = response.json()
    assert problem["code"] == "invalid_contract"
    assert problem["errors"][0]["path"] == "/input_schema/properties/note/$ref"
    assert "refers outside the schema" in problem["errors"][0]["message"]
    assert not ToolVersion.objects.filter(tool_id="remote_ref").exists()


def test_registration_never_fetches_a_remote_ref_of_a_legacy_version(api, schema_host):
    _store_legacy(api, "legacy_ref", _schema({"$ref": schema_host.url}))
    run = api.run()
    response = api.post(
        "/api/v1/operations",
        {"run": run, "tool": "legacy_ref", "operation_key": "k1", "arguments": {"note": "x"}},
    )
    assert response.status_code == 422, response.json()
    assert response.json()["code"] == "invalid_arguments"
    assert "not in it" in response.json()["detail"]
    assert schema_host.requests == []
    assert not Operation.objects.filter(tool_id="legacy_ref").exists()


def test_a_put_with_a_remote_ref_fetches_nothing(api, schema_host):
    assert _put(api, "fetching", _schema({"$ref": schema_host.url})).status_code == 422
    assert schema_host.requests == []


def test_a_legacy_file_ref_answers_the_same_whether_the_file_exists(api, tmp_path):
    present = tmp_path / "present.json"
    present.write_text('{"type": "string"}')
    answers = []
    for name, path in (("file_a", present), ("file_b", tmp_path / "missing.json")):
        _store_legacy(api, name, _schema({"$ref": path.as_uri()}))
        response = api.post(
            "/api/v1/operations",
            {"run": api.run(), "tool": name, "operation_key": name, "arguments": {"note": "x"}},
        )
        answers.append((response.status_code, response.json()["code"]))
    assert answers == [(422, "invalid_arguments"), (422, "invalid_arguments")]


@pytest.mark.parametrize(
    ("schema", "path", "words"),
    [
        (
            _schema({"$ref": "#/$defs/a"}, **{"$defs": {"a": {"$ref": "#/$defs/a"}}}),
            "/input_schema/$defs/a",
            "loop without reading deeper",
        ),
        (
            _schema(
                {"$ref": "#/$defs/a"},
                **{
                    "$defs": {
                        "a": {"allOf": [{"$ref": "#/$defs/b"}]},
                        "b": {"not": {"$ref": "#/$defs/a"}},
                    }
                },
            ),
            "/input_schema/$defs/a",
            "loop without reading deeper",
        ),
        (_schema({"$ref": "#/$defs/nope"}), "/input_schema/properties/note/$ref", "not a schema"),
        (
            _schema({"$dynamicRef": "#meta"}),
            "/input_schema/properties/note/$dynamicRef",
            "not supported",
        ),
        (
            _schema({"$id": "http://127.0.0.1:9/x", "type": "string"}),
            "/input_schema/properties/note/$id",
            "only at the top level",
        ),
    ],
)
def test_reference_loops_and_dangling_references_are_refused_at_put(api, schema, path, words):
    response = _put(api, "loops", schema)
    assert response.status_code == 422, response.json()
    error = response.json()["errors"][0]
    assert (error["path"], words in error["message"]) == (path, True), error


def test_a_fan_out_of_references_past_the_limit_is_refused(api):
    defs = {
        f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(12)
    }
    defs["d12"] = {"type": "string"}
    response = _put(api, "fan", _schema({"$ref": "#/$defs/d0"}, **{"$defs": defs}))
    assert response.status_code == 422
    assert "expands to" in response.json()["errors"][0]["message"]


def test_local_refs_and_recursive_definitions_still_work(api):
    schema = _schema(
        {"$ref": "#/$defs/node"},
        **{
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {
                        "label": {"$ref": "#label"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                    },
                    "additionalProperties": False,
                },
                "label": {"$anchor": "label", "type": "string", "maxLength": 3},
            }
        },
    )
    assert _put(api, "tree", schema).status_code == 201
    run = api.run()
    good = {"note": {"label": "a", "children": [{"label": "b", "children": []}]}}
    bad = {"note": {"label": "a", "children": [{"label": "toolong"}]}}
    api.register(run, "tree", good)
    response = api.post(
        "/api/v1/operations",
        {"run": run, "tool": "tree", "operation_key": "bad", "arguments": bad},
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["path"] == "/arguments/note/children/0/label"


def test_a_legacy_self_reference_answers_422_not_500(api):
    _store_legacy(
        api,
        "legacy_loop",
        _schema({"$ref": "#/$defs/a"}, **{"$defs": {"a": {"$ref": "#/$defs/a"}}}),
    )
    response = api.post(
        "/api/v1/operations",
        {"run": api.run(), "tool": "legacy_loop", "operation_key": "k", "arguments": {"note": 1}},
    )
    assert response.status_code == 422, response.content
    assert response.json()["code"] == "invalid_arguments"


# --- Patterns run in linear time -------------------------------------------------------


CHILD = """
import json, sys
from operations.contracts.arguments import validate_arguments
from operations.errors import InvalidArguments
schema, arguments = json.loads(sys.stdin.read())
try:
    validate_arguments(schema, arguments)
except InvalidArguments:
    print("refused")
else:
    print("valid")
"""


def _validate_in_child(schema: dict, arguments: dict) -> str:
    """What registration's validation answers, computed in a child process: Python's
    regular expression engine holds the interpreter lock while it backtracks, so a
    pinned validation in this process would freeze the test itself rather than fail it."""
    try:
        completed = subprocess.run(
            [sys.executable, "-c", CHILD],
            input=json.dumps([schema, arguments]),
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("validating 61 characters against the pattern took over 30 s")
    return completed.stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("schema", "arguments", "status"),
    [
        (_schema({"type": "string", "pattern": "^(a|a)+$"}), {"note": "a" * 60 + "b"}, 422),
        (
            # The name matches no pattern, so nothing applies to its value.
            _schema({"type": "object", "patternProperties": {"^(a|a)+$": {"type": "string"}}}),
            {"note": {"a" * 60 + "b": 1}},
            201,
        ),
        (
            _schema(
                {
                    "type": "object",
                    "patternProperties": {"^(a+)+$": {"type": "integer"}},
                    "additionalProperties": False,
                }
            ),
            {"note": {"a" * 60 + "!": 1}},
            422,
        ),
        (
            _schema({"type": "object", "propertyNames": {"pattern": "^(a|aa)+$"}}),
            {"note": {"a" * 60 + "b": 1}},
            422,
        ),
    ],
    ids=["pattern", "patternProperties", "additionalProperties", "propertyNames"],
)
def test_a_backtracking_pattern_does_not_hold_a_worker(api, schema, arguments, status):
    """60 characters would take Python's engine longer than the universe has existed
    (each doubles it); RE2 answers in microseconds. The child's timeout only bounds how
    long the test waits for an answer that must come; then the API gives it."""
    assert _validate_in_child(schema, arguments) == ("valid" if status == 201 else "refused")
    assert _put(api, "redos", schema).status_code == 201
    response = api.post(
        "/api/v1/operations",
        {"run": api.run(), "tool": "redos", "operation_key": "redos", "arguments": arguments},
    )
    assert response.status_code == status, response.json()


@pytest.mark.parametrize(
    ("pattern", "why"),
    [("(a)\\1", "back references"), ("(?=a)b", "look-around"), ("(?<!a)b", "look-around")],
)
def test_a_pattern_re2_cannot_run_is_refused_at_put(api, pattern, why):
    for schema, path in (
        (_schema({"type": "string", "pattern": pattern}), "/properties/note/pattern"),
        (
            _schema({"type": "object", "patternProperties": {pattern: {}}}),
            "/properties/note/patternProperties/" + pattern,
        ),
    ):
        response = _put(api, "nore2", schema)
        assert response.status_code == 422, response.json()
        error = response.json()["errors"][0]
        assert error["path"] == "/input_schema" + path
        assert "linear time" in error["message"]
        assert why in error["message"]


def test_patterns_follow_json_schema_not_python(api):
    """RE2's ``$`` ends the text (ECMA-262), Python's also matches before a final newline;
    ``\\d`` is ASCII in both ECMA-262 and RE2, Unicode in Python."""
    assert (
        _put(api, "digits", _schema({"type": "string", "pattern": "^[0-9a-z]+\\d$"})).status_code
        == 201
    )
    run = api.run()
    api.register(run, "digits", {"note": "ab1"})
    for index, text in enumerate(("ab1\n", "ab\u0661")):
        response = api.post(
            "/api/v1/operations",
            {
                "run": run,
                "tool": "digits",
                "operation_key": f"d{index}",
                "arguments": {"note": text},
            },
        )
        assert response.status_code == 422, text


def test_unevaluated_properties_beside_pattern_properties_is_refused(api):
    schema = _schema(
        {"type": "object", "patternProperties": {"^x": {}}, "unevaluatedProperties": False}
    )
    response = _put(api, "uneval", schema)
    assert response.status_code == 422
    assert "unevaluatedProperties" in response.json()["errors"][0]["message"]


# --- Bounded work ----------------------------------------------------------------------


def test_exponential_validation_work_is_refused_not_run(api):
    """Two allOf branches over a recursive definition: each level doubles the work, so
    30 levels of arguments would be a billion steps. The budget stops it."""
    node = {
        "allOf": [
            {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}},
            {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}},
        ]
    }
    assert (
        _put(api, "doubling", _schema({"$ref": "#/$defs/n"}, **{"$defs": {"n": node}})).status_code
        == 201
    )
    arguments: dict = {}
    for _ in range(30):
        arguments = {"c": arguments}
    response = api.post(
        "/api/v1/operations",
        {
            "run": api.run(),
            "tool": "doubling",
            "operation_key": "deep",
            "arguments": {"note": arguments},
        },
    )
    assert response.status_code == 422, response.json()
    assert f"more than {WORK_LIMIT} steps" in response.json()["detail"]
    assert not Operation.objects.filter(tool_id="doubling").exists()


def test_an_argument_string_is_bounded(api):
    assert _put(api, "long", _schema({"type": "string"})).status_code == 201
    run = api.run()
    api.register(run, "long", {"note": "x" * MAX_STRING}, operation_key="fits")
    response = api.post(
        "/api/v1/operations",
        {
            "run": run,
            "tool": "long",
            "operation_key": "over",
            "arguments": {"note": "x" * (MAX_STRING + 1)},
        },
    )
    assert response.status_code == 422
    assert response.json()["errors"] == [
        {"path": "/arguments/note", "message": f"longer than {MAX_STRING}"}
    ]
