"""The typed answers of the client (``effectgate_client.answers``) are the API's answers.

Each ``TypedDict`` is held to the component of the served OpenAPI document it describes:
the same keys, the same required ones, and types that agree (``| None`` exactly where the
document says ``nullable``, a ``Literal`` with the document's enum, the nested
``TypedDict`` of each ``$ref``). The status ``Literal``s are held to the server's state
machines. Then a live server's real answers, one per client method, are checked against
the ``TypedDict`` the method is annotated to return.
"""

from __future__ import annotations

import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import pytest
from django.test import Client

from approvals.models import ApprovalRequest
from effectgate_client import EffectgateClient, InvalidArguments, answers
from operations import services
from operations.machine import EffectClass, Status
from operations.models import Attempt, Operation, Run
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner

ROOT = Path(__file__).resolve().parents[2]
# The component of the OpenAPI document each TypedDict describes.
COMPONENTS: dict[Any, str] = {
    answers.Tool: "ToolOut",
    answers.ToolPage: "ToolPageOut",
    answers.Budgets: "BudgetsIn",
    answers.Usage: "UsageOut",
    answers.Run: "RunOut",
    answers.Decision: "DecisionOut",
    answers.Grant: "GrantOut",
    answers.Approval: "ApprovalOut",
    answers.ApprovalDetail: "ApprovalDetailOut",
    answers.Edit: "EditOut",
    answers.Operation: "OperationOut",
    answers.Attempt: "AttemptOut",
    answers.ClaimError: "ClaimErrorOut",
    answers.RegisteredOperation: "OperationCreatedOut",
    answers.Heartbeat: "HeartbeatOut",
    answers.ToolResult: "ToolResultOut",
    answers.OutcomeAnswer: "OutcomeAnswerOut",
    answers.OperationPage: "OperationPageOut",
    answers.Event: "EventOut",
    answers.OutcomeBody: "OutcomeInRequest",
    answers.Problem: "Problem",
    answers.RegistrationBatch: "RegistrationBatchOut",
    answers.OutcomeBatch: "OutcomeBatchOut",
}
# TypedDicts of an object the document describes inline, not as a component (the items
# of a batch answer are each one branch of a ``oneOf``).
INLINE = {
    answers.ProblemFieldError,
    answers.RegistrationBatchDone,
    answers.OutcomeBatchDone,
    answers.BatchRefusal,
}
# The Literal aliases, and the server's values of each (the OpenAPI document gives most
# statuses as plain strings; the enums it does give are checked where they are used).
STATUSES = {
    "OperationStatus": {s.value for s in Status},
    "EffectClass": {c.value for c in EffectClass},
    "RunStatus": set(Run.RunStatus.values),
    "AttemptStatus": set(Attempt.AttemptStatus.values),
    "ApprovalStatus": set(ApprovalRequest.RequestStatus.values),
    "NextAction": None,  # the document's AllowedNextActionsEnum
    "OutcomeKind": None,  # the document's KindEnum
}
SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


@pytest.fixture(scope="module")
def document(django_db_setup, django_db_blocker) -> dict[str, Any]:
    with django_db_blocker.unblock():
        response = Client().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return response.json()


def _without_none(annotation: Any) -> tuple[Any, bool]:
    if get_origin(annotation) in (Union, types.UnionType):
        args = get_args(annotation)
        rest = tuple(arg for arg in args if arg is not type(None))
        if len(rest) < len(args):
            return (rest[0] if len(rest) == 1 else Union[rest]), True  # noqa: UP007
    return annotation, False


class SchemaCheck:
    """Compares annotations with schemas, collecting every difference."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.components = document["components"]["schemas"]
        self.differences: list[str] = []

    def fail(self, where: str, why: str) -> None:
        self.differences.append(f"{where}: {why}")

    def typed_dict(self, typed: Any, schema: dict[str, Any], where: str) -> None:
        properties = schema.get("properties", {})
        hints = get_type_hints(typed)
        if set(hints) != set(properties):
            self.fail(
                where,
                f"keys differ: only in the TypedDict {sorted(set(hints) - set(properties))}, "
                f"only in the document {sorted(set(properties) - set(hints))}",
            )
        required = set(schema.get("required", []))
        if set(typed.__required_keys__) != required:
            self.fail(
                where,
                f"required keys differ: the TypedDict {sorted(typed.__required_keys__)}, "
                f"the document {sorted(required)}",
            )
        for key in sorted(set(hints) & set(properties)):
            self.value(hints[key], properties[key], f"{where}.{key}")

    def value(self, annotation: Any, schema: dict[str, Any], where: str) -> None:
        nullable = bool(schema.get("nullable"))
        if len(schema.get("allOf", [])) == 1:
            schema = schema["allOf"][0]
        component = None
        if "$ref" in schema:
            component = schema["$ref"].rsplit("/", 1)[1]
            schema = self.components[component]
        if annotation is Any:
            # Any JSON value (the document's empty schema); null is one.
            if "type" in schema or component or "properties" in schema:
                self.fail(where, f"Any, but the document says {component or schema['type']}")
            return
        annotation, optional = _without_none(annotation)
        if optional != nullable:
            self.fail(where, f"nullable in the document: {nullable}; None allowed: {optional}")
        if "oneOf" in schema:
            # A union of the branches, in the document's order.
            members = (
                get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else ()
            )
            if len(members) != len(schema["oneOf"]):
                self.fail(where, f"{annotation!r} for a oneOf of {len(schema['oneOf'])}")
            for n, (member, branch) in enumerate(zip(members, schema["oneOf"], strict=False)):
                self.value(member, branch, f"{where}|{n}")
            return
        if typing.is_typeddict(annotation):
            if COMPONENTS.get(annotation) != component:
                self.fail(where, f"{annotation.__name__} for component {component}")
            self.typed_dict(annotation, schema, where)
        elif get_origin(annotation) is Literal:
            kinds = {type(value) for value in get_args(annotation)}
            if schema.get("type") != {str: "string", int: "integer"}.get(kinds.pop(), "?"):
                self.fail(where, f"a Literal for type {schema.get('type')}")
            if "enum" in schema and set(get_args(annotation)) != set(schema["enum"]):
                self.fail(where, f"{get_args(annotation)} != the enum {schema['enum']}")
        elif annotation in SCALARS:
            if schema.get("type") != SCALARS[annotation]:
                self.fail(where, f"{annotation.__name__} for type {schema.get('type')}")
            if "enum" in schema:
                self.fail(where, f"a plain {annotation.__name__} for the enum {schema['enum']}")
        elif get_origin(annotation) is list:
            if schema.get("type") != "array":
                self.fail(where, f"a list for type {schema.get('type')}")
            else:
                self.value(get_args(annotation)[0], schema["items"], f"{where}[]")
        elif get_origin(annotation) is dict:
            if schema.get("type") != "object" or "properties" in schema:
                self.fail(where, f"a free dict for {schema}")
        else:
            self.fail(where, f"no rule for {annotation!r}")


def test_every_answer_type_is_held_to_a_component_or_a_state_machine():
    exported = {name: getattr(answers, name) for name in answers.__all__}
    typed = {value for value in exported.values() if typing.is_typeddict(value)}
    assert typed == set(COMPONENTS) | INLINE
    literals = {name for name, value in exported.items() if get_origin(value) is Literal}
    assert literals == set(STATUSES)
    import effectgate_client

    assert set(answers.__all__) <= set(effectgate_client.__all__), "exported from the package"


@pytest.mark.parametrize("typed", list(COMPONENTS), ids=lambda typed: typed.__name__)
def test_each_typed_answer_matches_its_component_in_the_served_document(document, typed):
    check = SchemaCheck(document)
    check.typed_dict(typed, check.components[COMPONENTS[typed]], typed.__name__)
    assert check.differences == []


def test_the_checker_finds_what_differs(document):
    """The comparison above fails when a TypedDict drifts from its component."""

    class Drifted(typing.TypedDict):
        attempt: str  # an integer in the document
        id: str | None  # not nullable there
        lease_until: str
        status: typing.NotRequired[str]  # required there
        extra: int  # not there

    check = SchemaCheck(document)
    check.typed_dict(Drifted, check.components["AttemptOut"], "Drifted")
    found = "\n".join(check.differences)
    assert "Drifted: keys differ: only in the TypedDict ['extra']" in found
    assert "only in the document ['idempotency_key']" in found
    assert "required keys differ" in found
    assert "Drifted.attempt: str for type integer" in found
    assert "Drifted.id: nullable in the document: False; None allowed: True" in found


@pytest.mark.parametrize("name", sorted(name for name, values in STATUSES.items() if values))
def test_each_status_literal_holds_the_values_of_the_server(name):
    assert set(get_args(getattr(answers, name))) == STATUSES[name]


# --- real answers --------------------------------------------------------------------


def _conforms(value: Any, annotation: Any, where: str, *, open_keys: bool = False) -> list[str]:
    """Where a JSON value does not have the annotated type (empty when it does)."""
    if annotation is Any:
        return []
    annotation, optional = _without_none(annotation)
    if value is None:
        return [] if optional else [f"{where}: null"]
    if typing.is_typeddict(annotation):
        if not isinstance(value, dict):
            return [f"{where}: not an object"]
        hints = get_type_hints(annotation)
        found = [f"{where}: no {key}" for key in annotation.__required_keys__ if key not in value]
        if not open_keys:
            found += [f"{where}: unexpected {key}" for key in value if key not in hints]
        for key in set(hints) & set(value):
            found += _conforms(value[key], hints[key], f"{where}.{key}")
        return found
    if get_origin(annotation) is Literal:
        return [] if value in get_args(annotation) else [f"{where}: {value!r} not a value"]
    if get_origin(annotation) is list:
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        item = get_args(annotation)[0]
        return [
            miss for i, each in enumerate(value) for miss in _conforms(each, item, f"{where}[{i}]")
        ]
    if get_origin(annotation) is dict:
        return [] if isinstance(value, dict) else [f"{where}: not an object"]
    if annotation is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, annotation)
    return [] if ok else [f"{where}: {value!r} is not {annotation.__name__}"]


APPROVED = contract("irreversible", approval={"mode": "always", "editable": ["/amount_cents"]})


@pytest.mark.django_db(transaction=True)
def test_the_answers_of_a_live_server_have_the_types_of_the_client(live_server):
    runner = make_runner()
    seen: dict[str, list[str]] = {}

    def check(name: str, value: Any, annotation: Any, **options: Any) -> Any:
        seen[name] = _conforms(value, annotation, name, **options)
        return value

    with EffectgateClient(live_server.url, runner.token) as client:
        check("put_tool", client.put_tool("typed_refund", contract("idempotent")), answers.Tool)
        check("get_tool", client.get_tool("typed_refund"), answers.Tool)
        check("GET /tools", client.request("GET", "/tools"), answers.ToolPage)
        run = check(
            "create_run",
            client.create_run(principal="user:alice", budgets={"max_tool_calls": 10}),
            answers.Run,
        )
        check("get_run", client.get_run(run["id"]), answers.Run)
        args = {"payment_id": "pay_1", "amount_cents": 500}
        registered = check(
            "register",
            client.register(
                run=run["id"],
                tool="typed_refund",
                operation_key="typed-1",
                arguments=args,
                claim_lease_s=30,
            ),
            answers.RegisteredOperation,
        )
        attempt = registered["attempt"]
        assert attempt is not None
        operation_id = registered["id"]
        check("heartbeat", client.heartbeat(operation_id, attempt["attempt"]), answers.Heartbeat)
        outcome: answers.OutcomeBody = {"kind": "succeeded", "result": {"refund": "re_1"}}
        check(
            "post_outcome",
            client.post_outcome(operation_id, attempt["attempt"], dict(outcome)),
            answers.OutcomeAnswer,
        )
        check("get_operation", client.get_operation(operation_id), answers.Operation)
        check("events", client.events(operation_id), list[answers.Event])
        check("tool_result", client.tool_result(operation_id), answers.ToolResult)
        check("GET /operations", client.request("GET", "/operations"), answers.OperationPage)
        again = client.register(
            run=run["id"], tool="typed_refund", operation_key="typed-2", arguments=args
        )
        check("claim", client.claim(again["id"]), answers.Attempt)

        # An inline claim refused: another operation on the same resource is executing.
        client.put_tool(
            "typed_locked",
            contract("irreversible", approval={"mode": "never"}, concurrency_key="/payment_id"),
        )
        for key in ("typed-6", "typed-7"):
            locked = check(
                f"register {key} (one resource)",
                client.register(
                    run=run["id"],
                    tool="typed_locked",
                    operation_key=key,
                    arguments=args,
                    claim_lease_s=30,
                ),
                answers.RegisteredOperation,
            )
        assert locked["attempt"] is None
        assert locked["claim_error"]["code"] == "concurrency_conflict"

        # Approvals: one approved as asked (decisions, a grant), one with an edit (a
        # successor that says what the approver changed).
        client.put_tool("typed_approved", APPROVED)
        approver = person(decide_on="typed_approved")
        waiting = {}
        for key in ("typed-3", "typed-5"):
            waiting[key] = check(
                f"register {key} (awaiting approval: nothing to claim)",
                client.register(
                    run=run["id"],
                    tool="typed_approved",
                    operation_key=key,
                    arguments=args,
                    claim_lease_s=30,
                ),
                answers.RegisteredOperation,
            )
            assert waiting[key]["attempt"] is None
            assert "claim_error" not in waiting[key]
        approval, edited_approval = (waiting[key]["approval"] for key in ("typed-3", "typed-5"))
        assert approval is not None
        assert edited_approval is not None
        services.approval_decide(
            request_id=approval["id"], user=approver, approve=True, comment="fine"
        )
        services.approval_decide(
            request_id=edited_approval["id"],
            user=approver,
            approve=True,
            comment="half",
            edits={"/amount_cents": 250},
        )
        decided = check("get_approval", client.get_approval(approval["id"]), answers.ApprovalDetail)
        assert decided["decisions"]
        assert decided["grant"] is not None
        check(
            "get_operation (approved)",
            client.get_operation(waiting["typed-3"]["id"]),
            answers.Operation,
        )
        original = check(
            "get_operation (superseded)",
            client.get_operation(waiting["typed-5"]["id"]),
            answers.Operation,
        )
        successor = original["superseded_by"]
        assert successor is not None
        edited = check(
            "get_operation (edited copy)", client.get_operation(successor), answers.Operation
        )
        assert edited["edits"], "the copy says what the approver changed"

        with pytest.raises(InvalidArguments) as refused:
            client.register(
                run=run["id"], tool="typed_refund", operation_key="typed-4", arguments={}
            )
        # Refusals add members of their own: the problem's keys are open.
        check("a problem", refused.value.problem, answers.Problem, open_keys=True)
        check("cancel_run", client.cancel_run(run["id"]), answers.Run)

    assert Operation.objects.filter(runner=runner.runner).count() == 7
    assert {name: misses for name, misses in seen.items() if misses} == {}


# --- what a type checker makes of them ------------------------------------------------------

USES = """
from effectgate_client.answers import Operation, RegisteredOperation, Tool
from effectgate_client.errors import ContractNotActive


def misspelt(op: Operation) -> object:
    return op["stauts"]


def unchecked(registered: RegisteredOperation) -> int:
    return registered["attempt"]["attempt"]


def checked(registered: RegisteredOperation, tool: Tool) -> int:
    ContractNotActive(tool)
    attempt = registered.get("attempt")
    return attempt["attempt"] if attempt is not None else 0
"""


def test_mypy_catches_a_misspelt_key_and_an_unchecked_null_and_passes_the_modules(tmp_path):
    """The answers and errors modules pass ``mypy --strict``; code using the answers gets
    the errors the types are for, and correct code gets none."""
    uses = tmp_path / "uses.py"
    uses.write_text(USES)
    modules = [ROOT / "client" / "effectgate_client" / name for name in ("answers.py", "errors.py")]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file=",
            "--strict",
            "--follow-imports=silent",
            "--python-version=3.11",
            "--no-incremental",
            str(uses),
            *map(str, modules),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["7", "11"], done.stdout
    assert 'TypedDict "Operation" has no key "stauts"' in errors[0]
    assert 'Value of type "Attempt | None" is not indexable' in errors[1]
    assert all(line.startswith(str(uses)) for line in errors), done.stdout
