"""A runner's world built through the services, for tests that are not about HTTP.

``Api`` (tests/conftest.py) drives the runner API over Django's test client, which is
what the API's own tests are about. A fixture that only needs tools, runs and
operations to exist (for the console's pages, the audit, a search) makes them here: the
serializer and the service each API view calls, and the body that view answers, without
the round trip through the middleware, the authentication and the throttle.
"""

import json
from typing import Any

from rest_framework.renderers import JSONRenderer

from operations import payloads, selectors, services
from operations.http.serializers import (
    LeaseIn,
    OperationIn,
    OutcomeIn,
    RunIn,
    ToolOut,
    tool_result,
)
from tests.conftest import Api, contract, next_operation_key


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    """The body as the runner reads it: rendered to JSON as the view renders it, and parsed."""
    return json.loads(JSONRenderer().render(body))


def _valid(serializer_class: type, data: dict[str, Any]) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class Direct:
    """``Api``'s shortcuts for ``api``'s runner, through the services: the same
    arguments, the same bodies back (the operation's as ``POST /operations`` gives it)."""

    def __init__(self, api: Api) -> None:
        self.runner = api.runner

    def tool(self, name: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        registration = services.tool_register(
            name=name, body=body or contract(), runner=self.runner
        )
        registration.version.tool.refresh_from_db()
        return _answer(ToolOut(registration.version).data)

    def run(self, principal: str = "user:alice", **budgets: Any) -> str:
        data = _valid(RunIn, {"principal": principal, "budgets": budgets})
        run = services.run_create(
            runner=self.runner,
            principal=data["principal"],
            external_id=data.get("external_id", ""),
            budgets=dict(data.get("budgets", {})),
        )
        return run.id

    def register(
        self, run: str, tool: str, arguments: dict[str, Any] | None = None, **extra: Any
    ) -> dict[str, Any]:
        data = _valid(
            OperationIn,
            {
                "run": run,
                "tool": tool,
                "operation_key": extra.pop("operation_key", next_operation_key()),
                "arguments": arguments or {"payment_id": "pay_1", "amount_cents": 500},
                **extra,
            },
        )
        registration = services.operation_register(
            runner=self.runner,
            run_id=data["run"],
            tool_name=data["tool"],
            operation_key=data["operation_key"],
            arguments=data["arguments"],
            call_id=data.get("call_id", ""),
            turn=data.get("turn"),
            approval=data.get("approval"),
            claim_lease_s=data["claim"]["lease_s"] if "claim" in data else None,
            retry_of=data.get("retry_of"),
        )
        op = registration.operation
        body = payloads.operation(op if registration.created else selectors.operation_refresh(op))
        if registration.created and "claim" in data:
            attempt = registration.attempt
            body["attempt"] = payloads.attempt(attempt) if attempt is not None else None
            error = registration.claim_error
            if error is not None:
                body["claim_error"] = {"code": error.code, "detail": error.detail, **error.extra}
        return _answer(body)

    def claim(self, op_id: str, **body: Any) -> dict[str, Any]:
        data = _valid(LeaseIn, body)
        operation = selectors.operation_get_for_runner(runner=self.runner, operation_id=op_id)
        attempt = services.attempt_claim(
            operation=operation, runner=self.runner, lease_s=data["lease_s"]
        )
        return _answer(payloads.attempt(attempt))

    def outcome(self, op_id: str, attempt: int, body: dict[str, Any]) -> dict[str, Any]:
        operation = services.attempt_record_outcome(
            operation_id=op_id, number=attempt, body=_valid(OutcomeIn, body), runner=self.runner
        )
        return _answer({**payloads.operation(operation), "tool_result": tool_result(operation)})
