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

from drf_spectacular.utils import OpenApiResponse

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


# The batches (api.md, Batches). drf-spectacular describes one body per endpoint; the
# hook below gives registration its array form beside the object, and both batch
# answers their shape: each item a status with the operation, or with the problem the
# single call answers.
BATCH_MAX_ITEMS = 50
OUTCOME_BATCH_ANSWER = OpenApiResponse(
    description="Each outcome's answer, in order: its status and the operation with "
    "`tool_result`, or its status and problem."
)


def _batch_answer(operation: str, statuses: list[int]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["results"],
        "properties": {
            "results": {
                "type": "array",
                "minItems": 1,
                "maxItems": BATCH_MAX_ITEMS,
                "items": {
                    "oneOf": [
                        {
                            "type": "object",
                            "required": ["status", "operation"],
                            "properties": {
                                "status": {"type": "integer", "enum": statuses},
                                "operation": {"$ref": f"#/components/schemas/{operation}"},
                            },
                            "additionalProperties": False,
                        },
                        {
                            "type": "object",
                            "required": ["status", "problem"],
                            "properties": {
                                "status": {"type": "integer", "minimum": 400, "maximum": 599},
                                "problem": {"$ref": "#/components/schemas/Problem"},
                            },
                            "additionalProperties": False,
                        },
                    ]
                },
            }
        },
        "additionalProperties": False,
    }


def _json_schema(operation: dict[str, Any]) -> dict[str, Any]:
    return operation["requestBody"]["content"]["application/json"]["schema"]


def batches(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    paths = result.get("paths", {})
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["RegistrationBatchOut"] = _batch_answer("OperationCreatedOut", [200, 201])
    schemas["OutcomeBatchOut"] = _batch_answer("OutcomeAnswerOut", [200])
    register = paths.get("/api/v1/operations", {}).get("post")
    if register is not None:
        one = _json_schema(register)
        many = {"type": "array", "items": one, "minItems": 1, "maxItems": BATCH_MAX_ITEMS}
        register["requestBody"]["content"] = {
            "application/json": {"schema": {"oneOf": [one, many]}}
        }
        answer = register["responses"]["200"]["content"]["application/json"]
        answer["schema"] = {
            "oneOf": [answer["schema"], {"$ref": "#/components/schemas/RegistrationBatchOut"}]
        }
    outcomes = paths.get("/api/v1/runs/{run_id}/outcomes", {}).get("post")
    if outcomes is not None:
        body = _json_schema(outcomes)
        body.update(minItems=1, maxItems=BATCH_MAX_ITEMS)
        outcomes["requestBody"]["content"] = {"application/json": {"schema": body}}
        outcomes["responses"]["200"]["content"] = {
            "application/json": {"schema": {"$ref": "#/components/schemas/OutcomeBatchOut"}}
        }
    return result
