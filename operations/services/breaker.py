"""Circuit breakers per tool (contract block ``breaker``)."""

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from approvals.people import Person

from .. import access, errors
from ..machine import EventKind, Status
from ..models import (
    Operation,
    Tool,
)
from .core import (
    Actor,
    event_append,
    iso,
    retry_after_ms,
)


def _breaker_config(op: Operation) -> dict[str, Any] | None:
    # The tool's active contract governs its breaker: it protects the downstream service,
    # whichever version an operation was registered under.
    active = op.tool.active_version
    return (active.contract if active is not None else op.tool_version.contract).get("breaker")


def _breaker_event(
    tool: Tool, kind: EventKind, *, actor: Actor, now: datetime, **data: Any
) -> None:
    event_append(
        stream=f"tool:{tool.name}",
        kind=kind,
        actor=actor,
        tool_name=tool.name,
        data={"state": tool.breaker_state, "failures": tool.breaker_failures, **data},
        now=now,
    )


def breaker_admits_locked(op: Operation, *, now: datetime) -> errors.DomainError | None:
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
        # Opened by hand or by failures, the time is always set with the state; a row
        # edited to "open" without one counts as opened now.
        opened_at = tool.breaker_opened_at or now
        until = opened_at + timedelta(seconds=config["cooldown_s"])
        if now < until:
            return errors.RetryLater(
                f"The circuit breaker of {tool.name} is open until {iso(until)}.",
                retry_after_ms=retry_after_ms(until, now),
                breaker="open",
            )
        tool.breaker_state = State.HALF_OPEN
        tool.breaker_probe = op
        tool.save(update_fields=["breaker_state", "breaker_probe"])
        _breaker_event(tool, EventKind.BREAKER_HALF_OPEN, actor=system, now=now, probe=op.id)
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
        _breaker_event(tool, EventKind.BREAKER_HALF_OPEN, actor=system, now=now, probe=op.id)
    return None


def breaker_record_locked(op: Operation, *, succeeded: bool, code: str, now: datetime) -> None:
    """Count an outcome towards the tool's breaker: consecutive failures open it."""
    config = _breaker_config(op)
    if config is None:
        return
    if not access.runner_may_invoke(op.runner, op.tool):
        # A runner no longer allowed on the tool cannot trip it for everyone else.
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
            _breaker_event(tool, EventKind.BREAKER_CLOSED, actor=system, now=now, operation=op.id)
    elif failed and tool.breaker_state == State.HALF_OPEN:
        tool.breaker_state, tool.breaker_opened_at, tool.breaker_probe = State.OPEN, now, None
        tool.save(update_fields=["breaker_state", "breaker_opened_at", "breaker_probe"])
        _breaker_event(
            tool,
            EventKind.BREAKER_OPENED,
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
                EventKind.BREAKER_OPENED,
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
    # The operation's copy of the tool learns it too: a batch's outcomes of one tool
    # share it (``outcomes.attempts_lock``), and the next one's check above reads it.
    cached.breaker_state, cached.breaker_failures = tool.breaker_state, tool.breaker_failures
    cached.breaker_probe_id = tool.breaker_probe_id
    cached.breaker_opened_at = tool.breaker_opened_at


def tool_breaker_set(*, tool: Tool, open_it: bool, user: Person) -> Tool:
    """A person opens or closes a tool's breaker by hand."""
    access.require_operate_breaker(user, tool)
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
        kind = EventKind.BREAKER_FORCED_OPEN if open_it else EventKind.BREAKER_FORCED_CLOSED
        _breaker_event(tool, kind, actor=Actor.of_user(user), now=now)
    return tool
