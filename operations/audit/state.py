"""The ledger state the events explain (see the package's docstring)."""

from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from django.db.models import (
    Exists,
    F,
    OuterRef,
    Q,
    Subquery,
    Value,
)
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Concat

from approvals.models import (
    ApprovalRequest,
    Decision,
    Grant,
)

from ..canonical import intent_hash
from ..contracts import concurrency_value
from ..machine import EventKind
from ..models import (
    Event,
    Operation,
    Resolution,
    ResolutionReview,
)
from ..payloads import iso
from ..services.terms import (
    approval_terms,
)
from .chains import CHUNK
from .policies import _policies
from .rows import (
    Unexplained,
    _batches,
    _Count,
    _differences,
    _events,
    _first_data,
    _same_time,
    _shown,
)
from .standing import _signers, _standing_grants
from .streams import _runs, _tools


def _decisions() -> Iterator[Unexplained]:
    """Every decision has the ``decision`` event that recorded it: same approval,
    same person (the event's actor), same verdict; and it was taken before its request
    expired (the service refuses one after)."""
    rows = Decision.objects.annotate(
        evented=Exists(
            _events(
                EventKind.DECISION,
                stream=OuterRef("request__operation_id"),
                approval=OuterRef("request_id"),
                decision=OuterRef("decision"),
            ).filter(actor_user_id=OuterRef("user_id"))
        )
    ).values(
        "pk",
        "request_id",
        "request__operation_id",
        "request__expires_at",
        "user_id",
        "decision",
        "at",
        "evented",
    )
    for row in rows.order_by("pk").iterator(chunk_size=CHUNK):
        problem = None
        if not row["evented"]:
            problem = (
                f"no decision event in {row['request__operation_id']} records user "
                f"{row['user_id']}'s {row['decision']} on approval {row['request_id']}"
            )
        elif row["at"] >= row["request__expires_at"]:
            problem = (
                f"it is dated {iso(row['at'])}, but its request {row['request_id']} "
                f"expired at {iso(row['request__expires_at'])}"
            )
        if problem:
            yield Unexplained("approvals.Decision", str(row["pk"]), problem)


# The events that open a request (registration, a grant found invalid at claim, a "did
# not happen" for an irreversible tool) and those that settle one. A request may also
# become withdrawn (its operation ended otherwise) or expired (while its operation was
# not waiting for it) without an event of its own; pending is where every one starts.
REQUEST_OPENED_BY = (EventKind.APPROVAL_REQUESTED, EventKind.GRANT_INVALID, EventKind.RECONCILED)


def _opening(*, request: str, operation: str) -> dict[str, Any]:
    """Annotations for ``_opened_with`` of the request whose id is the column
    ``request`` of the queried model and whose operation is reached by ``operation``:
    the data, kind and time of the first event that opened it, and its operation's
    intent hash and contract approval block."""
    opening = _events(
        REQUEST_OPENED_BY, stream=OuterRef(f"{operation}_id"), approval=OuterRef(request)
    ).order_by("seq")
    return {
        "opened": _first_data(opening),
        "opened_kind": Subquery(opening.values("kind")[:1]),
        "opened_at": Subquery(opening.values("at")[:1]),
        "operation_intent": F(f"{operation}__intent_hash"),
        "approval_block": KeyTransform("approval", f"{operation}__tool_version__contract"),
    }


OPENING_COLUMNS = ("opened", "opened_kind", "opened_at", "operation_intent", "approval_block")


def _opened_with(row: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The terms a request was opened with, and what says so.

    Its opening event's ``terms`` (``services.terms.approval_terms``). An opening event
    written before the events recorded them has none: then what every request was
    opened with until then, which its operation's contract version (verified by its
    hash) and the opening event's time give: the intent hash, the quorum, the grant's
    lifetime, the expiry and the escalation group. The escalation's time, the barred
    people and the editable fields of such a request are not compared.
    """
    opened = row["opened"] if isinstance(row["opened"], dict) else {}
    kind = row["opened_kind"]
    if isinstance(opened.get("terms"), dict):
        return opened["terms"], f"its {kind} event opened it with"
    approval = row["approval_block"] if isinstance(row["approval_block"], dict) else {}
    derived: dict[str, Any] = {"intent_hash": row["operation_intent"]}
    for key in ("approvals_required", "grant_ttl_s"):
        if approval.get(key) is not None:
            derived[key] = approval[key]
    ttl = approval.get("request_ttl_s")
    if isinstance(ttl, int) and row["opened_at"] is not None:
        derived["expires_at"] = iso(row["opened_at"] + timedelta(seconds=ttl))
    escalates = bool(approval.get("escalate_after_s"))
    derived["escalate_to"] = approval.get("escalate_to", "") if escalates else ""
    return derived, f"its contract version and its {kind} event's time give"


def _approvers(request_ids: list[str]) -> dict[str, list[int]]:
    """The people whose approving decisions each of ``request_ids`` holds, sorted."""
    found: dict[str, list[int]] = {}
    approving = Decision.objects.filter(
        request_id__in=request_ids, decision=Decision.Verdict.APPROVE
    ).values_list("request_id", "user_id")
    for request_id, user_id in approving.order_by("request_id", "user_id"):
        found.setdefault(request_id, []).append(user_id)
    return found


def _grant_problem(row: dict[str, Any], approvers: list[int]) -> str | None:
    granted = row["granted"]
    if not isinstance(granted, dict):
        return f"no granted event in {row['request__operation_id']} gave it"
    if granted.get("standing_grant") != row["standing_grant_id"]:
        return (
            f"its standing grant is {_shown(row['standing_grant_id'])}, but its granted event "
            f"names {_shown(granted.get('standing_grant'))}"
        )
    if row["standing_grant_id"] is not None and not row["use_evented"]:
        return (
            f"no standing_grant_used event of {row['standing_grant_id']} records the use "
            "that gave it"
        )
    if granted.get("approval") != row["request_id"]:
        return (
            f"it belongs to approval {row['request_id']}, its granted event to "
            f"{granted.get('approval')}"
        )
    if granted.get("intent_hash") != row["intent_hash"]:
        return "its intent_hash is not the one its granted event bound"
    if not _same_time(granted.get("expires_at"), row["expires_at"]):
        return (
            f"its expires_at is {iso(row['expires_at'])}, but its granted event says "
            f"{granted.get('expires_at')}"
        )
    if row["revoked_evented"] and row["revoked_at"] is None:
        return "a grant_revoked event revoked it, but revoked_at is empty"
    if row["revoked_at"] is not None and not row["revoked_evented"]:
        return "revoked_at is set, but no grant_revoked event revoked it"
    # Granted events written before they named the deciders are compared on the rest.
    deciders = granted.get("deciders")
    if deciders is not None and deciders != approvers:
        whose = (
            "the signers of its standing grant"
            if row["standing_grant_id"] is not None
            else "the approving decisions of its request"
        )
        return (
            f"its deciders are users {_shown(approvers)} ({whose}), but its granted event "
            f"names {_shown(deciders)}"
        )
    required = _opened_with(row)[0].get("approvals_required")
    if isinstance(required, int) and len(approvers) < required:
        plural = "" if len(approvers) == 1 else "s"
        return (
            f"it was given on {len(approvers)} approval{plural}, but its request was "
            f"opened requiring {required}"
        )
    return None


def _grants() -> Iterator[Unexplained]:
    """Every grant has its ``granted`` event, and agrees with it on the approval, the
    intent hash, the expiry, the standing grant and the deciders (the request's
    approving decisions, or the signers of the standing grant a use of which gave it, at
    least as many as the quorum its request was opened with); one given by a standing
    grant has the ``standing_grant_used`` event of that use; it is revoked exactly when
    a ``grant_revoked`` event says so."""
    stream = OuterRef("request__operation_id")
    rows = Grant.objects.annotate(
        granted=_first_data(_events(EventKind.GRANTED, stream=stream, grant=OuterRef("pk"))),
        revoked_evented=Exists(
            _events(EventKind.GRANT_REVOKED, stream=stream, grant=OuterRef("pk"))
        ),
        use_evented=Exists(
            _events(
                EventKind.STANDING_GRANT_USED,
                stream=Concat(Value("sgr:"), OuterRef("standing_grant_id")),
                grant=OuterRef("pk"),
            )
        ),
        **_opening(request="request_id", operation="request__operation"),
    ).values(
        "pk",
        "request_id",
        "request__operation_id",
        "standing_grant_id",
        "intent_hash",
        "expires_at",
        "revoked_at",
        "granted",
        "revoked_evented",
        "use_evented",
        *OPENING_COLUMNS,
    )
    for batch in _batches(rows.order_by("pk").iterator(chunk_size=CHUNK)):
        approvers = _approvers([row["request_id"] for row in batch])
        signers = _signers([row["standing_grant_id"] for row in batch if row["standing_grant_id"]])
        for row in batch:
            deciders = (
                signers.get(row["standing_grant_id"], [])
                if row["standing_grant_id"] is not None
                else approvers.get(row["request_id"], [])
            )
            problem = _grant_problem(row, deciders)
            if problem:
                yield Unexplained("approvals.Grant", row["pk"], problem)


# The columns of a standing grant that ``services.terms.standing_grant_terms`` reads.
REQUEST_STATUS_AFTER = {
    EventKind.GRANTED: ApprovalRequest.RequestStatus.APPROVED,
    EventKind.REJECTED: ApprovalRequest.RequestStatus.REJECTED,
    EventKind.GRANT_REVOKED: ApprovalRequest.RequestStatus.REVOKED,
    EventKind.APPROVAL_EXPIRED: ApprovalRequest.RequestStatus.EXPIRED,
    EventKind.SUPERSEDED: ApprovalRequest.RequestStatus.SUPERSEDED,
}
REQUEST_STATUSES_WITHOUT_EVENT = {
    ApprovalRequest.RequestStatus.PENDING,
    ApprovalRequest.RequestStatus.EXPIRED,
    ApprovalRequest.RequestStatus.WITHDRAWN,
}


# The columns of a request that ``services.terms.approval_terms`` reads.
TERM_COLUMNS = (
    "intent_hash",
    "approvals_required",
    "expires_at",
    "grant_ttl_s",
    "escalate_at",
    "escalate_to",
    "context",
)


def _request_terms(row: dict[str, Any]) -> dict[str, Any]:
    """A request row's terms, with the editable fields of its operation's contract
    version as it is now."""
    approval = row["approval_block"] if isinstance(row["approval_block"], dict) else {}
    request = SimpleNamespace(**{column: row[column] for column in TERM_COLUMNS})
    # A context forged into something else than an object bars nobody, and reads so.
    if not isinstance(request.context, dict):
        request.context = {}
    return approval_terms(request, editable=approval.get("editable"))


def _approval_requests() -> Iterator[Unexplained]:
    """Every request was opened by an event, its status is the one its last settling
    event left, it has as many decisions as ``decision`` events name it, and every
    column that decides who may approve what, until when, is the one it was opened with
    (``_opened_with``)."""
    stream, approval = OuterRef("operation_id"), OuterRef("pk")
    rows = ApprovalRequest.objects.annotate(
        **_opening(request="pk", operation="operation"),
        settled_by=Subquery(
            _events(tuple(REQUEST_STATUS_AFTER), stream=stream, approval=approval)
            .order_by("-seq")
            .values("kind")[:1]
        ),
        decision_rows=_Count(Decision.objects.filter(request=OuterRef("pk")).values("pk")),
        decision_events=_Count(
            _events(EventKind.DECISION, stream=stream, approval=approval).values("pk")
        ),
    ).values(
        "pk",
        "operation_id",
        "status",
        "settled_by",
        "decision_rows",
        "decision_events",
        *TERM_COLUMNS,
        *OPENING_COLUMNS,
    )
    for row in rows.order_by("pk").iterator(chunk_size=CHUNK):
        status, settled_by = row["status"], row["settled_by"]
        problem = None
        if row["opened"] is None:
            problem = (
                f"no event in {row['operation_id']} opened it "
                f"({', '.join(REQUEST_OPENED_BY)} naming it)"
            )
        elif settled_by is None and status not in REQUEST_STATUSES_WITHOUT_EVENT:
            problem = f"its status is {status}, but no event settled it"
        elif settled_by is not None and status != REQUEST_STATUS_AFTER[settled_by]:
            problem = (
                f"its status is {status}, but its last {settled_by} event left it "
                f"{REQUEST_STATUS_AFTER[settled_by]}"
            )
        elif row["decision_rows"] != row["decision_events"]:
            problem = (
                f"it has {row['decision_rows']} decisions, but {row['decision_events']} "
                "decision events name it"
            )
        else:
            problem = _differences(_request_terms(row), *_opened_with(row))
        if problem:
            yield Unexplained("approvals.ApprovalRequest", row["pk"], problem)


def _resolutions() -> Iterator[Unexplained]:
    """Every "did not happen" proposal has its ``resolution_proposed`` event, by the
    person who declared it."""
    rows = Resolution.objects.annotate(
        evented=Exists(
            _events(
                EventKind.RESOLUTION_PROPOSED,
                stream=OuterRef("operation_id"),
                resolution=OuterRef("pk"),
            ).filter(actor_user_id=OuterRef("declared_by_id"))
        )
    ).values("pk", "operation_id", "evented")
    for row in rows.order_by("pk").iterator(chunk_size=CHUNK):
        if not row["evented"]:
            yield Unexplained(
                "operations.Resolution",
                row["pk"],
                f"no resolution_proposed event in {row['operation_id']} by its declarer",
            )


def _resolution_reviews() -> Iterator[Unexplained]:
    """A confirmation has the ``reconciled`` event it applied, a dispute its
    ``resolution_disputed`` event, both by the reviewer. A withdrawal has no event of
    its own (the service writes none): the operation left ``outcome_unknown`` after the
    proposal, which its stream must show."""
    stream, resolution = OuterRef("resolution__operation_id"), OuterRef("resolution_id")
    by_reviewer = Q(actor_user_id=OuterRef("user_id"))
    rows = ResolutionReview.objects.annotate(
        confirmed_evented=Exists(
            _events(EventKind.RECONCILED, stream=stream, resolution=resolution).filter(by_reviewer)
        ),
        disputed_evented=Exists(
            _events(EventKind.RESOLUTION_DISPUTED, stream=stream, resolution=resolution).filter(
                by_reviewer
            )
        ),
        proposed_seq=Subquery(
            _events(EventKind.RESOLUTION_PROPOSED, stream=stream, resolution=resolution).values(
                "seq"
            )[:1]
        ),
        left_unknown=Exists(
            Event.objects.filter(stream=stream, seq__gt=OuterRef("proposed_seq")).exclude(
                to_status="outcome_unknown"
            )
        ),
    ).values(
        "pk",
        "resolution_id",
        "decision",
        "confirmed_evented",
        "disputed_evented",
        "left_unknown",
    )
    Review = ResolutionReview.Decision
    explained_by = {
        Review.CONFIRMED: ("confirmed_evented", "no reconciled event by the reviewer applied it"),
        Review.DISPUTED: (
            "disputed_evented",
            "no resolution_disputed event by the reviewer records it",
        ),
        Review.WITHDRAWN: (
            "left_unknown",
            "it is withdrawn, but no event after the proposal took the operation out of "
            "outcome_unknown",
        ),
    }
    for row in rows.order_by("pk").iterator(chunk_size=CHUNK):
        column, problem = explained_by.get(
            row["decision"], ("", f"unknown decision {row['decision']!r}")
        )
        if not row.get(column):
            yield Unexplained(
                "operations.ResolutionReview",
                str(row["pk"]),
                f"review of {row['resolution_id']}: {problem}",
            )


def _recomputed_intent(row: dict[str, Any]) -> str | None:
    """The intent hash of the operation's stored arguments, or None when they cannot be
    canonicalized any more (a float past 2**53 comes back from jsonb as an integer that
    RFC 8785 refuses): then only the comparison with the registered event holds."""
    try:
        return intent_hash(
            tool=row["tool_id"], arguments=row["arguments"], principal=row["principal"]
        )
    except ValueError:
        return None


def _jump(stream: str, seq: int) -> str:
    """What the first event that does not start where its predecessor ended says."""
    event = Event.objects.filter(stream=stream, seq=seq).values("kind", "from_status").get()
    before = Event.objects.filter(stream=stream, seq=seq - 1).values_list("to_status", flat=True)
    return (
        f"its event seq {seq} ({event['kind']}) starts from {event['from_status']}, but the "
        f"event before it left {before.first()}"
    )


def _recomputed_concurrency(row: dict[str, Any]) -> str | None:
    """The concurrency value of the operation's stored arguments under its contract
    version's ``concurrency_key``, or the stored one when the arguments cannot be
    canonicalized any more (see ``_recomputed_intent``)."""
    try:
        return concurrency_value({"concurrency_key": row["concurrency_key"]}, row["arguments"])
    except ValueError:
        return row["concurrency_value"]


def _contract_columns(row: dict[str, Any]) -> str | None:
    """What is wrong with the columns an operation took from its contract version, its
    run and its runner when it was registered, or None."""
    registered = row["registered"] if isinstance(row["registered"], dict) else {}
    if row["tool_version__tool_id"] != row["tool_id"]:
        return (
            f"its tool_version is a version of {row['tool_version__tool_id']}, not of its "
            f"tool {row['tool_id']}"
        )
    if row["effect_class"] != row["contract_effect_class"]:
        return (
            f"its effect_class is {_shown(row['effect_class'])}, but its contract version "
            f"says {_shown(row['contract_effect_class'])}"
        )
    recomputed = _recomputed_concurrency(row)
    if recomputed != row["concurrency_value"]:
        return (
            f"its concurrency_value is {_shown(row['concurrency_value'])}, but its arguments "
            f"and contract version give {_shown(recomputed)}"
        )
    # Registered events written before they recorded the deadline are compared on the rest.
    if "deadline_at" in registered and not _same_time(
        registered["deadline_at"], row["deadline_at"]
    ):
        return (
            f"its deadline_at is {_shown(iso(row['deadline_at']))}, but its registered event "
            f"says {_shown(registered['deadline_at'])}"
        )
    if row["registered_run"] != row["run_id"]:
        return (
            f"its run_id is {_shown(row['run_id'])}, but its registered event was written "
            f"in run {_shown(row['registered_run'])}"
        )
    # An edited copy is registered by the person who edited it, for the original's runner.
    runner = row["registered_runner"] or row["previous__runner_id"]
    if runner != row["runner_id"]:
        return (
            f"its runner_id is {_shown(row['runner_id'])}, but its registered event was "
            f"written by runner {_shown(runner)}"
        )
    return None


def _operations() -> Iterator[Unexplained]:
    """Every operation's stream starts with its ``registered`` event, which names the
    operation's tool, version, key, intent and idempotency key, and was written in its run, by its
    runner, with its deadline; its contract version is one of its tool's, whose effect
    class and concurrency key it carries; its intent hash is that of its arguments;
    each event starts from the status the previous one left, and the operation's status
    is the ``to`` of its stream's last event (every event of an operation carries the
    status it left: a transition's target, or the unchanged status of a heartbeat, probe
    or note); it has one ``claimed`` event per attempt."""
    events = Event.objects.filter(stream=OuterRef("pk"))
    # An event that starts from another status than the one its predecessor left: the
    # status was changed in between by something that wrote no event.
    jumps = (
        events.filter(seq__gt=1)
        .annotate(
            before=Subquery(
                Event.objects.filter(stream=OuterRef("stream"), seq=OuterRef("seq") - 1).values(
                    "to_status"
                )[:1]
            )
        )
        .exclude(from_status=F("before"))
    )
    first = events.filter(seq=1, kind=EventKind.REGISTERED)
    rows = Operation.objects.annotate(
        first_kind=Subquery(events.filter(seq=1).values("kind")[:1]),
        registered=_first_data(first),
        registered_run=Subquery(first.values("run_id")[:1]),
        registered_runner=Subquery(first.values("actor_runner_id")[:1]),
        contract_effect_class=KeyTextTransform("effect_class", "tool_version__contract"),
        concurrency_key=KeyTransform("concurrency_key", "tool_version__contract"),
        last_to=Subquery(events.order_by("-seq").values("to_status")[:1]),
        claims=_Count(events.filter(kind=EventKind.CLAIMED).values("pk")),
        jump_seq=Subquery(jumps.order_by("seq").values("seq")[:1]),
    ).values(
        "pk",
        "status",
        "attempts",
        "tool_id",
        "tool_version__number",
        "operation_key",
        "intent_hash",
        "idempotency_key",
        "arguments",
        "principal",
        "effect_class",
        "concurrency_value",
        "deadline_at",
        "run_id",
        "runner_id",
        "previous__runner_id",
        "tool_version__tool_id",
        "first_kind",
        "registered",
        "registered_run",
        "registered_runner",
        "contract_effect_class",
        "concurrency_key",
        "last_to",
        "claims",
        "jump_seq",
    )
    for row in rows.order_by("pk").iterator(chunk_size=CHUNK):
        registered = row["registered"] or {}
        recorded = {
            "tool": row["tool_id"],
            "tool_version": row["tool_version__number"],
            "operation_key": row["operation_key"],
            "intent_hash": row["intent_hash"],
        }
        # Registered events written before they recorded the idempotency key are
        # compared on the rest.
        if "idempotency_key" in registered:
            recorded["idempotency_key"] = row["idempotency_key"]
        differs = [key for key, value in recorded.items() if registered.get(key) != value]
        recomputed = _recomputed_intent(row)
        problem = None
        if row["last_to"] is None:
            problem = "it has no event at all, not even registered"
        elif row["first_kind"] != EventKind.REGISTERED:
            problem = f"its stream starts with {row['first_kind']}, not registered"
        elif differs:
            problem = f"its {', '.join(differs)} differ from its registered event"
        elif recomputed is not None and recomputed != row["intent_hash"]:
            problem = "its intent_hash is not the hash of its arguments and principal"
        elif contract_problem := _contract_columns(row):
            problem = contract_problem
        elif row["jump_seq"] is not None:
            problem = _jump(row["pk"], row["jump_seq"])
        elif row["status"] != row["last_to"]:
            problem = f"its status is {row['status']}, but its last event left it {row['last_to']}"
        elif row["attempts"] != row["claims"]:
            problem = f"it counts {row['attempts']} attempts, but {row['claims']} claimed events"
        if problem:
            yield Unexplained("operations.Operation", row["pk"], problem)


def _escalations() -> Iterator[Unexplained]:
    """A request offered to a group has the ``approval_escalated`` event naming it and
    that group: the column alone must not let a group decide. The sweep's event is not
    dated before the request's ``escalate_at`` (an edited copy's, which inherits the
    original's escalation, may be)."""
    escalated = _events(
        EventKind.APPROVAL_ESCALATED,
        stream=OuterRef("operation_id"),
        approval=OuterRef("pk"),
        group=OuterRef("escalate_to"),
    )
    rows = (
        ApprovalRequest.objects.exclude(escalated_at=None)
        .annotate(
            evented=Exists(escalated),
            early=Subquery(
                escalated.filter(at__lt=OuterRef("escalate_at"))
                .exclude(data__has_key="inherited_from")
                .values("at")[:1]
            ),
        )
        .values("pk", "operation_id", "escalate_at", "evented", "early")
    )
    for row in rows.order_by("pk").iterator(chunk_size=CHUNK):
        problem = None
        if not row["evented"]:
            problem = (
                f"it is escalated, but no approval_escalated event in {row['operation_id']} "
                "names it and its group"
            )
        elif row["early"] is not None:
            problem = (
                f"its approval_escalated event is dated {iso(row['early'])}, before its "
                f"escalate_at {iso(row['escalate_at'])}"
            )
        if problem:
            yield Unexplained("approvals.ApprovalRequest", row["pk"], problem)


def _edits() -> Iterator[Unexplained]:
    """A superseded operation names the successor its ``superseded`` event names; an
    edited copy's ``edits`` and ``previous`` are those its ``registered`` event recorded
    (the runner calls the tool with the edits applied)."""
    superseded = (
        Operation.objects.exclude(superseded_by=None)
        .annotate(
            evented=Exists(
                _events(
                    EventKind.SUPERSEDED,
                    stream=OuterRef("pk"),
                    successor=OuterRef("superseded_by_id"),
                )
            )
        )
        .values("pk", "evented")
    )
    for row in superseded.order_by("pk").iterator(chunk_size=CHUNK):
        if not row["evented"]:
            yield Unexplained(
                "operations.Operation", row["pk"], "superseded_by differs from its superseded event"
            )
    edited = (
        Operation.objects.exclude(edits=None)
        .annotate(registered=_first_data(Event.objects.filter(stream=OuterRef("pk"), seq=1)))
        .values("pk", "previous_id", "edits", "registered")
    )
    for row in edited.order_by("pk").iterator(chunk_size=CHUNK):
        registered = row["registered"] or {}
        if (
            registered.get("edited_from") != row["previous_id"]
            or registered.get("edits") != row["edits"]
        ):
            yield Unexplained(
                "operations.Operation",
                row["pk"],
                "its edits or previous operation differ from its registered event",
            )


def state_verify() -> Iterator[Unexplained]:
    """Every state row no event explains: approvals first (what a forger needs to make
    an operation runnable: decisions, grants, standing grants, requests), then
    resolutions, operations, runs, tools and people's policies."""
    yield from _decisions()
    yield from _grants()
    yield from _standing_grants()
    yield from _approval_requests()
    yield from _escalations()
    yield from _resolutions()
    yield from _resolution_reviews()
    yield from _operations()
    yield from _edits()
    yield from _runs()
    yield from _tools()
    yield from _policies()
