"""Every write of the operation ledger, and the only door to an operation's state.

Rules (style.md):

- Each public function takes keyword-only arguments, including who acts, and runs in
  one ``transaction.atomic``. It locks the row it changes (``select_for_update``; under
  SQLite every transaction takes the write lock at BEGIN instead), checks the move
  against ``machine.TRANSITIONS`` and appends the event in the same transaction.
- A refusal that must leave a trace (an expired lease handled during a claim, a grant
  found invalid) commits the trace and then raises: the private ``*_locked`` helpers
  return the error instead of raising it inside the transaction.
- No HTTP call happens inside a transaction.
"""

import fnmatch
import hashlib
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from approvals import selectors as approval_selectors
from approvals import services as approval_services
from approvals.errors import DecisionRefused, PermissionRefused, Refusal
from approvals.models import ApprovalRequest
from approvals.policy import evaluate as evaluate_policy
from approvals.policy import is_missing, resolve_pointer

from . import errors, machine, telemetry
from .arguments import freeze_arguments, validate_arguments
from .canonical import canonical_json, intent_hash, sha256_hex
from .contracts import normalize_contract, weakenings
from .crypto import decrypt, encrypt
from .machine import Status, Verdict
from .models import (
    Attempt,
    Event,
    InboundEvent,
    Operation,
    OutboxMessage,
    Resolution,
    ResolutionReview,
    Run,
    Runner,
    RunnerToken,
    Tool,
    ToolVersion,
    WebhookEndpoint,
)
from .webhooks import new_secret as webhooks_new_secret
from .webhooks import verify as webhooks_verify

logger = logging.getLogger(__name__)

GENESIS_HASH = "0" * 64
TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
TOKEN_PREFIX = "egr_"  # noqa: S105 (a recognisable prefix, not a secret)
AttemptStatus = Attempt.AttemptStatus


# ---------------------------------------------------------------------------------------
# Actors and events


@dataclass(frozen=True)
class Actor:
    """Who acts: a runner, a console user, or the system (sweep, probe, claim)."""

    label: str
    user: Any = None
    runner: Runner | None = None

    @classmethod
    def of_runner(cls, runner: Runner) -> "Actor":
        return cls(f"runner:{runner.name}", runner=runner)

    @classmethod
    def of_user(cls, user: Any) -> "Actor":
        return cls(f"user:{user.get_username()}", user=user)

    @classmethod
    def system(cls, name: str) -> "Actor":
        return cls(f"system:{name}")


def _json_safe(value: Any) -> Any:
    """Event data as plain JSON: timestamps as RFC 3339 strings, decimals as numbers."""
    if isinstance(value, dict):
        return {str(key): _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, Decimal):
        return float(value)
    return value


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def event_hash(event: Event) -> str:
    """The hash that chains an event to its stream's previous event."""
    return sha256_hex(
        {
            "stream": event.stream,
            "seq": event.seq,
            "kind": event.kind,
            "from": event.from_status,
            "to": event.to_status,
            "actor": event.actor,
            "at": _iso(event.at),
            "data": event.data,
            "prev": event.prev_hash,
        }
    )


def event_append(
    *,
    stream: str,
    kind: str,
    actor: Actor,
    operation: Operation | None = None,
    run: Run | None = None,
    tool_name: str = "",
    from_status: str = "",
    to_status: str = "",
    data: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> Event:
    """Append one event to ``stream``; the caller holds the lock of the stream's row."""
    last = Event.objects.filter(stream=stream).order_by("-seq").values_list("seq", "hash").first()
    seq, prev_hash = (last[0] + 1, last[1]) if last else (1, GENESIS_HASH)
    event = Event(
        stream=stream,
        seq=seq,
        kind=kind,
        operation=operation,
        run=run if run is not None else (operation.run if operation is not None else None),
        tool_name=tool_name or (operation.tool_id if operation is not None else ""),
        from_status=from_status,
        to_status=to_status,
        actor=actor.label,
        actor_user=actor.user,
        actor_runner=actor.runner,
        at=now or timezone.now(),
        data=_json_safe(data or {}),
        prev_hash=prev_hash,
    )
    event.hash = event_hash(event)
    event.save()
    return event


def _transition(
    op: Operation,
    *,
    to: Status,
    kind: str,
    actor: Actor,
    now: datetime,
    data: dict[str, Any] | None = None,
    **changes: Any,
) -> Event:
    """Move a locked operation to ``to``, saving ``changes`` and the event together."""
    source = op.status
    if not machine.can_transition(source, to):
        raise errors.InvalidTransition(f"{source} -> {to} is not an allowed transition.")
    op.status = to
    op.status_changed_at = now
    for name, value in changes.items():
        setattr(op, name, value)
    if to != Status.EXECUTING:
        op.lease_until = None
    op.save()
    event = event_append(
        stream=op.id,
        kind=kind,
        actor=actor,
        operation=op,
        from_status=source,
        to_status=to,
        data=data,
        now=now,
    )
    outbox_enqueue(op=op, event_type=f"operation.{to}", now=now)
    if to in machine.TERMINAL and telemetry.enabled():
        transaction.on_commit(partial(telemetry.export_operation, op.id))
    return event


def _record(
    op: Operation, *, kind: str, actor: Actor, now: datetime, data: dict[str, Any] | None = None
) -> Event:
    """An event that changes no state (heartbeat, late outcome, probe)."""
    return event_append(
        stream=op.id,
        kind=kind,
        actor=actor,
        operation=op,
        from_status=op.status,
        to_status=op.status,
        data=data,
        now=now,
    )


# What a transition reads beside the operation row. FOR UPDATE OF self: the joined rows
# are read, not locked (and PostgreSQL refuses to lock the nullable side of a join).
LOCK_RELATED = ("tool_version", "tool", "tool__active_version", "run", "runner")


def _lock(operation_id: str) -> Operation:
    return (
        Operation.objects.select_for_update(of=("self",))
        .select_related(*LOCK_RELATED)
        .get(pk=operation_id)
    )


# ---------------------------------------------------------------------------------------
# The outbox: webhooks written in the transaction of the change they report


def _subscribed(runner_id: str, event_type: str) -> list[WebhookEndpoint]:
    endpoints = WebhookEndpoint.objects.filter(runner_id=runner_id, is_active=True)
    return [
        endpoint
        for endpoint in endpoints
        if any(fnmatch.fnmatchcase(event_type, pattern) for pattern in endpoint.events)
    ]


def outbox_enqueue(
    *, op: Operation, event_type: str, now: datetime, extra: dict[str, Any] | None = None
) -> int:
    """Write one outbox message per subscribed endpoint; the caller's transaction commits
    them with the change, so a change is never reported without happening or lost."""
    endpoints = _subscribed(op.runner_id, event_type)
    if not endpoints:
        return 0
    from .selectors import operation_refresh
    from .serializers import OperationOut

    payload = {
        "type": event_type,
        "timestamp": _iso(now),
        "data": {"operation": dict(OperationOut(operation_refresh(op)).data), **(extra or {})},
    }
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            endpoint=endpoint,
            operation=op,
            event_type=event_type,
            payload=_json_safe(payload),
            created_at=now,
            next_attempt_at=now,
        )
        for endpoint in endpoints
    )
    return len(endpoints)


def _approval_decided(op: Operation, request: ApprovalRequest, *, now: datetime) -> None:
    from .serializers import ApprovalOut

    request.refresh_from_db()
    outbox_enqueue(
        op=op,
        event_type="approval.decided",
        now=now,
        extra={"approval": dict(ApprovalOut(request).data)},
    )


def webhook_endpoint_create(
    *, runner: Runner, url: str, events: list[str]
) -> tuple[WebhookEndpoint, str]:
    """Register an endpoint; its signing secret is returned only here."""
    secret = webhooks_new_secret()
    with transaction.atomic():
        Runner.objects.select_for_update().get(pk=runner.pk)
        endpoint = WebhookEndpoint.objects.create(
            runner=runner, url=url, events=sorted(set(events)), secret_encrypted=encrypt(secret)
        )
        event_append(
            stream=f"runner:{runner.id}",
            kind="webhook_endpoint_created",
            actor=Actor.of_runner(runner),
            data={"endpoint": endpoint.id, "url": url, "events": endpoint.events},
        )
    return endpoint, secret


def webhook_endpoint_rotate(
    *, endpoint: WebhookEndpoint, actor: Actor, overlap: timedelta = timedelta(hours=24)
) -> str:
    """A new secret; the old one keeps signing (as a second signature) during ``overlap``."""
    secret = webhooks_new_secret()
    with transaction.atomic():
        endpoint = WebhookEndpoint.objects.select_for_update().get(pk=endpoint.pk)
        endpoint.previous_secret_encrypted = endpoint.secret_encrypted
        endpoint.previous_secret_until = timezone.now() + overlap
        endpoint.secret_encrypted = encrypt(secret)
        endpoint.save()
        event_append(
            stream=f"runner:{endpoint.runner_id}",
            kind="webhook_secret_rotated",
            actor=actor,
            data={"endpoint": endpoint.id, "overlap_until": endpoint.previous_secret_until},
        )
    return secret


def webhook_endpoint_delete(*, endpoint: WebhookEndpoint, actor: Actor) -> None:
    with transaction.atomic():
        Runner.objects.select_for_update().get(pk=endpoint.runner_id)
        event_append(
            stream=f"runner:{endpoint.runner_id}",
            kind="webhook_endpoint_deleted",
            actor=actor,
            data={"endpoint": endpoint.id, "url": endpoint.url},
        )
        endpoint.delete()


def webhook_redeliver(*, message: OutboxMessage, user: Any) -> OutboxMessage:
    """A person asks for one more delivery of a message, whatever its state."""
    with transaction.atomic():
        op = _lock(message.operation_id) if message.operation_id else None
        if (
            op is not None
            and not user.has_perm(RECONCILE_PERMISSION, op.tool)
            and not (user.has_perm("operations.decide_tool", op.tool))
        ):
            raise PermissionRefused("You may not redeliver webhooks of this operation.")
        message = OutboxMessage.objects.select_for_update().get(pk=message.pk)
        now = timezone.now()
        message.status = OutboxMessage.MessageStatus.PENDING
        message.next_attempt_at = now
        message.save(update_fields=["status", "next_attempt_at"])
        if op is not None:
            _record(
                op,
                kind="webhook_redelivery",
                actor=Actor.of_user(user),
                now=now,
                data={"message": message.id, "event_type": message.event_type},
            )
    return message


# ---------------------------------------------------------------------------------------
# Runners and tokens


def _token_hash(token: str) -> str:
    # Tokens carry 256 random bits, so a fast hash is enough: nobody can guess one from
    # its hash, and lookups stay a single indexed equality.
    return hashlib.sha256(token.encode()).hexdigest()


def runner_create(*, name: str, owner: Any = None, actor: Actor) -> tuple[Runner, str]:
    """Create a runner account and its first token. The token is returned only here."""
    user_model = get_user_model()
    with transaction.atomic():
        service_user = user_model.objects.create(username=f"runner:{name}", is_active=True)
        service_user.set_unusable_password()
        service_user.save(update_fields=["password"])
        runner = Runner.objects.create(name=name, owner=owner, service_user=service_user)
        event_append(
            stream=f"runner:{runner.id}",
            kind="runner_created",
            actor=actor,
            data={
                "runner": runner.id,
                "name": name,
                "owner": owner.get_username() if owner else None,
            },
        )
        token = _token_issue(runner=runner, scopes=RunnerToken.ALL_SCOPES, actor=actor)
    return runner, token


def _token_issue(
    *,
    runner: Runner,
    scopes: list[str],
    actor: Actor,
    label: str = "",
    expires_at: datetime | None = None,
) -> str:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = RunnerToken.objects.create(
        runner=runner,
        token_hash=_token_hash(token),
        prefix=token[:12],
        scopes=sorted(scopes),
        label=label,
        expires_at=expires_at,
    )
    event_append(
        stream=f"runner:{runner.id}",
        kind="token_created",
        actor=actor,
        data={"token": record.id, "prefix": record.prefix, "scopes": record.scopes},
    )
    return token


def token_create(
    *,
    runner: Runner,
    actor: Actor,
    scopes: list[str] | None = None,
    label: str = "",
    expires_at: datetime | None = None,
) -> str:
    with transaction.atomic():
        Runner.objects.select_for_update().get(pk=runner.pk)
        return _token_issue(
            runner=runner,
            scopes=scopes or RunnerToken.ALL_SCOPES,
            actor=actor,
            label=label,
            expires_at=expires_at,
        )


def token_revoke(*, token: RunnerToken, actor: Actor) -> RunnerToken:
    with transaction.atomic():
        Runner.objects.select_for_update().get(pk=token.runner_id)
        changed = RunnerToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if changed:
            event_append(
                stream=f"runner:{token.runner_id}",
                kind="token_revoked",
                actor=actor,
                data={"token": token.pk, "prefix": token.prefix},
            )
    token.refresh_from_db()
    return token


def token_authenticate(raw: str) -> tuple[Runner, RunnerToken] | None:
    """The runner a bearer token belongs to, if the token is valid now."""
    token = RunnerToken.objects.select_related("runner").filter(token_hash=_token_hash(raw)).first()
    now = timezone.now()
    if token is None or token.revoked_at is not None or not token.runner.is_active:
        return None
    if token.expires_at is not None and token.expires_at <= now:
        return None
    # Record use at most once a minute: a write per request would cost more than it tells.
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        RunnerToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.runner, token


def runner_may_invoke(runner: Runner, tool: Tool) -> bool:
    """By default a runner may invoke every tool; a restricted one only those granted."""
    if not runner.restrict_tools:
        return True
    return runner.service_user.has_perm("operations.invoke_tool", tool)


# ---------------------------------------------------------------------------------------
# Tool contracts


@dataclass(frozen=True)
class ToolRegistration:
    version: ToolVersion
    created: bool  # the tool did not exist before
    changed: bool  # a new version was stored


def _lock_or_create_tool(name: str) -> tuple[Tool, bool]:
    tool = Tool.objects.select_for_update().filter(pk=name).first()
    if tool is not None:
        return tool, False
    try:
        with transaction.atomic():
            return Tool.objects.create(name=name), True
    except IntegrityError:
        return Tool.objects.select_for_update().get(pk=name), False


def tool_register(*, name: str, body: Any, runner: Runner) -> ToolRegistration:
    """Store a contract as a new version if it differs from the latest one.

    A version that weakens the active one is stored inactive; a person allowed to
    activate tools (never the registering runner's owner) must activate it.
    """
    contract = normalize_contract(body)
    digest = sha256_hex(contract)
    actor = Actor.of_runner(runner)
    with transaction.atomic():
        tool, created = _lock_or_create_tool(name)
        latest = tool.versions.order_by("-number").first()
        if latest is not None and latest.contract_hash == digest:
            return ToolRegistration(version=latest, created=False, changed=False)
        active = tool.active_version
        reasons = weakenings(active.contract, contract) if active is not None else []
        now = timezone.now()
        version = ToolVersion.objects.create(
            tool=tool,
            number=latest.number + 1 if latest else 1,
            contract=contract,
            contract_hash=digest,
            weakens=reasons,
            registered_by=runner,
            activated_at=None if reasons else now,
        )
        if not reasons:
            tool.active_version = version
            tool.save(update_fields=["active_version"])
        event_append(
            stream=f"tool:{tool.name}",
            kind="contract_registered",
            actor=actor,
            tool_name=tool.name,
            data={
                "version": version.number,
                "active": not reasons,
                "weakens": reasons,
                "contract_hash": digest,
            },
            now=now,
        )
    return ToolRegistration(version=version, created=created, changed=True)


def tool_version_activate(*, version: ToolVersion, user: Any) -> ToolVersion:
    """Make ``version`` the active contract of its tool (a person's decision)."""
    tool = version.tool
    if not user.is_active or not user.has_perm("operations.activate_tool", tool):
        raise PermissionRefused("You may not activate versions of this tool.")
    registering_runner = version.registered_by
    if registering_runner is not None and registering_runner.owner_id == user.pk:
        raise PermissionRefused(
            "You own the runner that registered this version; someone else must activate it."
        )
    with transaction.atomic():
        tool = Tool.objects.select_for_update().get(pk=tool.pk)
        previous = tool.active_version_id
        now = timezone.now()
        ToolVersion.objects.filter(pk=version.pk).update(activated_at=now, activated_by=user)
        tool.active_version = version
        tool.save(update_fields=["active_version"])
        event_append(
            stream=f"tool:{tool.name}",
            kind="contract_activated",
            actor=Actor.of_user(user),
            tool_name=tool.name,
            data={"version": version.number, "previous_version_id": previous},
            now=now,
        )
    version.refresh_from_db()
    return version


# ---------------------------------------------------------------------------------------
# Runs


def run_create(
    *, runner: Runner, principal: str, external_id: str = "", budgets: dict[str, Any]
) -> Run:
    now = timezone.now()
    deadline_s = budgets.get("deadline_s")
    max_spend = budgets.get("max_spend")
    with transaction.atomic():
        run = Run.objects.create(
            runner=runner,
            principal=principal,
            external_id=external_id,
            max_tool_calls=budgets.get("max_tool_calls"),
            max_turns=budgets.get("max_turns"),
            deadline_s=deadline_s,
            max_spend=Decimal(str(max_spend)) if max_spend is not None else None,
            deadline_at=now + timedelta(seconds=deadline_s) if deadline_s else None,
        )
        event_append(
            stream=run.id,
            kind="run_created",
            actor=Actor.of_runner(runner),
            run=run,
            to_status=run.status,
            data={"principal": principal, "external_id": external_id, "budgets": budgets},
            now=now,
        )
    return run


def run_cancel(*, run: Run, actor: Actor) -> Run:
    """Cancel an active run and its operations that have not started.

    Executing operations keep their lease and are classified by their outcome;
    ``outcome_unknown`` and ``compensating`` ones still need an answer and stay.

    1. The run is cancelled in its own transaction: from then on it takes no
       registration.
    2. Each waiting operation is then cancelled in a transaction of its own. Holding
       the run's lock while taking operations' locks would invert the order that outcome
       posting uses (operation, then the run's spend) and could deadlock.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.status != Run.RunStatus.ACTIVE:
            return run
        now = timezone.now()
        run.status = Run.RunStatus.CANCELLED
        run.ended_at = now
        run.save(update_fields=["status", "ended_at", "updated_at"])
        event_append(
            stream=run.id,
            kind="run_cancelled",
            actor=actor,
            run=run,
            from_status=Run.RunStatus.ACTIVE,
            to_status=run.status,
            now=now,
        )
    waiting = [Status.AWAITING_APPROVAL, Status.READY]
    for operation_id in list(
        run.operations.filter(status__in=waiting).values_list("pk", flat=True)
    ):
        with transaction.atomic():
            op = _lock(operation_id)
            if op.status not in waiting:
                continue
            now = timezone.now()
            _withdraw_pending_request(op, now=now)
            _transition(
                op,
                to=Status.CANCELLED,
                kind="cancelled",
                actor=actor,
                now=now,
                data={"reason": "run cancelled"},
                error_code="cancelled",
                error_detail="The run was cancelled.",
            )
    return run


def run_expire_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """Mark active runs past their deadline as expired (sweep step)."""
    now = now or timezone.now()
    expired = 0
    due = Run.objects.filter(status=Run.RunStatus.ACTIVE, deadline_at__lte=now).values_list(
        "pk", flat=True
    )[:limit]
    for run_id in list(due):
        with transaction.atomic():
            run = (
                Run.objects.select_for_update(skip_locked=True)
                .filter(pk=run_id, status=Run.RunStatus.ACTIVE, deadline_at__lte=now)
                .first()
            )
            if run is None:
                continue
            run.status = Run.RunStatus.EXPIRED
            run.ended_at = now
            run.save(update_fields=["status", "ended_at", "updated_at"])
            event_append(
                stream=run.id,
                kind="run_expired",
                actor=Actor.system("sweep"),
                run=run,
                from_status=Run.RunStatus.ACTIVE,
                to_status=run.status,
                now=now,
            )
            expired += 1
    return expired


# ---------------------------------------------------------------------------------------
# Registration


@dataclass
class Registration:
    operation: Operation
    created: bool
    attempt: Attempt | None = None
    claim_error: errors.DomainError | None = None


def _principal_user(principal: str) -> Any:
    if not principal.startswith("user:"):
        return None
    return get_user_model().objects.filter(username=principal[len("user:") :]).first()


def _freeze(version: ToolVersion, arguments: Any) -> Any:
    schema = version.contract["input_schema"]
    validate_arguments(schema, arguments)
    return freeze_arguments(
        schema,
        arguments,
        key=settings.SENSITIVE_ARGUMENT_KEY,
        key_id=settings.SENSITIVE_ARGUMENT_KEY_ID,
    )


def _replay(existing: Operation, *, tool_name: str, arguments: Any, principal: str) -> Operation:
    """The same operation_key again: the same operation if the intent is unchanged.

    The arguments are frozen under the contract version the operation was registered
    with, so a newer contract cannot make a faithful replay look like a new intent.
    """
    mismatch = errors.IntentMismatch(
        f"operation_key {existing.operation_key!r} is registered as {existing.id} with "
        "another tool, arguments or principal. Use a new operation_key for a new intent.",
        operation=existing.id,
    )
    if tool_name != existing.tool_id:
        raise mismatch
    try:
        frozen = _freeze(existing.tool_version, arguments)
    except errors.InvalidArguments as exc:
        raise mismatch from exc
    if intent_hash(tool=tool_name, arguments=frozen, principal=principal) != existing.intent_hash:
        raise mismatch
    return existing


def _concurrency_value(contract: dict[str, Any], frozen: Any) -> str | None:
    pointer = contract.get("concurrency_key")
    if not pointer:
        return None
    value = resolve_pointer(frozen, pointer)
    if is_missing(value):
        return None
    return hashlib.sha256(canonical_json(value)).hexdigest()


def _retry_target(*, runner: Runner, tool: Tool, operation_id: str) -> Operation:
    """The compensated operation a new registration retries (linked, never reused)."""
    previous = Operation.objects.filter(pk=operation_id, runner=runner).first()
    if previous is None:
        raise errors.NotFound(f"No operation {operation_id!r}.")
    if previous.tool_id != tool.name or previous.status != Status.COMPENSATED:
        raise errors.InvalidRequest(
            "retry_of names a compensated operation of the same tool.",
            errors=[{"path": "/retry_of", "message": f"{previous.id} is {previous.status}"}],
        )
    return previous


def _check_run_budgets(run: Run, *, turn: int | None, now: datetime) -> None:
    """Refuse a registration the run cannot afford. Raises before anything is written."""
    if run.status != Run.RunStatus.ACTIVE:
        raise errors.RunNotActive(f"Run {run.id} is {run.status}.")
    if run.deadline_at is not None and run.deadline_at <= now:
        raise errors.BudgetExhausted(f"Run {run.id} is past its deadline.", budget="deadline_s")
    if run.max_tool_calls is not None and run.tool_calls >= run.max_tool_calls:
        raise errors.BudgetExhausted(
            f"Run {run.id} has used all {run.max_tool_calls} tool calls.", budget="max_tool_calls"
        )
    if run.max_spend is not None and run.spend >= run.max_spend:
        raise errors.BudgetExhausted(
            f"Run {run.id} has spent its budget of {run.max_spend}.", budget="max_spend"
        )
    if run.max_turns is not None and turn is not None and turn > run.max_turns:
        raise errors.BudgetExhausted(
            f"Turn {turn} is past run {run.id}'s budget of {run.max_turns} turns.",
            budget="max_turns",
        )


def _open_request(
    op: Operation,
    *,
    reason: str,
    context: dict[str, Any],
    now: datetime,
) -> ApprovalRequest:
    approval = op.tool_version.contract["approval"]
    barred = {op.principal_user_id, op.runner.owner_id, *context.pop("barred_user_ids", [])}
    context["barred_user_ids"] = sorted(pk for pk in barred if pk is not None)
    request = approval_services.request_open(
        operation=op,
        intent_hash=op.intent_hash,
        approvals_required=approval["approvals_required"],
        request_ttl_s=approval["request_ttl_s"],
        grant_ttl_s=approval["grant_ttl_s"],
        reason=reason,
        context=context,
        now=now,
    )
    transaction.on_commit(partial(_enqueue_notification, request.id))
    return request


def _enqueue_notification(request_id: str) -> None:
    from .tasks import notify_approvers

    notify_approvers.delay(request_id)


def _withdraw_pending_request(op: Operation, *, now: datetime) -> None:
    latest = approval_selectors.request_latest(op)
    if latest is not None and latest.status == ApprovalRequest.RequestStatus.PENDING:
        approval_services.request_withdraw(request=latest, now=now)


def operation_register(
    *,
    runner: Runner,
    run_id: str,
    tool_name: str,
    operation_key: str,
    arguments: Any,
    call_id: str = "",
    turn: int | None = None,
    approval: dict[str, Any] | None = None,
    claim_lease_s: int | None = None,
    retry_of: str | None = None,
    traceparent: str = "",
) -> Registration:
    """Register one intended side effect, or return the one already registered.

    1. Resolve the run (the runner's own) and the tool's active contract version.
    2. A known ``operation_key`` answers the same operation when the intent is the same
       and ``intent_mismatch`` otherwise, before any budget is consulted: a runner that
       crashed after registering must get its operation back.
    3. Check invoke permission, validate and freeze the arguments, hash the intent.
    4. Under the run's row lock: check the run's budgets, insert the operation (the
       unique key settles races between runs), count the tool call, evaluate the
       approval policy, append the events, and claim the first attempt if asked.
    """
    from .selectors import run_get_for_runner

    run = run_get_for_runner(runner=runner, run_id=run_id)
    existing = (
        Operation.objects.select_related("tool_version")
        .filter(runner=runner, operation_key=operation_key)
        .first()
    )
    if existing is not None:
        return Registration(
            operation=_replay(
                existing, tool_name=tool_name, arguments=arguments, principal=run.principal
            ),
            created=False,
        )
    tool = Tool.objects.select_related("active_version").filter(pk=tool_name).first()
    if tool is None or tool.active_version is None:
        raise errors.UnknownTool(f"No tool named {tool_name!r} is registered.")
    previous = _retry_target(runner=runner, tool=tool, operation_id=retry_of) if retry_of else None
    if not runner_may_invoke(runner, tool):
        raise errors.ToolForbidden(f"Runner {runner.name} may not invoke {tool.name}.")
    version = tool.active_version
    frozen = _freeze(version, arguments)
    digest = intent_hash(tool=tool.name, arguments=frozen, principal=run.principal)
    contract = version.contract
    wants_approval = bool(approval and approval.get("require"))
    policy = evaluate_policy(
        contract["approval"],
        frozen,
        runner_requested=wants_approval,
        runner_reason=(approval or {}).get("reason"),
    )
    actor = Actor.of_runner(runner)

    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        now = timezone.now()
        _check_run_budgets(run, turn=turn, now=now)
        deadline_s = contract["retry"]["deadline_s"]
        op = Operation(
            runner=runner,
            run=run,
            tool=tool,
            tool_version=version,
            effect_class=contract["effect_class"],
            call_id=call_id,
            operation_key=operation_key,
            arguments=frozen,
            intent_hash=digest,
            principal=run.principal,
            principal_user=_principal_user(run.principal),
            status=Status.AWAITING_APPROVAL if policy.required else Status.READY,
            deadline_at=now + timedelta(seconds=deadline_s) if deadline_s else None,
            concurrency_value=_concurrency_value(contract, frozen),
            turn=turn,
            status_changed_at=now,
            previous=previous,
            traceparent=traceparent if TRACEPARENT.match(traceparent) else "",
        )
        try:
            with transaction.atomic():
                op.save(force_insert=True)
        except IntegrityError:
            existing = Operation.objects.select_related("tool_version").get(
                runner=runner, operation_key=operation_key
            )
            return Registration(
                operation=_replay(
                    existing, tool_name=tool_name, arguments=arguments, principal=run.principal
                ),
                created=False,
            )
        Run.objects.filter(pk=run.pk).update(
            tool_calls=F("tool_calls") + 1,
            turns=max(run.turns, turn or 0),
            updated_at=now,
        )
        event_append(
            stream=op.id,
            kind="registered",
            actor=actor,
            operation=op,
            to_status=op.status,
            data={
                "tool": tool.name,
                "tool_version": version.number,
                "operation_key": operation_key,
                "call_id": call_id,
                "intent_hash": digest,
                "turn": turn,
                "retry_of": previous.id if previous else None,
            },
            now=now,
        )
        if policy.required:
            request = _open_request(
                op,
                reason=policy.reason,
                context={
                    "matched_rules": policy.matched_rules,
                    "policy_mode": policy.mode,
                    "runner_reason": policy.runner_reason,
                },
                now=now,
            )
            _record(
                op,
                kind="approval_requested",
                actor=actor,
                now=now,
                data={"approval": request.id, "reason": request.reason},
            )
        outbox_enqueue(op=op, event_type=f"operation.{op.status}", now=now)
        registration = Registration(operation=op, created=True)
        if claim_lease_s is not None and op.status == Status.READY:
            result = _claim_locked(op, runner=runner, lease_s=claim_lease_s, now=now)
            if isinstance(result, errors.DomainError):
                registration.claim_error = result
            else:
                registration.attempt = result
    return registration


# ---------------------------------------------------------------------------------------
# Claims


def attempt_claim(*, operation: Operation, runner: Runner, lease_s: int) -> Attempt:
    """Claim the next attempt of an operation: ``ready`` -> ``executing``.

    Committed before it returns, so the runner calls the outside world only once the
    claim is durable. Refusals follow api.md's order.
    """
    with transaction.atomic():
        op = _lock(operation.pk)
        result = _claim_locked(op, runner=runner, lease_s=lease_s, now=timezone.now())
    if isinstance(result, errors.DomainError):
        raise result
    return result


def _retry_after_ms(until: datetime, now: datetime) -> int:
    return max(1, int((until - now).total_seconds() * 1000) + 1)


def _claim_locked(
    op: Operation, *, runner: Runner, lease_s: int, now: datetime
) -> Attempt | errors.DomainError:
    actor = Actor.of_runner(runner)
    if op.status == Status.EXECUTING:
        if op.lease_until is not None and op.lease_until > now:
            return errors.AttemptInProgress(
                f"Attempt {op.attempts} holds a lease until {_iso(op.lease_until)}.",
                retry_after_ms=_retry_after_ms(op.lease_until, now),
            )
        _expire_lease_locked(op, actor=actor, now=now)

    if op.status in machine.TERMINAL:
        return errors.OperationClosed(f"Operation {op.id} is {op.status}.")
    if op.status == Status.OUTCOME_UNKNOWN:
        return errors.ReconciliationRequired()
    if op.status == Status.COMPENSATING:
        return errors.CompensationRequired()
    if op.status == Status.AWAITING_APPROVAL:
        return errors.ApprovalRequired()
    if not runner_may_invoke(runner, op.tool):
        return errors.ToolForbidden(f"Runner {runner.name} may not invoke {op.tool_id}.")

    request = approval_selectors.request_latest(op)
    if request is not None:
        problem = approval_services.grant_problem(
            request=request, intent_hash=op.intent_hash, tool=op.tool, now=now
        )
        if problem is not None:
            new_request = _open_request(
                op,
                reason=f"A new approval is needed: {problem}.",
                context={
                    "replaces": request.id,
                    "grant_problem": problem,
                    "barred_user_ids": request.context.get("barred_user_ids", []),
                },
                now=now,
            )
            _transition(
                op,
                to=Status.AWAITING_APPROVAL,
                kind="grant_invalid",
                actor=actor,
                now=now,
                data={"problem": problem, "approval": new_request.id, "previous": request.id},
            )
            return errors.GrantInvalid(f"The grant cannot be used: {problem}.")

    refusal = _breaker_admits_locked(op, now=now)
    if refusal is not None:
        return refusal
    if op.not_before is not None and op.not_before > now:
        return errors.RetryLater(
            f"The next attempt may start at {_iso(op.not_before)}.",
            retry_after_ms=_retry_after_ms(op.not_before, now),
        )
    max_attempts = op.tool_version.contract["retry"]["max_attempts"]
    if (op.deadline_at is not None and op.deadline_at <= now) or op.attempts >= max_attempts:
        target = machine.end_without_retry(
            effect_class=op.effect_class,
            unknown_sticky=op.unknown_sticky,
            wanted=Status.BUDGET_EXHAUSTED,
        )
        why = "deadline passed" if op.attempts < max_attempts else "no attempts left"
        _enter(
            op,
            to=target,
            kind="budget_exhausted",
            actor=actor,
            now=now,
            data={"reason": why},
            error_code="budget_exhausted",
            error_detail=f"The operation's budget is exhausted: {why}.",
        )
        return errors.BudgetExhausted(f"The operation's budget is exhausted: {why}.")

    conflict = errors.ConcurrencyConflict(
        "Another operation on the same resource is executing or awaiting an answer."
    )
    if op.concurrency_value is not None and (
        Operation.objects.filter(
            tool_id=op.tool_id,
            concurrency_value=op.concurrency_value,
            status__in=list(machine.BLOCKING),
        )
        .exclude(pk=op.pk)
        .exists()
    ):
        return conflict
    number = op.attempts + 1
    lease_until = now + timedelta(seconds=lease_s)
    try:
        # The partial unique index is the last word on the concurrency key: a rival that
        # committed after the check above makes this savepoint fail, not the claim's
        # whole transaction.
        with transaction.atomic():
            attempt = Attempt.objects.create(
                operation=op, number=number, claimed_at=now, lease_until=lease_until
            )
            _transition(
                op,
                to=Status.EXECUTING,
                kind="claimed",
                actor=actor,
                now=now,
                data={"attempt": number, "lease_until": lease_until},
                attempts=number,
                lease_until=lease_until,
                not_before=None,
            )
    except IntegrityError:
        op.refresh_from_db()
        return conflict
    return attempt


# ---------------------------------------------------------------------------------------
# Circuit breakers (contract block "breaker")


def _breaker_config(op: Operation) -> dict[str, Any] | None:
    # The tool's active contract governs its breaker: it protects the downstream service,
    # whichever version an operation was registered under.
    active = op.tool.active_version
    return (active.contract if active is not None else op.tool_version.contract).get("breaker")


def _breaker_event(tool: Tool, kind: str, *, actor: Actor, now: datetime, **data: Any) -> None:
    event_append(
        stream=f"tool:{tool.name}",
        kind=kind,
        actor=actor,
        tool_name=tool.name,
        data={"state": tool.breaker_state, "failures": tool.breaker_failures, **data},
        now=now,
    )


def _breaker_admits_locked(op: Operation, *, now: datetime) -> errors.DomainError | None:
    """Refuse a claim while the tool's breaker is open; let one probe through after.

    Open: refused until the cool-down has passed. Then half-open: this claim becomes the
    one probe; other claims wait while the probe executes. The probe's outcome closes
    or reopens the breaker (``_breaker_record_locked``).
    """
    config = _breaker_config(op)
    if config is None or op.tool.breaker_state == Tool.BreakerState.CLOSED:
        return None
    tool = Tool.objects.select_for_update().get(pk=op.tool_id)
    State = Tool.BreakerState
    system = Actor.system("breaker")
    if tool.breaker_state == State.OPEN:
        until = tool.breaker_opened_at + timedelta(seconds=config["cooldown_s"])
        if now < until:
            return errors.RetryLater(
                f"The circuit breaker of {tool.name} is open until {_iso(until)}.",
                retry_after_ms=_retry_after_ms(until, now),
                breaker="open",
            )
        tool.breaker_state = State.HALF_OPEN
        tool.breaker_probe = op
        tool.save(update_fields=["breaker_state", "breaker_probe"])
        _breaker_event(tool, "breaker_half_open", actor=system, now=now, probe=op.id)
        return None
    if tool.breaker_state == State.HALF_OPEN and tool.breaker_probe_id != op.id:
        probe = Operation.objects.filter(pk=tool.breaker_probe_id).only("status").first()
        if probe is not None and probe.status == Status.EXECUTING:
            return errors.RetryLater(
                f"The circuit breaker of {tool.name} is half-open: one probe is running.",
                retry_after_ms=1000,
                breaker="half_open",
            )
        tool.breaker_probe = op
        tool.save(update_fields=["breaker_probe"])
        _breaker_event(tool, "breaker_half_open", actor=system, now=now, probe=op.id)
    return None


def _breaker_record_locked(op: Operation, *, succeeded: bool, code: str, now: datetime) -> None:
    """Count an outcome towards the tool's breaker: consecutive failures open it."""
    config = _breaker_config(op)
    if config is None:
        return
    failed = not succeeded and code in config["failure_codes"]
    State = Tool.BreakerState
    cached = op.tool
    is_probe = cached.breaker_state == State.HALF_OPEN and cached.breaker_probe_id == op.id
    if succeeded and cached.breaker_state == State.CLOSED and cached.breaker_failures == 0:
        return
    if not succeeded and not failed and not is_probe:
        return
    tool = Tool.objects.select_for_update().get(pk=op.tool_id)
    system = Actor.system("breaker")
    if succeeded:
        was_closed = tool.breaker_state == State.CLOSED
        tool.breaker_state, tool.breaker_failures, tool.breaker_probe = State.CLOSED, 0, None
        tool.save(update_fields=["breaker_state", "breaker_failures", "breaker_probe"])
        if not was_closed:
            _breaker_event(tool, "breaker_closed", actor=system, now=now, operation=op.id)
    elif failed and tool.breaker_state == State.HALF_OPEN:
        tool.breaker_state, tool.breaker_opened_at, tool.breaker_probe = State.OPEN, now, None
        tool.save(update_fields=["breaker_state", "breaker_opened_at", "breaker_probe"])
        _breaker_event(
            tool,
            "breaker_opened",
            actor=system,
            now=now,
            reason="the probe failed",
            code=code,
            operation=op.id,
        )
    elif failed and tool.breaker_state == State.CLOSED:
        tool.breaker_failures += 1
        if tool.breaker_failures >= config["threshold"]:
            tool.breaker_state, tool.breaker_opened_at = State.OPEN, now
            tool.save(update_fields=["breaker_failures", "breaker_state", "breaker_opened_at"])
            _breaker_event(
                tool,
                "breaker_opened",
                actor=system,
                now=now,
                reason=f"{tool.breaker_failures} consecutive failures",
                code=code,
            )
        else:
            tool.save(update_fields=["breaker_failures"])
    elif is_probe:
        # The probe ended in a way that says nothing about the service (a permanent
        # error of its own, say): stay half-open and let the next claim probe.
        tool.breaker_probe = None
        tool.save(update_fields=["breaker_probe"])


def tool_breaker_set(*, tool: Tool, open_it: bool, user: Any) -> Tool:
    """A person opens or closes a tool's breaker by hand."""
    if not user.is_active or not user.has_perm("operations.activate_tool", tool):
        raise PermissionRefused("You may not operate the circuit breaker of this tool.")
    with transaction.atomic():
        tool = Tool.objects.select_for_update().get(pk=tool.pk)
        now = timezone.now()
        State = Tool.BreakerState
        if open_it:
            tool.breaker_state, tool.breaker_opened_at, tool.breaker_probe = State.OPEN, now, None
        else:
            tool.breaker_state, tool.breaker_failures, tool.breaker_probe = State.CLOSED, 0, None
        tool.save(
            update_fields=[
                "breaker_state",
                "breaker_opened_at",
                "breaker_failures",
                "breaker_probe",
            ]
        )
        kind = "breaker_forced_open" if open_it else "breaker_forced_closed"
        _breaker_event(tool, kind, actor=Actor.of_user(user), now=now)
    return tool


# ---------------------------------------------------------------------------------------
# Inbound provider events (contract block "inbound")

INBOUND_TOLERANCE = timedelta(minutes=5)


def tool_inbound_secret_set(*, tool: Tool, secret: str, actor: Actor) -> Tool:
    """Set the secret that signs a provider's events for this tool (never logged)."""
    if not secret.startswith("whsec_"):
        raise errors.InvalidRequest("Inbound secrets are whsec_... strings (Standard Webhooks).")
    with transaction.atomic():
        tool = Tool.objects.select_for_update().get(pk=tool.pk)
        tool.inbound_secret_encrypted = encrypt(secret)
        tool.save(update_fields=["inbound_secret_encrypted"])
        event_append(
            stream=f"tool:{tool.name}", kind="inbound_secret_set", actor=actor, tool_name=tool.name
        )
    return tool


@dataclass(frozen=True)
class InboundReceipt:
    event: InboundEvent
    duplicate: bool


def inbound_receive(*, tool_name: str, headers: dict[str, str], body: bytes) -> InboundReceipt:
    """Verify and record a provider's event, then apply it as evidence.

    1. The tool must have an inbound mapping and a secret; the Standard Webhooks
       signature must verify and the timestamp lie within five minutes of now.
    2. The event is recorded under a unique (tool, event id) and committed before any
       other work: a duplicate delivery answers as such and changes nothing.
    3. It is then matched and applied (``inbound_apply``); if that fails, the event stays
       ``received`` and the sweep applies it later.
    """
    from .parsers import loads_strict

    tool = Tool.objects.select_related("active_version").filter(pk=tool_name).first()
    config = tool.active_version.contract.get("inbound") if tool and tool.active_version else None
    if tool is None or config is None or not tool.inbound_secret_encrypted:
        raise errors.NotFound(f"No inbound events are configured for {tool_name!r}.")
    msg_id = headers.get("webhook-id", "")
    stamp = headers.get("webhook-timestamp", "")
    signature = headers.get("webhook-signature", "")
    if not (msg_id and stamp.isdigit() and signature):
        raise errors.InvalidSignature("webhook-id, webhook-timestamp and webhook-signature needed.")
    secret = decrypt(tool.inbound_secret_encrypted)
    if not webhooks_verify(secret, msg_id, int(stamp), body, signature):
        raise errors.InvalidSignature("No signature matches the tool's inbound secret.")
    now = timezone.now()
    sent_at = datetime.fromtimestamp(int(stamp), tz=UTC)
    if abs(now - sent_at) > INBOUND_TOLERANCE:
        raise errors.StaleEvent(f"The event was signed at {_iso(sent_at)}; replays are refused.")
    payload = loads_strict(body)
    try:
        with transaction.atomic():
            event = InboundEvent.objects.create(
                tool=tool,
                event_id=msg_id[:255],
                sent_at=sent_at,
                received_at=now,
                payload=payload if isinstance(payload, dict) else {"payload": payload},
            )
    except IntegrityError:
        return InboundReceipt(InboundEvent.objects.get(tool=tool, event_id=msg_id[:255]), True)
    try:
        event = inbound_apply(event_id=event.pk)
    except Exception:
        logger.exception("Inbound event %s recorded but not applied; the sweep retries.", event.pk)
    return InboundReceipt(event, False)


def inbound_apply(*, event_id: str) -> InboundEvent:
    """Match a recorded event to an operation and apply it as reconciliation evidence.

    A success closes an ``outcome_unknown`` or ``executing`` operation as succeeded (an
    executing attempt becomes stale); a definitive failure takes the ``not_found`` path
    of an ``outcome_unknown`` operation. Anything else is kept as evidence on the trace.
    """
    Inbound = InboundEvent.InboundStatus
    with transaction.atomic():
        event = (
            InboundEvent.objects.select_for_update(of=("self",))
            .select_related("tool__active_version")
            .get(pk=event_id)
        )
        if event.status != Inbound.RECEIVED:
            return event
        now = timezone.now()
        config = event.tool.active_version.contract.get("inbound") or {}
        event_type = resolve_pointer(event.payload, config.get("type", "/type"))
        event.event_type = str(event_type)[:255] if not is_missing(event_type) else ""
        if event.event_type in config.get("succeeded", []):
            event.outcome = "succeeded"
        elif event.event_type in config.get("failed", []):
            event.outcome = "failed"
        reference = _inbound_value(event.payload, config.get("downstream_id"))
        candidates = Operation.objects.filter(tool=event.tool)
        match = None
        key = _inbound_value(event.payload, config.get("idempotency_key"))
        if key:
            match = candidates.filter(idempotency_key=key).values_list("pk", flat=True).first()
        if match is None and reference:
            match = candidates.filter(downstream_id=reference).values_list("pk", flat=True).first()
        event.processed_at = now
        if match is None:
            event.status = Inbound.UNMATCHED
            event.save()
            return event
        op = _lock(match)
        event.operation = op
        actor = Actor.system("inbound")
        data = {
            "inbound_event": event.id,
            "event_id": event.event_id,
            "event_type": event.event_type,
            "outcome": event.outcome or None,
            "downstream_id": reference or None,
            "source": "inbound",
        }
        if event.outcome == "succeeded" and op.status in (
            Status.OUTCOME_UNKNOWN,
            Status.EXECUTING,
        ):
            if op.status == Status.EXECUTING:
                current = _current_attempt(op)
                if current is not None:
                    current.status = AttemptStatus.SUPERSEDED
                    current.closed_at = now
                    current.save(update_fields=["status", "closed_at"])
            _succeed(
                op,
                kind="reconciled",
                actor=actor,
                now=now,
                data={**data, "result": "committed"},
                downstream_id=reference,
            )
            event.status = Inbound.APPLIED
        elif event.outcome == "failed" and op.status == Status.OUTCOME_UNKNOWN:
            _reconcile_locked(
                op, result="not_found", actor=actor, now=now, data={**data, "result": "not_found"}
            )
            event.status = Inbound.APPLIED
        else:
            _record(op, kind="inbound_evidence", actor=actor, now=now, data=data)
            event.status = Inbound.MATCHED
        event.save()
    return event


def _inbound_value(payload: Any, pointer: str | None) -> str:
    if not pointer:
        return ""
    value = resolve_pointer(payload, pointer)
    return str(value)[:255] if not is_missing(value) and value is not None else ""


def inbound_apply_pending(*, limit: int = 100) -> int:
    """Apply events that were recorded but not applied (sweep step)."""
    pending = list(
        InboundEvent.objects.filter(
            status=InboundEvent.InboundStatus.RECEIVED,
            received_at__lte=timezone.now() - timedelta(seconds=10),
        ).values_list("pk", flat=True)[:limit]
    )
    for event_id in pending:
        inbound_apply(event_id=event_id)
    return len(pending)


# ---------------------------------------------------------------------------------------
# Outcomes, leases and late results


def _enter(op: Operation, *, to: Status, **kwargs: Any) -> Event:
    """A transition that also prepares the target state's bookkeeping."""
    if to == Status.OUTCOME_UNKNOWN:
        # The first lookup waits a short grace: a request the runner sent just before its
        # lease ran out may still be on its way to the provider, and a lookup that
        # answers "not found" before it lands would allow a second effect.
        grace = timedelta(seconds=settings.RECONCILE_FIRST_PROBE_DELAY_S)
        kwargs.setdefault("next_probe_at", kwargs["now"] + grace)
        kwargs.setdefault("probes", 0)
    else:
        kwargs.setdefault("next_probe_at", None)
    kwargs.setdefault("snoozed_until", None)
    return _transition(op, to=to, **kwargs)


def _succeed(
    op: Operation,
    *,
    kind: str,
    actor: Actor,
    now: datetime,
    data: dict[str, Any],
    downstream_id: str = "",
    result: Any = None,
) -> Event:
    """Close an operation as succeeded: the effect happened, whoever says so (the
    runner's outcome, a late one, a reconciliation answer, a provider's event)."""
    return _enter(
        op,
        to=Status.SUCCEEDED,
        kind=kind,
        actor=actor,
        now=now,
        data=data,
        result=result if result is not None else op.result,
        downstream_id=downstream_id or op.downstream_id,
        error_code="",
        error_detail="",
        unknown_sticky=False,
    )


def _settle(
    op: Operation,
    *,
    kind: str,
    code: str,
    detail: str,
    actor: Actor,
    now: datetime,
    event_kind: str,
    attempt_number: int,
    retry_after_ms: int | None = None,
    result: Any = None,
    downstream_id: str = "",
) -> None:
    """Apply the outcome table (product.md §3) to an executing operation."""
    contract = op.tool_version.contract
    retry = contract["retry"]
    verdict = machine.classify_outcome(
        effect_class=op.effect_class,
        kind=kind,
        code=code or None,
        retryable_codes=retry["retryable_codes"],
    )
    sticky = op.unknown_sticky or (kind == "unknown" and machine.is_write(op.effect_class))
    data = {"attempt": attempt_number, "kind": kind, "code": code, "verdict": verdict.value}
    common = {"actor": actor, "now": now, "kind": event_kind, "unknown_sticky": sticky}
    _breaker_record_locked(op, succeeded=kind == "succeeded", code=code, now=now)

    if verdict == Verdict.SUCCEEDED:
        _succeed(
            op,
            kind=event_kind,
            actor=actor,
            now=now,
            data=data,
            result=result,
            downstream_id=downstream_id,
        )
    elif verdict == Verdict.FAILED_PERMANENT:
        target = machine.end_without_retry(
            effect_class=op.effect_class, unknown_sticky=sticky, wanted=Status.FAILED_PERMANENT
        )
        _enter(op, to=target, data=data, error_code=code, error_detail=detail, **common)
    elif verdict == Verdict.COMPENSATE:
        _enter(
            op, to=Status.COMPENSATING, data=data, error_code=code, error_detail=detail, **common
        )
    elif verdict == Verdict.RECONCILE:
        _enter(
            op, to=Status.OUTCOME_UNKNOWN, data=data, error_code=code, error_detail=detail, **common
        )
    else:
        delay_ms = machine.backoff_delay_ms(
            attempt=op.attempts,
            base_delay_ms=retry["base_delay_ms"],
            max_delay_ms=retry["max_delay_ms"],
        )
        delay_ms = max(delay_ms, retry_after_ms or 0)
        not_before = now + timedelta(milliseconds=delay_ms)
        budget = machine.Budget(
            attempts_used=op.attempts,
            max_attempts=retry["max_attempts"],
            deadline_at=op.deadline_at,
        )
        if machine.retry_possible(budget, not_before=not_before):
            data["not_before"] = not_before
            _enter(
                op,
                to=Status.READY,
                data=data,
                not_before=not_before,
                error_code=code,
                error_detail=detail,
                **common,
            )
        else:
            target = machine.end_without_retry(
                effect_class=op.effect_class, unknown_sticky=sticky, wanted=Status.BUDGET_EXHAUSTED
            )
            data["budget"] = "attempts" if op.attempts >= retry["max_attempts"] else "deadline"
            _enter(
                op,
                to=target,
                data=data,
                error_code=code,
                error_detail=f"No retry left after attempt {op.attempts}. {detail}".strip(),
                **common,
            )


def _current_attempt(op: Operation) -> Attempt | None:
    return (
        Attempt.objects.select_for_update()
        .filter(operation=op, number=op.attempts, status=AttemptStatus.EXECUTING)
        .first()
    )


def _expire_lease_locked(op: Operation, *, actor: Actor, now: datetime) -> None:
    """An expired lease with no outcome is an ``unknown`` outcome (product.md §3)."""
    attempt = _current_attempt(op)
    if attempt is not None:
        attempt.status = AttemptStatus.LEASE_EXPIRED
        attempt.closed_at = now
        attempt.save(update_fields=["status", "closed_at"])
    _settle(
        op,
        kind="unknown",
        code="lease_expired",
        detail=f"The lease of attempt {op.attempts} expired with no outcome.",
        actor=actor,
        now=now,
        event_kind="lease_expired",
        attempt_number=op.attempts,
    )


def _outcome_body(body: dict[str, Any]) -> dict[str, Any]:
    """The stored form of a posted outcome, for comparing a repeat with the original."""
    return {key: value for key, value in body.items() if value is not None}


def attempt_record_outcome(
    *, operation: Operation, number: int, body: dict[str, Any], runner: Runner
) -> Operation:
    """Record what an attempt did and classify the operation.

    The same outcome again answers the operation unchanged; a different one for an
    attempt that has one is ``outcome_conflict``. Once something acted on the attempt's
    expired lease, every post is a late outcome: recorded, answered ``stale_attempt``,
    and only a late success changes state.
    """
    actor = Actor.of_runner(runner)
    posted = _outcome_body(body)
    with transaction.atomic():
        op = _lock(operation.pk)
        now = timezone.now()
        attempt = Attempt.objects.select_for_update().filter(operation=op, number=number).first()
        if attempt is None:
            raise errors.NotFound(f"Operation {op.id} has no attempt {number}.")
        result: Operation | errors.DomainError
        if attempt.status in (AttemptStatus.LEASE_EXPIRED, AttemptStatus.SUPERSEDED):
            result = _late_outcome_locked(op, attempt=attempt, body=posted, actor=actor, now=now)
        elif attempt.status != AttemptStatus.EXECUTING:
            if canonical_json(attempt.outcome) == canonical_json(posted):
                result = op
            else:
                _record(
                    op,
                    kind="outcome_conflict",
                    actor=actor,
                    now=now,
                    data={
                        "attempt": number,
                        "recorded": attempt.status,
                        "posted": posted["kind"],
                        "code": posted.get("code"),
                    },
                )
                result = errors.OutcomeConflict(
                    f"Attempt {number} already ended {attempt.status}. If the effect is now "
                    "known to have happened, post a reconciliation."
                )
        else:
            result = _apply_outcome_locked(op, attempt=attempt, body=posted, actor=actor, now=now)
    if isinstance(result, errors.DomainError):
        raise result
    return result


def _add_spend(op: Operation, cost: Any) -> None:
    if cost:
        Run.objects.filter(pk=op.run_id).update(spend=F("spend") + Decimal(str(cost)))


def _apply_outcome_locked(
    op: Operation, *, attempt: Attempt, body: dict[str, Any], actor: Actor, now: datetime
) -> Operation:
    kind = body["kind"]
    attempt.status = {
        "succeeded": AttemptStatus.SUCCEEDED,
        "failed": AttemptStatus.FAILED,
        "unknown": AttemptStatus.UNKNOWN,
    }[kind]
    attempt.outcome = body
    attempt.outcome_code = body.get("code", "")
    attempt.closed_at = now
    attempt.save(update_fields=["status", "outcome", "outcome_code", "closed_at"])
    _add_spend(op, body.get("cost"))
    _settle(
        op,
        kind=kind,
        code=body.get("code", "unknown" if kind == "unknown" else ""),
        detail=body.get("detail", ""),
        actor=actor,
        now=now,
        event_kind="outcome",
        attempt_number=attempt.number,
        retry_after_ms=body.get("retry_after_ms"),
        result=body.get("result"),
        downstream_id=body.get("downstream_id", ""),
    )
    return op


def _late_outcome_locked(
    op: Operation, *, attempt: Attempt, body: dict[str, Any], actor: Actor, now: datetime
) -> errors.DomainError:
    _record(
        op,
        kind="late_outcome",
        actor=actor,
        now=now,
        data={"attempt": attempt.number, "outcome": body},
    )
    _add_spend(op, body.get("cost"))
    if body["kind"] == "succeeded" and op.status in machine.LATE_SUCCESS_FROM:
        # The effect happened: that is evidence whatever else went on meanwhile.
        if op.status == Status.EXECUTING:
            newer = _current_attempt(op)
            if newer is not None:
                newer.status = AttemptStatus.SUPERSEDED
                newer.closed_at = now
                newer.save(update_fields=["status", "closed_at"])
        _withdraw_pending_request(op, now=now)
        _succeed(
            op,
            kind="late_success",
            actor=actor,
            now=now,
            data={"attempt": attempt.number, "downstream_id": body.get("downstream_id")},
            result=body.get("result"),
            downstream_id=body.get("downstream_id", ""),
        )
    elif (
        body["kind"] == "unknown"
        and attempt.not_applied
        and op.effect_class == machine.EffectClass.IRREVERSIBLE
        and op.status in (Status.READY, Status.AWAITING_APPROVAL)
    ):
        # Reconciliation said this attempt did not happen, and now its runner says it
        # sent it and never heard back: the request may have landed after the lookup.
        # The "not found" is no longer safe to act on, so the question is open again.
        _withdraw_pending_request(op, now=now)
        _enter(
            op,
            to=Status.OUTCOME_UNKNOWN,
            kind="reopened",
            actor=actor,
            now=now,
            data={"attempt": attempt.number, "reason": "a late unknown outcome after not_found"},
            unknown_sticky=True,
            error_code=body.get("code", "unknown"),
            error_detail=f"Attempt {attempt.number} reported an unknown outcome after "
            "reconciliation found it had not happened; reconcile again.",
        )
        Attempt.objects.filter(pk=attempt.pk).update(not_applied=False)
    return errors.StaleAttempt(
        f"Attempt {attempt.number}'s lease ended before this outcome; it was recorded as a "
        "late outcome."
    )


def attempt_heartbeat(
    *, operation: Operation, number: int, lease_s: int, runner: Runner
) -> Attempt:
    with transaction.atomic():
        op = _lock(operation.pk)
        now = timezone.now()
        attempt = Attempt.objects.select_for_update().filter(operation=op, number=number).first()
        if attempt is None:
            raise errors.NotFound(f"Operation {op.id} has no attempt {number}.")
        if attempt.status != AttemptStatus.EXECUTING or attempt.lease_until <= now:
            raise errors.StaleAttempt(f"Attempt {number} no longer holds a lease.")
        attempt.lease_until = now + timedelta(seconds=lease_s)
        attempt.last_heartbeat_at = now
        attempt.save(update_fields=["lease_until", "last_heartbeat_at"])
        op.lease_until = attempt.lease_until
        op.save(update_fields=["lease_until", "updated_at"])
        _record(
            op,
            kind="heartbeat",
            actor=Actor.of_runner(runner),
            now=now,
            data={"attempt": number, "lease_until": attempt.lease_until},
        )
    return attempt


def lease_expire_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """Treat every expired lease as an ``unknown`` outcome (sweep step).

    Safe on many workers at once: each operation is taken with SKIP LOCKED and checked
    again under its lock, so a claim or outcome that got there first wins.
    """
    now = now or timezone.now()
    handled = 0
    due = Operation.objects.filter(status=Status.EXECUTING, lease_until__lte=now).values_list(
        "pk", flat=True
    )[:limit]
    for operation_id in list(due):
        with transaction.atomic():
            op = (
                Operation.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related(*LOCK_RELATED)
                .filter(pk=operation_id, status=Status.EXECUTING, lease_until__lte=now)
                .first()
            )
            if op is None:
                continue
            _expire_lease_locked(op, actor=Actor.system("sweep"), now=now)
            handled += 1
    return handled


def operation_deadline_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """End waiting operations past their deadline (sweep step)."""
    now = now or timezone.now()
    handled = 0
    waiting = [Status.READY, Status.AWAITING_APPROVAL]
    due = Operation.objects.filter(status__in=waiting, deadline_at__lte=now).values_list(
        "pk", flat=True
    )[:limit]
    for operation_id in list(due):
        with transaction.atomic():
            op = (
                Operation.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related(*LOCK_RELATED)
                .filter(pk=operation_id, status__in=waiting, deadline_at__lte=now)
                .first()
            )
            if op is None:
                continue
            _withdraw_pending_request(op, now=now)
            _enter(
                op,
                to=machine.end_without_retry(
                    effect_class=op.effect_class,
                    unknown_sticky=op.unknown_sticky,
                    wanted=Status.BUDGET_EXHAUSTED,
                ),
                kind="budget_exhausted",
                actor=Actor.system("sweep"),
                now=now,
                data={"reason": "deadline passed"},
                error_code="budget_exhausted",
                error_detail="The operation's deadline passed before it could run.",
            )
            handled += 1
    return handled


# ---------------------------------------------------------------------------------------
# Reconciliation and compensation


def operation_reconcile(
    *,
    operation: Operation,
    result: str,
    actor: Actor,
    downstream_id: str = "",
    evidence: dict[str, Any] | None = None,
    source: str = "runner",
) -> Operation:
    """Answer the question an ``outcome_unknown`` operation asks: did it happen?

    ``committed`` closes it as succeeded. ``not_found`` marks its unknown attempts as
    not applied and lets it try again (irreversible tools only through a new approval
    that shows the evidence), or ends it when nothing is left. ``still_unknown``
    schedules the next probe with backoff, up to the contract's ``max_probes``.
    Runners and automatic probes answer here; people answer through
    ``operation_resolve``, which adds the four-eyes rule.
    """
    with transaction.atomic():
        op = _lock(operation.pk)
        now = timezone.now()
        _require_unknown(op)
        data = {
            "result": result,
            "downstream_id": downstream_id or None,
            "evidence": evidence or {},
            "source": source,
        }
        _reconcile_locked(op, result=result, actor=actor, now=now, data=data)
    return op


def _require_unknown(op: Operation) -> None:
    if op.status != Status.OUTCOME_UNKNOWN:
        raise errors.NotUnknown(f"Operation {op.id} is {op.status}, not outcome_unknown.")


def _reconcile_locked(
    op: Operation,
    *,
    result: str,
    actor: Actor,
    now: datetime,
    data: dict[str, Any],
    barred_user_ids: list[int] | None = None,
) -> None:
    if result == "committed":
        _succeed(
            op,
            kind="reconciled",
            actor=actor,
            now=now,
            data=data,
            downstream_id=data.get("downstream_id") or "",
        )
    elif result == "not_found":
        _not_found_locked(op, actor=actor, now=now, data=data, barred_user_ids=barred_user_ids)
    else:
        _probe_scheduled_locked(op, actor=actor, now=now, data=data)


def _probe_scheduled_locked(
    op: Operation, *, actor: Actor, now: datetime, data: dict[str, Any]
) -> None:
    """A probe that settled nothing: count it and schedule the next one with backoff."""
    max_probes = op.tool_version.contract["reconcile"]["max_probes"]
    op.probes += 1
    exhausted = op.probes >= max_probes
    op.next_probe_at = None if exhausted else now + machine.next_probe_delay(probes=op.probes)
    op.save(update_fields=["probes", "next_probe_at", "updated_at"])
    data.update(probes=op.probes, probes_exhausted=exhausted, next_probe_at=op.next_probe_at)
    _record(op, kind="probe", actor=actor, now=now, data=data)


def operation_probe_failed(*, operation: Operation, error: str, actor: Actor) -> Operation:
    """A lookup that gave no usable answer (timeout, refused, not the expected JSON)."""
    with transaction.atomic():
        op = _lock(operation.pk)
        if op.status != Status.OUTCOME_UNKNOWN:
            return op
        data = {"result": "failed", "error": error[:500], "source": "probe"}
        _probe_scheduled_locked(op, actor=actor, now=timezone.now(), data=data)
    return op


# ---------------------------------------------------------------------------------------
# Reconciliation by people (the console)

RECONCILE_PERMISSION = "operations.reconcile_tool"


def _require_reconcile_permission(user: Any, tool: Tool) -> None:
    if not user.is_active or not user.has_perm(RECONCILE_PERMISSION, tool):
        raise PermissionRefused(f"You may not reconcile operations of {tool.name}.")


def operation_resolve(
    *,
    operation: Operation,
    user: Any,
    result: str,
    downstream_id: str = "",
    note: str = "",
    snooze_until: datetime | None = None,
) -> Operation:
    """A person's answer to an ``outcome_unknown`` operation, with evidence.

    - ``committed`` needs a downstream reference or an evidence note.
    - ``not_found`` ("did not happen") needs a note; for an irreversible tool it only
      proposes the answer, which a second person must confirm
      (``operation_resolution_confirm``).
    - ``still_unknown`` snoozes the operation in the queue until ``snooze_until``.
    """
    note = note.strip()
    downstream_id = downstream_id.strip()
    with transaction.atomic():
        op = _lock(operation.pk)
        _require_reconcile_permission(user, op.tool)
        _require_unknown(op)
        now = timezone.now()
        actor = Actor.of_user(user)
        evidence = {"note": note} if note else {}
        data = {
            "result": result,
            "downstream_id": downstream_id or None,
            "evidence": evidence,
            "source": "person",
        }
        if result == "committed":
            if not (downstream_id or note):
                raise DecisionRefused("Give the downstream reference or an evidence note.")
            _reconcile_locked(op, result=result, actor=actor, now=now, data=data)
        elif result == "not_found":
            if not note:
                raise DecisionRefused("Say how you know the effect did not happen.")
            if op.effect_class == machine.EffectClass.IRREVERSIBLE:
                if op.resolutions.filter(review__isnull=True).exists():
                    raise DecisionRefused("A 'did not happen' already waits for confirmation.")
                resolution = Resolution.objects.create(
                    operation=op, declared_by=user, note=note, evidence=evidence, created_at=now
                )
                _record(
                    op,
                    kind="resolution_proposed",
                    actor=actor,
                    now=now,
                    data={"resolution": resolution.id, "result": "not_found", "note": note},
                )
            else:
                _reconcile_locked(
                    op, result=result, actor=actor, now=now, data=data, barred_user_ids=[user.pk]
                )
        elif result == "still_unknown":
            if snooze_until is None or snooze_until <= now:
                raise DecisionRefused("Choose a time in the future to look again.")
            op.snoozed_until = snooze_until
            op.save(update_fields=["snoozed_until", "updated_at"])
            _record(
                op,
                kind="snoozed",
                actor=actor,
                now=now,
                data={**data, "snoozed_until": snooze_until},
            )
        else:
            raise DecisionRefused(f"Unknown resolution {result!r}.")
    return op


def operation_resolution_confirm(
    *, resolution_id: str, user: Any, confirm: bool, note: str = ""
) -> Operation:
    """The second person's answer to a proposed "did not happen" (four eyes).

    Confirming applies ``not_found``: the irreversible operation goes back for a new
    approval, which the declarer may not give. Disputing closes the proposal and the
    operation stays unknown.
    """
    note = note.strip()
    resolution = Resolution.objects.filter(pk=resolution_id).only("operation_id").first()
    if resolution is None:
        raise errors.NotFound(f"No resolution {resolution_id!r}.")
    with transaction.atomic():
        op = _lock(resolution.operation_id)
        resolution = Resolution.objects.select_related("declared_by").get(pk=resolution_id)
        _require_reconcile_permission(user, op.tool)
        if resolution.status != "pending":
            raise DecisionRefused(f"This proposal is {resolution.status}.")
        if resolution.declared_by_id == user.pk:
            raise DecisionRefused(
                "You declared that it did not happen; someone else must confirm it."
            )
        now = timezone.now()
        actor = Actor.of_user(user)
        Decision = ResolutionReview.Decision
        result: Operation | Exception = op
        if op.status != Status.OUTCOME_UNKNOWN:
            ResolutionReview.objects.create(
                resolution=resolution, decision=Decision.WITHDRAWN, user=None, note=note, at=now
            )
            result = errors.NotUnknown(
                f"Operation {op.id} is {op.status} now; the proposal is withdrawn."
            )
        elif confirm:
            ResolutionReview.objects.create(
                resolution=resolution, decision=Decision.CONFIRMED, user=user, note=note, at=now
            )
            data = {
                "result": "not_found",
                "downstream_id": None,
                "evidence": {**resolution.evidence, "confirmation": note},
                "source": "person",
                "resolution": resolution.id,
                "declared_by": resolution.declared_by.get_username(),
                "confirmed_by": user.get_username(),
            }
            _reconcile_locked(
                op,
                result="not_found",
                actor=actor,
                now=now,
                data=data,
                barred_user_ids=[resolution.declared_by_id],
            )
        else:
            if not note:
                raise DecisionRefused("Say why you dispute it.")
            ResolutionReview.objects.create(
                resolution=resolution, decision=Decision.DISPUTED, user=user, note=note, at=now
            )
            _record(
                op,
                kind="resolution_disputed",
                actor=actor,
                now=now,
                data={"resolution": resolution.id, "note": note},
            )
    if isinstance(result, Exception):
        raise result
    return result


def operation_note_add(*, operation: Operation, user: Any, note: str) -> Operation:
    """Evidence without an answer: a note on the operation's trace."""
    note = note.strip()
    if not note:
        raise DecisionRefused("The note is empty.")
    with transaction.atomic():
        op = _lock(operation.pk)
        _require_reconcile_permission(user, op.tool)
        _record(op, kind="note", actor=Actor.of_user(user), now=timezone.now(), data={"note": note})
    return op


def operation_compensated_by_hand(*, operation: Operation, user: Any, note: str) -> Operation:
    """A person records that a failed undo was done by hand."""
    if not note.strip():
        raise DecisionRefused("Say how the undo was done.")
    _require_reconcile_permission(user, operation.tool)
    return operation_compensate(
        operation=operation,
        result="committed",
        actor=Actor.of_user(user),
        evidence={"note": note.strip(), "by_hand": True},
    )


def _not_found_locked(
    op: Operation,
    *,
    actor: Actor,
    now: datetime,
    data: dict[str, Any],
    barred_user_ids: list[int] | None = None,
) -> None:
    Attempt.objects.filter(
        operation=op,
        status__in=[AttemptStatus.UNKNOWN, AttemptStatus.LEASE_EXPIRED],
        not_applied=False,
    ).update(not_applied=True)
    contract = op.tool_version.contract
    out_of_time = op.deadline_at is not None and op.deadline_at <= now
    out_of_attempts = op.attempts >= contract["retry"]["max_attempts"]
    common = {
        "actor": actor,
        "now": now,
        "kind": "reconciled",
        "unknown_sticky": False,
    }
    if out_of_time or out_of_attempts:
        why = "deadline passed" if out_of_time else "no attempts left"
        _enter(
            op,
            to=Status.BUDGET_EXHAUSTED,
            data={**data, "budget": why},
            error_code="budget_exhausted",
            error_detail=f"The effect did not happen and the budget is exhausted: {why}.",
            **common,
        )
    elif op.effect_class == machine.EffectClass.IRREVERSIBLE:
        request = _open_request(
            op,
            reason=(
                "Reconciliation found that the earlier attempt did not happen. Approve to "
                "try again, having read the evidence."
            ),
            context={"reconciliation": data, "barred_user_ids": barred_user_ids or []},
            now=now,
        )
        _enter(
            op,
            to=Status.AWAITING_APPROVAL,
            data={**data, "approval": request.id},
            error_code="",
            error_detail="",
            **common,
        )
    else:
        _enter(
            op,
            to=Status.READY,
            data=data,
            not_before=None,
            error_code="",
            error_detail="",
            **common,
        )


def operation_compensate(
    *,
    operation: Operation,
    result: str,
    actor: Actor,
    evidence: dict[str, Any] | None = None,
) -> Operation:
    """Record the outcome of a compensable operation's undo."""
    with transaction.atomic():
        op = _lock(operation.pk)
        now = timezone.now()
        if op.status != Status.COMPENSATING:
            raise errors.NotCompensating(f"Operation {op.id} is {op.status}, not compensating.")
        data = {"result": result, "evidence": evidence or {}}
        if result == "committed":
            _enter(
                op,
                to=Status.COMPENSATED,
                kind="compensation",
                actor=actor,
                now=now,
                data=data,
                error_code="compensated",
                error_detail="The effect was undone.",
            )
        else:
            op.error_code = "compensation_failed"
            op.error_detail = "The undo failed; the operation waits in the reconciliation queue."
            op.save(update_fields=["error_code", "error_detail", "updated_at"])
            _record(op, kind="compensation", actor=actor, now=now, data=data)
    return op


# ---------------------------------------------------------------------------------------
# Approval decisions (people, from the console or the admin)


def _lock_request(request_id: str) -> tuple[Operation, ApprovalRequest]:
    """Lock an approval request and its operation (operation first, as everywhere)."""
    request = ApprovalRequest.objects.filter(pk=request_id).only("operation_id").first()
    if request is None:
        raise errors.NotFound(f"No approval {request_id!r}.")
    op = _lock(request.operation_id)
    request = ApprovalRequest.objects.select_for_update().get(pk=request_id)
    return op, request


def _expire_request_locked(op: Operation, request: ApprovalRequest, *, now: datetime) -> bool:
    if not approval_services.request_expire(request=request, now=now):
        return False
    if op.status == Status.AWAITING_APPROVAL:
        _enter(
            op,
            to=Status.REJECTED,
            kind="approval_expired",
            actor=Actor.system("sweep"),
            now=now,
            data={"approval": request.id},
            error_code="approval_expired",
            error_detail="Nobody decided on the approval request before it expired.",
        )
    _approval_decided(op, request, now=now)
    return True


def approval_decide(
    *, request_id: str, user: Any, approve: bool, comment: str, otp_verified: bool = False
) -> Operation:
    """One person's decision on a pending request, and the transition that follows.

    Approving counts towards the quorum; the approval that meets it creates a grant and
    moves the operation to ``ready``. A rejection (with a reason) ends the operation as
    ``rejected``; the runner receives the reason. Separation of duties is checked by
    ``approvals.services.may_decide``, and so is the second factor: ``otp_verified``
    says whether the person's session was verified with a one-time password, which
    ``decision_needs_second_factor`` may require.
    """
    result: Operation | Exception
    with transaction.atomic():
        op, request = _lock_request(request_id)
        now = timezone.now()
        if request.status == ApprovalRequest.RequestStatus.PENDING and request.expires_at <= now:
            _expire_request_locked(op, request, now=now)
        try:
            decided = approval_services.decision_record(
                request=request,
                user=user,
                tool=op.tool,
                approve=approve,
                comment=comment,
                now=now,
                second_factor_required=decision_needs_second_factor(op),
                second_factor_verified=otp_verified,
            )
        except Refusal as refusal:
            result = refusal
        else:
            actor = Actor.of_user(user)
            _record(
                op,
                kind="decision",
                actor=actor,
                now=now,
                data={
                    "approval": request.id,
                    "decision": decided.decision.decision,
                    "comment": decided.decision.comment,
                    "approvals": request.decisions.filter(decision="approve").count(),
                    "approvals_required": request.approvals_required,
                },
            )
            if decided.outcome == "approved":
                _enter(
                    op,
                    to=Status.READY,
                    kind="granted",
                    actor=actor,
                    now=now,
                    data={
                        "approval": request.id,
                        "grant": decided.grant.id,
                        "intent_hash": decided.grant.intent_hash,
                        "expires_at": decided.grant.expires_at,
                    },
                )
            elif decided.outcome == "rejected":
                _enter(
                    op,
                    to=Status.REJECTED,
                    kind="rejected",
                    actor=actor,
                    now=now,
                    data={"approval": request.id, "reason": decided.decision.comment},
                    error_code="approval_rejected",
                    error_detail=decided.decision.comment,
                )
            if decided.outcome != "pending":
                _approval_decided(op, request, now=now)
            result = op
    if isinstance(result, Exception):
        raise result
    return result


def approval_revoke(*, request_id: str, user: Any, reason: str) -> Operation:
    """Revoke a grant. Attempts already executing go on; the next claim is refused."""
    with transaction.atomic():
        op, request = _lock_request(request_id)
        if not user.is_active or not user.has_perm(approval_services.DECIDE_PERMISSION, op.tool):
            raise PermissionRefused("You may not revoke grants for this tool.")
        if not reason.strip():
            raise DecisionRefused("Say why the grant is revoked.")
        if request.status != ApprovalRequest.RequestStatus.APPROVED:
            raise DecisionRefused(f"This request is {request.status}; no grant to revoke.")
        now = timezone.now()
        grant = approval_services.grant_revoke(request=request, user=user, reason=reason, now=now)
        _record(
            op,
            kind="grant_revoked",
            actor=Actor.of_user(user),
            now=now,
            data={"approval": request.id, "grant": grant.id, "reason": grant.revoke_reason},
        )
        _approval_decided(op, request, now=now)
    return op


def approval_expire_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """End operations whose approval request expired undecided (sweep step)."""
    now = now or timezone.now()
    handled = 0
    due = ApprovalRequest.objects.filter(
        status=ApprovalRequest.RequestStatus.PENDING, expires_at__lte=now
    ).values_list("pk", "operation_id")[:limit]
    for request_id, operation_id in list(due):
        with transaction.atomic():
            op = (
                Operation.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related(*LOCK_RELATED)
                .filter(pk=operation_id)
                .first()
            )
            if op is None:
                continue
            request = ApprovalRequest.objects.select_for_update().get(pk=request_id)
            handled += _expire_request_locked(op, request, now=now)
    return handled


# ---------------------------------------------------------------------------------------
# Sweep


@dataclass(frozen=True)
class SweepReport:
    leases_expired: int
    approvals_expired: int
    operations_past_deadline: int
    runs_expired: int


def sweep(*, now: datetime | None = None) -> SweepReport:
    """Every time-driven transition, once. Idempotent; safe to run concurrently."""
    now = now or timezone.now()
    return SweepReport(
        leases_expired=lease_expire_due(now=now),
        approvals_expired=approval_expire_due(now=now),
        operations_past_deadline=operation_deadline_due(now=now),
        runs_expired=run_expire_due(now=now),
    )


# ---------------------------------------------------------------------------------------
# Console sign-ins and sign-outs (console/signals.py): audited like every other action.

SESSION_EVENT_KINDS = frozenset({"signed_in", "signed_out"})


def user_session_record(*, user: Any, kind: str, ip: str = "") -> Event:
    """Append ``signed_in`` or ``signed_out`` to the person's stream ``user:<pk>``."""
    if kind not in SESSION_EVENT_KINDS:
        raise ValueError(f"Not a session event: {kind!r}.")
    with transaction.atomic():
        # The person's row is the stream's lock: two sign-ins at once append in turn.
        get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
        return event_append(
            stream=f"user:{user.pk}",
            kind=kind,
            actor=Actor.of_user(user),
            data={"ip": ip or None},
        )


# ---------------------------------------------------------------------------------------
# Security (issue 8, docs/security.md): runner tokens managed by people in the console,
# the second factor for deciding on irreversible tools, account security events.

RUNNER_ADMIN_PERMISSION = "operations.change_runner"
ACCOUNT_EVENT_KINDS = frozenset(
    {
        "second_factor_added",
        "second_factor_verified",
        "second_factor_failed",
        "sessions_ended",
    }
)


def decision_needs_second_factor(op: Operation) -> bool:
    """Whether deciding on ``op`` needs a session verified with a one-time password.

    With ``REQUIRE_TOTP_FOR_IRREVERSIBLE`` on, approving or rejecting an irreversible
    operation does; ``approval_decide`` refuses a decision without it, so every way to
    decide (console, admin, anything added later) is covered by one rule.
    """
    return (
        settings.REQUIRE_TOTP_FOR_IRREVERSIBLE
        and op.effect_class == machine.EffectClass.IRREVERSIBLE
    )


def may_manage_runners(user: Any) -> bool:
    """Who may list runners' tokens, issue and revoke them: the built-in model
    permission ``operations.change_runner`` (superusers hold every permission)."""
    return bool(user.is_active and user.has_perm(RUNNER_ADMIN_PERMISSION))


def _require_runner_admin(user: Any) -> None:
    if not may_manage_runners(user):
        raise PermissionRefused("Managing runner tokens needs the 'change runner' permission.")


def token_issue_by_user(
    *,
    runner: Runner,
    user: Any,
    scopes: list[str],
    label: str = "",
    expires_at: datetime | None = None,
) -> str:
    """A person issues a token from the console; it is returned only here."""
    _require_runner_admin(user)
    unknown = set(scopes) - set(RunnerToken.ALL_SCOPES)
    if not scopes or unknown:
        raise errors.InvalidRequest(f"Choose scopes among {', '.join(RunnerToken.ALL_SCOPES)}.")
    if expires_at is not None and expires_at <= timezone.now():
        raise errors.InvalidRequest("The expiry must be in the future.")
    return token_create(
        runner=runner, actor=Actor.of_user(user), scopes=scopes, label=label, expires_at=expires_at
    )


def token_revoke_by_user(*, token: RunnerToken, user: Any) -> RunnerToken:
    """A person revokes a token from the console; the next request with it is 401."""
    _require_runner_admin(user)
    return token_revoke(token=token, actor=Actor.of_user(user))


def user_account_record(
    *, user: Any, kind: str, actor: Actor | None = None, data: dict[str, Any] | None = None
) -> Event:
    """Append an account security event (second factor, sessions ended) to the person's
    stream ``user:<pk>``; ``actor`` is the person unless someone else acted."""
    if kind not in ACCOUNT_EVENT_KINDS:
        raise ValueError(f"Not an account event: {kind!r}.")
    with transaction.atomic():
        get_user_model().objects.select_for_update().filter(pk=user.pk).exists()
        return event_append(
            stream=f"user:{user.pk}",
            kind=kind,
            actor=actor or Actor.of_user(user),
            data=data or {},
        )
