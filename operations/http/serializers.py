"""Request validation and response bodies of the runner API (api.md).

Serializers parse and represent; they never write models. Request serializers refuse
unknown fields: a misspelt ``aproval`` must not silently mean "no approval asked".
"""

import fnmatch
from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from approvals.models import ApprovalRequest

from .. import payloads
from ..machine import OUTCOME_CODE_PATTERN, EffectClass, Status, allowed_next_actions
from ..models import Attempt, Event, Operation, Run, ToolVersion

# The JSON type each kind of field takes. DRF would otherwise coerce ("5" for an
# integer, false for a number, 7 for a string); a runner's body means what it says.
_JSON_TYPES: list[tuple[type, tuple[type, ...], str]] = [
    (serializers.BooleanField, (bool,), "a boolean"),
    (serializers.IntegerField, (int,), "an integer"),
    (serializers.FloatField, (int, float), "a number"),
    (serializers.CharField, (str,), "a string"),
    (serializers.ChoiceField, (str,), "a string"),
    (serializers.ListField, (list,), "an array"),
    (serializers.Serializer, (dict,), "an object"),
]


def _wrong_type(field: serializers.Field, value: Any) -> str | None:
    for kind, types, label in _JSON_TYPES:
        if isinstance(field, kind):
            if isinstance(value, bool) and bool not in types:
                return f"Must be {label}."
            return None if isinstance(value, types) else f"Must be {label}."
    return None


class StrictSerializer(serializers.Serializer):
    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
            wrong = {
                name: [problem]
                for name, field in self.fields.items()
                if data.get(name) is not None and (problem := _wrong_type(field, data[name]))
            }
            if wrong:
                raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)


class AnyJSON(serializers.JSONField):
    """Any JSON value (the strict parser already refused what has no single meaning)."""


class Choice(serializers.ChoiceField):
    """One of a few strings; a refusal lists them, so a runner that sent ``success``
    reads what to send instead (DRF's sentence names only the value refused)."""

    def __init__(self, choices: list[str], **kwargs: Any) -> None:
        super().__init__(choices, **kwargs)
        listed = ", ".join(choices).replace("{", "{{").replace("}", "}}")
        self.error_messages["invalid_choice"] = (
            '"{input}" is not a valid choice; use one of: ' + listed + "."
        )


@extend_schema_field(OpenApiTypes.OBJECT)
class JSONObject(serializers.JSONField):
    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError("Must be a JSON object.")
        return data


# --- requests ---------------------------------------------------------------------------


# Upper bounds of what the columns hold (PostgreSQL integer; numeric(20, 6)): a larger
# number is a 400 with the field's path, not a database error.
MAX_COUNT = 2_147_483_647
MAX_MONEY = 10.0**13


class BudgetsIn(StrictSerializer):
    max_tool_calls = serializers.IntegerField(
        min_value=1, max_value=MAX_COUNT, required=False, allow_null=True
    )
    max_turns = serializers.IntegerField(
        min_value=1, max_value=MAX_COUNT, required=False, allow_null=True
    )
    deadline_s = serializers.IntegerField(
        min_value=1, max_value=MAX_COUNT, required=False, allow_null=True
    )
    max_spend = serializers.FloatField(
        min_value=0, max_value=MAX_MONEY, required=False, allow_null=True
    )


class RunIn(StrictSerializer):
    external_id = serializers.CharField(max_length=255, required=False, allow_blank=True)
    principal = serializers.CharField(max_length=255)
    budgets = BudgetsIn(required=False)


class ApprovalAskIn(StrictSerializer):
    require = serializers.BooleanField()
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True)


class LeaseIn(StrictSerializer):
    lease_s = serializers.IntegerField(min_value=1, max_value=3600, required=False, default=30)


class OperationIn(StrictSerializer):
    run = serializers.CharField(max_length=40)
    tool = serializers.CharField(max_length=100)
    call_id = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    operation_key = serializers.CharField(max_length=255)
    arguments = JSONObject()
    turn = serializers.IntegerField(
        min_value=0, max_value=MAX_COUNT, required=False, allow_null=True
    )
    approval = ApprovalAskIn(required=False)
    claim = LeaseIn(required=False)
    retry_of = serializers.CharField(max_length=40, required=False)


class OutcomeIn(StrictSerializer):
    kind = Choice(["succeeded", "failed", "unknown"])
    result = AnyJSON(required=False, allow_null=True)
    downstream_id = serializers.CharField(max_length=255, required=False, allow_blank=True)
    # One call's cost; far below what a run's spend column holds, so sums stay in range.
    cost = serializers.FloatField(min_value=0, max_value=10.0**9, required=False, allow_null=True)
    code = serializers.RegexField(OUTCOME_CODE_PATTERN, required=False)
    detail = serializers.CharField(max_length=4000, required=False, allow_blank=True)
    retry_after_ms = serializers.IntegerField(min_value=0, max_value=86_400_000, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["kind"] == "failed" and not attrs.get("code"):
            raise serializers.ValidationError({"code": ["A failed outcome needs a code."]})
        if attrs["kind"] != "succeeded" and "result" in attrs:
            raise serializers.ValidationError({"result": ["Only a success carries a result."]})
        return attrs


class OutcomeItemIn(OutcomeIn):
    """One item of an outcome batch (``POST /runs/{run_id}/outcomes``): the single
    outcome's body with the attempt it is for."""

    operation = serializers.CharField(max_length=40)
    attempt = serializers.IntegerField(min_value=1, max_value=MAX_COUNT)


class ReconciliationIn(StrictSerializer):
    result = Choice(["committed", "not_found", "still_unknown"])
    downstream_id = serializers.CharField(max_length=255, required=False, allow_blank=True)
    evidence = JSONObject(required=False)


class CompensationIn(StrictSerializer):
    result = Choice(["committed", "failed"])
    evidence = JSONObject(required=False)


# Every event type the outbox sends (``services.core.outbox_enqueue``): a runner may
# subscribe to each by its exact name.
EVENT_TYPES = [
    *(f"operation.{status.value}" for status in Status),
    "approval.decided",
    "approval.escalated",
    "standing_grant.issued",
    "standing_grant.used",
    "standing_grant.revoked",
    # A new signed checkpoint of the transparency log (services.seal), to every runner.
    "audit.checkpoint",
]


class InboundOut(serializers.Serializer):
    id = serializers.CharField()
    event_id = serializers.CharField()
    status = serializers.CharField()
    operation = serializers.CharField(allow_null=True)
    duplicate = serializers.BooleanField()


class WebhookEndpointIn(StrictSerializer):
    url = serializers.URLField(max_length=2000)
    events = serializers.ListField(
        child=serializers.CharField(max_length=64), min_length=1, max_length=50
    )

    def validate_events(self, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(event, pattern) for event in EVENT_TYPES):
                raise serializers.ValidationError(
                    f"{pattern!r} matches no event; events are {', '.join(EVENT_TYPES)}."
                )
        return patterns


class WebhookEndpointOut(serializers.Serializer):
    id = serializers.CharField()
    url = serializers.CharField()
    events = serializers.ListField(child=serializers.CharField())
    is_active = serializers.BooleanField()
    disabled_reason = serializers.CharField()
    previous_secret_until = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()


class WebhookEndpointCreatedOut(WebhookEndpointOut):
    secret = serializers.CharField(help_text="whsec_...: shown once, store it now.")


# --- responses --------------------------------------------------------------------------
#
# The operation, approval, grant, attempt and tool version bodies are built once, by
# ``payloads`` (the webhooks send the same ones). Their serializers below only describe
# them for the OpenAPI document: their ``to_representation`` is the payload function, so
# their fields have no source and no getter. ``read_only`` marks the fields the document
# has always shown as read-only. tests/operations/test_bodies.py keeps the keys of each
# description equal to the keys of what is sent.


class DecisionOut(serializers.Serializer):
    by = serializers.CharField()
    decision = serializers.CharField()
    comment = serializers.CharField()
    at = serializers.DateTimeField()


class GrantOut(serializers.Serializer):
    id = serializers.CharField()
    intent_hash = serializers.CharField()
    expires_at = serializers.DateTimeField()
    revoked_at = serializers.DateTimeField(allow_null=True)
    decided_by = serializers.ListField(child=serializers.CharField(), read_only=True)

    def to_representation(self, grant: Any) -> dict[str, Any]:
        return payloads.grant(grant)


class ApprovalOut(serializers.Serializer):
    id = serializers.CharField()
    status = serializers.CharField()
    approvals_required = serializers.IntegerField()
    reason = serializers.CharField()
    decisions = DecisionOut(many=True)
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    grant = GrantOut(allow_null=True, read_only=True)
    standing_grant = serializers.CharField(
        allow_null=True,
        read_only=True,
        help_text="sgr_...: the standing grant a use of which approved this intent, or null.",
    )

    def to_representation(self, request: ApprovalRequest) -> dict[str, Any]:
        return payloads.approval(request)


class ApprovalDetailOut(ApprovalOut):
    operation = serializers.CharField()
    intent_hash = serializers.CharField()

    def to_representation(self, request: ApprovalRequest) -> dict[str, Any]:
        return {
            **payloads.approval(request),
            "operation": request.operation_id,
            "intent_hash": request.intent_hash,
        }


class EditOut(serializers.Serializer):
    path = serializers.CharField()
    to = AnyJSON(allow_null=True)

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        fields["from"] = AnyJSON(allow_null=True)  # a Python keyword, so set here
        return fields


class OperationOut(serializers.Serializer):
    id = serializers.CharField()
    run = serializers.CharField()
    tool = serializers.CharField()
    tool_version = serializers.IntegerField()
    effect_class = serializers.CharField()
    call_id = serializers.CharField(allow_null=True, read_only=True)
    operation_key = serializers.CharField()
    arguments = AnyJSON()
    intent_hash = serializers.CharField()
    principal = serializers.CharField()
    idempotency_key = serializers.CharField()
    status = serializers.CharField()
    attempts = serializers.IntegerField()
    not_before = serializers.DateTimeField(allow_null=True)
    lease_until = serializers.DateTimeField(allow_null=True)
    deadline_at = serializers.DateTimeField(allow_null=True)
    approval = ApprovalOut(allow_null=True, read_only=True)
    result = AnyJSON(allow_null=True)
    downstream_id = serializers.CharField(allow_null=True, read_only=True)
    error_code = serializers.CharField(allow_null=True, read_only=True)
    error_detail = serializers.CharField(allow_null=True, read_only=True)
    next_probe_at = serializers.DateTimeField(allow_null=True)
    previous_operation = serializers.CharField(allow_null=True)
    superseded_by = serializers.CharField(
        allow_null=True,
        help_text="Set when a person approved an edited copy: the operation to run instead.",
    )
    edits = serializers.ListField(
        child=EditOut(),
        allow_null=True,
        help_text="On an edited copy: what the approver changed (JSON pointers into arguments).",
    )
    allowed_next_actions = serializers.ListField(
        child=serializers.ChoiceField(
            choices=[
                "claim_attempt",
                "wait_for_approval",
                "wait_until_not_before",
                "post_outcome",
                "heartbeat",
                "reconcile",
                "compensate",
            ]
        ),
        read_only=True,
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()

    def to_representation(self, op: Operation) -> dict[str, Any]:
        return payloads.operation(op)


class AttemptOut(serializers.Serializer):
    attempt = serializers.IntegerField()
    id = serializers.CharField()
    idempotency_key = serializers.CharField()
    lease_until = serializers.DateTimeField()
    status = serializers.CharField()

    def to_representation(self, attempt: Attempt) -> dict[str, Any]:
        return payloads.attempt(attempt)


class ClaimErrorOut(serializers.Serializer):
    """Why the claim asked for with a registration was refused: the refusal's problem
    ``code`` and ``detail``, and its other members."""

    code = serializers.CharField()
    detail = serializers.CharField()
    retry_after_ms = serializers.IntegerField(required=False)
    breaker = serializers.ChoiceField(choices=["open", "half_open"], required=False)


# The answer to a registration: the view adds ``attempt`` (and ``claim_error``) to the
# operation body when the registration asked for a claim.
class OperationCreatedOut(OperationOut):
    attempt = AttemptOut(required=False, allow_null=True)
    claim_error = ClaimErrorOut(required=False)


class HeartbeatOut(serializers.Serializer):
    attempt = serializers.IntegerField(source="number")
    lease_until = serializers.DateTimeField()


class EventOut(serializers.Serializer):
    id = serializers.IntegerField(
        help_text="The event's id in the ledger: what GET /audit/events/{event_id}/inclusion "
        "proves in the transparency log."
    )
    seq = serializers.IntegerField()
    kind = serializers.CharField()
    # Published as "from" and "to" (get_fields): "from" is a Python keyword.
    from_status = serializers.CharField(source="from_status", allow_null=True)
    to_status = serializers.CharField(source="to_status", allow_null=True)
    actor = serializers.CharField()
    at = serializers.DateTimeField()
    data = AnyJSON()  # type: ignore[assignment]  # the metaclass moves fields off the class
    hash = serializers.CharField()
    prev_hash = serializers.CharField()

    def get_fields(self) -> dict[str, serializers.Field]:
        fields = super().get_fields()
        fields["from"] = fields.pop("from_status")
        fields["to"] = fields.pop("to_status")
        return fields

    def to_representation(self, event: Event) -> dict[str, Any]:
        body = super().to_representation(event)
        body["from"] = body["from"] or None
        body["to"] = body["to"] or None
        return body


class OperationPageOut(serializers.Serializer):
    """A page of ``GET /operations`` (cursor pagination)."""

    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = OperationOut(many=True)


class ToolResultOut(serializers.Serializer):
    status = serializers.CharField()
    code = serializers.CharField(allow_null=True)
    logical_operation_id = serializers.CharField()
    message = serializers.CharField()
    allowed_next_actions = serializers.ListField(child=serializers.CharField())


class OutcomeAnswerOut(OperationOut):
    """The answer to a posted outcome: the operation, and the envelope for the model
    (``GET .../tool-result``), so that the runner needs no further request."""

    tool_result = ToolResultOut()


class ToolOut(serializers.Serializer):
    """A contract version, with the tool's name and which version is active."""

    # The stored contract (``contracts.normalize_contract``) sits at the top level, as
    # the runner PUT it with every default filled in; its blocks are described field by
    # field in the request body of ``PUT /tools/{name}``.
    effect_class = serializers.ChoiceField(choices=[kind.value for kind in EffectClass])
    input_schema = JSONObject()
    retry = JSONObject()
    approval = JSONObject()
    reconcile = JSONObject()
    concurrency_key = serializers.CharField(allow_null=True)
    inbound = JSONObject(allow_null=True)
    breaker = JSONObject(allow_null=True)
    description = serializers.CharField(required=False)
    display = JSONObject(required=False)
    name = serializers.CharField()
    owner = serializers.CharField(allow_null=True)
    version = serializers.IntegerField()
    active_version = serializers.IntegerField(allow_null=True, read_only=True)
    active = serializers.BooleanField(read_only=True)
    weakens = serializers.ListField(
        child=serializers.CharField(),
        help_text="Why this version did not activate by itself (empty when it did): what it "
        "weakens of the active version, and what holds it for a person (HOLD_NEW_TOOLS).",
    )
    created_at = serializers.DateTimeField()

    def to_representation(self, version: ToolVersion) -> dict[str, Any]:
        return payloads.tool_version(version)


class ToolPageOut(serializers.Serializer):
    """A page of ``GET /tools`` (cursor pagination, by name)."""

    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = ToolOut(many=True)


class ToolInvokerOut(serializers.Serializer):
    tool = serializers.CharField()
    runner = serializers.CharField()
    allowed = serializers.BooleanField()


class UsageOut(serializers.Serializer):
    tool_calls = serializers.IntegerField()
    turns = serializers.IntegerField()
    spend = serializers.FloatField()
    elapsed_s = serializers.FloatField()


class RunOut(serializers.Serializer):
    id = serializers.CharField()
    external_id = serializers.CharField()
    principal = serializers.CharField()
    status = serializers.CharField()
    budgets = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()
    deadline_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True)

    @extend_schema_field(BudgetsIn)
    def get_budgets(self, run: Run) -> dict[str, Any]:
        return {
            "max_tool_calls": run.max_tool_calls,
            "max_turns": run.max_turns,
            "deadline_s": run.deadline_s,
            "max_spend": float(run.max_spend) if run.max_spend is not None else None,
        }

    @extend_schema_field(UsageOut)
    def get_usage(self, run: Run) -> dict[str, Any]:
        end = run.ended_at or timezone.now()
        return {
            "tool_calls": run.tool_calls,
            "turns": run.turns,
            "spend": float(run.spend),
            "elapsed_s": round((end - run.created_at).total_seconds(), 3),
        }


_MESSAGES = {
    "awaiting_approval": "The call to {tool} is waiting for a person to approve it; do not "
    "call it again, wait for the decision.",
    "ready": "The call to {tool} is registered and may be attempted.",
    "executing": "The call to {tool} is being executed.",
    "outcome_unknown": "The outcome of the call to {tool} is unknown and is being "
    "reconciled; do not retry it.",
    "compensating": "The call to {tool} had an unknown outcome and is being undone.",
    "succeeded": "The call to {tool} succeeded{reference}.",
    "rejected": "A person rejected the call to {tool}{reason}; do not retry it as is.",
    "failed_permanent": "The call to {tool} failed and will not be retried{reason}.",
    "budget_exhausted": "The call to {tool} was stopped: its retry or time budget is used up.{why}",
    "compensated": "The call to {tool} was undone; it had no lasting effect.",
    "cancelled": "The call to {tool} was cancelled before it ran.",
    "superseded": "A person approved the call to {tool} with changes; it runs as "
    "{successor} with the changed arguments. Do not call it again as it was.",
}


def tool_result(op: Operation) -> dict[str, Any]:
    """The compact envelope a runner hands back to the model."""
    reason = f": {op.error_detail}" if op.error_detail else ""
    if op.status == "rejected" and op.error_code == "approval_expired":
        reason = " (nobody decided before the request expired)"
    message = _MESSAGES[op.status].format(
        tool=op.tool_id,
        reference=f" (reference {op.downstream_id})" if op.downstream_id else "",
        reason=reason if op.status in {"rejected", "failed_permanent"} else "",
        # What the last attempt ran into, in the runner's words: a provider that could
        # not be reached says so (effectgate_client's outcome_from_httpx_error).
        why=f" {op.error_detail}" if op.error_detail else "",
        successor=op.superseded_by_id,
    )
    return {
        "status": op.status,
        "code": op.error_code or None,
        "logical_operation_id": op.id,
        "message": message,
        "allowed_next_actions": allowed_next_actions(
            status=op.status, now=timezone.now(), not_before=op.not_before
        ),
    }


# --- the transparency log ---------------------------------------------------------------


class CheckpointOut(serializers.Serializer):
    """A signed checkpoint (``payloads.checkpoint``): what ``note`` says, and the note."""

    size = serializers.IntegerField(help_text="The number of leaves (events) in the tree.")
    # The metaclass moves fields off the class: this one does not hide Field.root.
    root = serializers.CharField(  # type: ignore[assignment]
        help_text="The tree's root hash (RFC 9162), base64."
    )
    time = serializers.DateTimeField(help_text="When it was signed, to the second.")
    origin = serializers.CharField(help_text="The log's name, and its key's.")
    note = serializers.CharField(
        help_text="The C2SP signed note: the checkpoint's text, an empty line, the "
        "Ed25519 signature line. Keep it: it verifies with the published key alone."
    )

    def to_representation(self, checkpoint: Any) -> dict[str, Any]:
        return payloads.checkpoint(checkpoint)


class InclusionProofOut(serializers.Serializer):
    event = serializers.IntegerField()
    leaf_index = serializers.IntegerField(help_text="The event's leaf in the log, from 0.")
    size = serializers.IntegerField(help_text="The tree size the proof is for.")
    hashes = serializers.ListField(
        child=serializers.CharField(),
        help_text="The inclusion path of RFC 9162 §2.1.3, each hash base64, from the leaf's "
        "sibling up.",
    )


class ConsistencyProofOut(serializers.Serializer):
    first = serializers.IntegerField()
    second = serializers.IntegerField()
    hashes = serializers.ListField(
        child=serializers.CharField(),
        help_text="The consistency proof of RFC 9162 §2.1.4, each hash base64.",
    )
