"""Schemathesis against the OpenAPI document: every documented operation, with generated
valid and invalid requests, in-process through the WSGI application.

Checks on every answer: no 5xx, status codes, content types, headers and bodies as the
document says, schema-invalid requests refused, and requests without the token refused.
Path ids are random strings or, half of the time, ids of real objects in every state
(tests/fuzz/conftest.py), so the fuzzer reaches the service code, not only 404s.

The document is read once, at collection, from the application itself. CI runs this on
PostgreSQL; examples per operation are bounded by FUZZ_EXAMPLES (default 25), and runs
are derandomized (stable in CI) unless FUZZ_RANDOM is set.
"""

import os

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from .conftest import Known, build_world, count

# Minutes of generated cases: in `make test` and CI, not in `make check`.
pytestmark = pytest.mark.slow
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
APP = get_wsgi_application()


schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", APP)
KNOWN: dict[str, Known] = {}


@schema.hook
def flatmap_path_parameters(context, path_parameters):
    """Half of the cases aim at real objects of the current test's world."""
    if not path_parameters or "world" not in KNOWN:
        return st.just(path_parameters)
    values = KNOWN["world"].values()
    real = {name: st.sampled_from(values[name]) for name in path_parameters if values.get(name)}
    if not real:
        return st.just(path_parameters)
    fixed = {name: st.just(value) for name, value in path_parameters.items()}
    return st.one_of(st.just(path_parameters), st.fixed_dictionaries({**fixed, **real}))


def _token(*args) -> str | None:
    return KNOWN["world"].api.token if "world" in KNOWN else None


@schema.auth(cache_by_key=_token)
class RunnerToken:
    """The current world's runner token, applied as schemathesis's own authentication, so
    that it knows which requests carry it (and sends some without, expecting a 401)."""

    def get(self, case, context):
        return _token()

    def set(self, case, data, context):
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


MAX_SAFE = 2**53 - 1


def _representable(value) -> bool:
    """No U+0000 and no number beyond ±(2^53-1): JSON the schema allows but the strict
    parser refuses on purpose (tests/security/test_bad_input.py covers those)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return False
        if isinstance(item, int | float) and not isinstance(item, bool) and abs(item) > MAX_SAFE:
            return False
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


@schema.hook
def filter_body(context, body):
    return _representable(body)


@schema.hook
def filter_query(context, query):
    return _representable(query)


# Where the server validates beyond what the document's schemas say (a contract's
# consistency, arguments against the tool's own schema, event patterns that must match
# an event, a failed outcome's code, a principal holding characters that hide), a
# schema-valid body may rightly be refused with 400 or 422.
SEMANTIC = {
    ("POST", "/api/v1/runs"),
    ("PUT", "/api/v1/tools/{name}"),
    ("POST", "/api/v1/operations"),
    ("POST", "/api/v1/webhook-endpoints"),
    ("POST", "/api/v1/operations/{operation_id}/attempts/{number}/outcome"),
    ("POST", "/api/v1/runs/{run_id}/outcomes"),
}
# A batch (api.md, Batches) answers an item that breaks the item's schema with that
# item's problem, in a 200 beside the other items' answers: only the batch as a whole
# (no array, no or too many items) is refused with the request.
BATCHES = {("POST", "/api/v1/operations"), ("POST", "/api/v1/runs/{run_id}/outcomes")}


def _batch_of_items(case) -> bool:
    body = case.body if isinstance(case.body, list) else None
    return (case.method, case.path) in BATCHES and body is not None and 1 <= len(body) <= 50


@pytest.fixture
def world(db, no_dns, settings):
    settings.WEBHOOK_ALLOWED_HOSTS = []
    KNOWN["world"] = build_world()
    # The WSGI handler closes the database connection after each request, and the test's
    # transaction lives on that connection: keep it open, as Django's test client does
    # around each of its requests (so only after the world is built with that client).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield KNOWN["world"]
    KNOWN.clear()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=not os.environ.get("FUZZ_RANDOM"),
)
def test_the_api_keeps_to_its_document(case, world):
    count("schemathesis cases")
    excluded = [positive_data_acceptance] if (case.method, case.path) in SEMANTIC else []
    if _batch_of_items(case):
        excluded.append(negative_data_rejection)
    case.call_and_validate(excluded_checks=excluded)
