"""OpenAPI post-processing: the answers every endpoint can give, described once.

drf-spectacular describes each view's own answers (api.py). Some come from layers in
front of every view instead: the bearer token, its scope and its rate (401, 403, 429),
and, for every request with a body, the strict JSON parser (400 ``malformed_json``, 413
``payload_too_large``, 415 ``unsupported_media_type``, 422 ``number_out_of_range``).
This hook adds those to every operation and gives each 4xx answer the problem-details
schema, so that the document describes everything the API can answer (schemathesis
checks that it does, tests/fuzz/).
"""

from typing import Any

from ..contracts import CONTRACT_SCHEMA

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details with a stable `code`, and the `request_id` "
    "the answer's `X-Request-Id` header carries.",
    "required": ["type", "title", "status", "detail", "code", "request_id"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "request_id": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["path", "message"],
                "properties": {"path": {"type": "string"}, "message": {"type": "string"}},
            },
        },
        "retry_after_ms": {"type": "integer", "minimum": 0},
    },
    "additionalProperties": True,
}
PROBLEM_CONTENT = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
AUTH_PROBLEMS = {
    "401": "Missing, unknown, expired or revoked token (`not_authenticated`).",
    "403": "The token's scope does not allow this request (`forbidden`).",
    "429": "More requests with this token than the server's rate allows (`rate_limited`, "
    "with `retry_after_ms` and a `Retry-After` header).",
}
BODY_PROBLEMS = {
    "400": "The body is not acceptable JSON (`malformed_json`) or its fields are not valid "
    "(`invalid_request`, with `errors`).",
    "413": "The body is larger than the limit (`payload_too_large`).",
    "415": "The body is not `application/json` (`unsupported_media_type`).",
    "422": "A number beyond ±(2^53-1), 1e300 included, or beyond a double (`number_out_of_range`).",
}
METHODS = {"get", "put", "post", "patch", "delete"}


def problem_responses(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = PROBLEM_SCHEMA
    # Request bodies refuse unknown fields (serializers.StrictSerializer): say so.
    for name, schema in schemas.items():
        if name.endswith("Request") and schema.get("type") == "object":
            schema["additionalProperties"] = False
    for item in result.get("paths", {}).values():
        for method, operation in item.items():
            if method not in METHODS:
                continue
            responses = operation.setdefault("responses", {})
            extra = dict(AUTH_PROBLEMS) if operation.get("security") else {}
            if method != "get":
                extra.update(BODY_PROBLEMS)
            for status, description in extra.items():
                responses.setdefault(status, {"description": description})
            for status, response in responses.items():
                if status.startswith("4") and "content" not in response:
                    response["content"] = PROBLEM_CONTENT
    return result


def oas30(schema: Any) -> Any:
    """A JSON Schema (draft 2020-12) as an OpenAPI 3.0 schema object: no ``$schema``, and
    ``anyOf: [X, {"type": "null"}]`` as ``X`` with ``nullable: true``."""
    if isinstance(schema, list):
        return [oas30(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: oas30(value) for key, value in schema.items() if key != "$schema"}
    options = converted.get("anyOf")
    if isinstance(options, list) and {"type": "null"} in options:
        rest = [option for option in options if option != {"type": "null"}]
        converted.pop("anyOf")
        if len(rest) == 1:
            converted.update(rest[0])
        else:
            converted["anyOf"] = rest
        converted["nullable"] = True
    return converted


# The request body of PUT /tools/{name}: the contract schema the server validates with
# (operations.contracts), so the document says what a contract may contain.
CONTRACT_REQUEST_SCHEMA = oas30(CONTRACT_SCHEMA)
