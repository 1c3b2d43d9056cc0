"""Every path parameter and query parameter of the runner API, from its OpenAPI
document, given each hostile value (tests/fuzz/hostile.py) with a runner's token: no
answer is a 5xx, and every answer is a problem or JSON.

The document is the application's own, read at collection, so a new endpoint or filter
is fuzzed without being named here. One parameter is hostile at a time; the others are
ids of real objects in every state (tests/fuzz/conftest.py), so the hostile value
reaches the view and the database, not only a 404 for a missing neighbour. The headers
the API reads take hostile Latin-1 text (what a server decodes header bytes as).

CI runs this on PostgreSQL, which refuses input SQLite stores (U+0000).
"""

import json
import re
import time
from urllib.parse import unquote

import pytest
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from operations import services, signing
from operations.models import Tool
from tests.conftest import contract

from .conftest import Known, build_world, count
from .hostile import HOSTILE

# Seconds of requests: in `make test` and CI, not in `make check`.
pytestmark = pytest.mark.slow

DOCUMENT = SchemaGenerator().get_schema(request=None, public=True)
OPERATIONS = sorted(
    (method.upper(), path, operation)
    for path, item in DOCUMENT["paths"].items()
    for method, operation in item.items()
    if any(parameter["in"] in ("path", "query") for parameter in operation.get("parameters", []))
)
# Real values for the query filters (path parameters take the world's ids).
REAL_QUERY = {"status": "ready", "limit": "5"}


def _parameters(operation: dict, where: str) -> list[str]:
    return [p["name"] for p in operation.get("parameters", []) if p["in"] == where]


def test_the_parameters_are_read_from_the_document():
    names = {(method, path) for method, path, _ in OPERATIONS}
    assert ("GET", "/api/v1/operations") in names
    assert ("DELETE", "/api/v1/webhook-endpoints/{endpoint_id}") in names
    [(_, _, listing)] = [op for op in OPERATIONS if op[:2] == ("GET", "/api/v1/operations")]
    assert {"status", "run", "tool", "cursor", "limit"} <= set(_parameters(listing, "query"))


def _send(client: APIClient, method: str, url: str, **headers):
    count("api requests")
    body = None if method in ("GET", "DELETE") else b"{}"
    return client.generic(method, url, body or b"", content_type="application/json", **headers)


def _fault(response, case: str) -> str | None:
    if response.status_code >= 500:
        return f"{case}: {response.status_code} {response.content[:120]!r}"
    if response.status_code >= 400:
        if response["Content-Type"] != "application/problem+json":
            return f"{case}: {response.status_code} as {response['Content-Type']}"
        json.loads(response.content)
    return None


@pytest.fixture
def world(db, no_dns, settings) -> Known:
    settings.WEBHOOK_ALLOWED_HOSTS = []
    return build_world()


@pytest.mark.parametrize(
    ("method", "path", "operation"), OPERATIONS, ids=[f"{m} {p}" for m, p, _ in OPERATIONS]
)
def test_no_hostile_path_or_query_parameter_gets_a_5xx(world, method, path, operation):
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.api.token}")
    values = world.values()
    in_path = _parameters(operation, "path")
    missing = [name for name in in_path if not values.get(name)]
    assert not missing, f"add real values for {missing} to tests/fuzz/conftest.Known"
    real = {name: str(values[name][0]) for name in in_path}

    def url(**hostile: str) -> str:
        return re.sub(r"\{(\w+)\}", lambda match: {**real, **hostile}[match[1]], path)

    faults = []
    for name in in_path:
        for label, value in HOSTILE:
            faults.append(_fault(_send(client, method, url(**{name: value})), f"{name}: {label}"))
    for name in _parameters(operation, "query"):
        others = "&".join(f"{key}={value}" for key, value in REAL_QUERY.items() if key != name)
        for label, value in HOSTILE:
            response = _send(client, method, f"{url()}?{name}={value}&{others}")
            faults.append(_fault(response, f"?{name}: {label}"))
    faults = [fault for fault in faults if fault]
    assert not faults, "; ".join(faults)


# The headers the API reads beyond the token, each with a real value: tracing on
# registration, the Standard Webhooks headers of an inbound event (for a tool that takes
# them), content negotiation. One at a time is hostile, so the others let it through to
# where it is read.
def _headers(world: Known) -> dict[tuple[str, str], dict[str, str]]:
    now = str(int(time.time()))
    return {
        ("GET", "/api/v1/operations"): {
            "HTTP_AUTHORIZATION": f"Bearer {world.api.token}",
            "HTTP_ACCEPT": "application/json",
        },
        ("POST", "/api/v1/operations"): {
            "HTTP_TRACEPARENT": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
            "CONTENT_TYPE": "application/json",
        },
        ("POST", "/api/v1/inbound/hooked"): {
            "HTTP_WEBHOOK_ID": "evt_1",
            "HTTP_WEBHOOK_TIMESTAMP": now,
            "HTTP_WEBHOOK_SIGNATURE": "v1,AAAA",
        },
    }


# Kept before the hostile text, so that it reaches the code that reads past them.
PREFIXES = {"HTTP_AUTHORIZATION": "Bearer ", "HTTP_WEBHOOK_SIGNATURE": "v1,"}


def test_no_hostile_header_gets_a_5xx(world):
    inbound = {"type": "/type", "succeeded": ["ok"], "idempotency_key": "/key"}
    world.api.tool("hooked", contract("idempotent", inbound=inbound))
    services.tool_inbound_secret_set(
        tool=Tool.objects.get(pk="hooked"),
        secret=signing.new_secret(),
        actor=services.Actor.system("fuzz"),
    )
    client = APIClient(raise_request_exception=False)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {world.api.token}")
    faults = []
    for (method, path), real in _headers(world).items():
        for header in real:
            for label, value in HOSTILE:
                text = PREFIXES.get(header, "") + unquote(value, encoding="latin-1")
                response = _send(client, method, path, **{**real, header: text})
                faults.append(_fault(response, f"{path} {header}: {label}"))
    faults = [fault for fault in faults if fault]
    assert not faults, "; ".join(faults)
