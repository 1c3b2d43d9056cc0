"""What the reconciliation pages say about an operation, in words (pure, no ORM).

- ``code_in_words``: an outcome or error code as a sentence ("connection_reset" → "The
  connection was reset before an answer came"); the one mapping, ``CODE_WORDS``.
- ``answer_card``: one answer to "did it happen?" (an automatic lookup, the runner, a
  person, the provider's event) as a card of labelled facts.
- ``attempt_resolutions``: which answer settled each attempt that ended unknown, so an
  attempt row can say "unknown → it happened" after the fact.

Every text here is plain: templates escape it and reveal hidden characters (``reveal``),
since codes, details and evidence are what a runner or a provider wrote.
"""

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from operations.machine import EventKind, Status

from .presenters import flatten

# Outcome codes a runner or Effectgate writes, as a person reads them. A runner may use
# any code (docs/api.md, Posting an outcome); one not listed here is shown as it is.
CODE_WORDS = {
    # The call may have reached the provider: the outcome is unknown.
    "connection_reset": "The connection was reset before an answer came",
    "connection_lost": "The connection was lost after the request was sent",
    "timeout": "No answer within the time limit",
    "timeout_unknown": "No answer within the time limit",
    "unknown": "The runner could not tell whether it happened",
    "upstream_5xx": "The provider answered with a server error",
    "runner_exception": "The runner failed while making the call",
    # The call failed.
    "not_sent": "The request was never sent",
    "rate_limited": "The provider asked to slow down (rate limited)",
    # Written by Effectgate.
    "lease_expired": "The runner reported no outcome before its lease ran out",
    "budget_exhausted": "No attempt or time left",
    "compensation_failed": "The undo failed",
    "compensated": "The effect was undone",
    "approval_rejected": "An approver rejected it",
    "approval_expired": "Nobody decided in time",
    "cancelled": "Its run was cancelled",
}
# Codes whose detail Effectgate writes as a whole sentence: the detail says it best.
SELF_EXPLAINED = frozenset(
    {"lease_expired", "budget_exhausted", "compensation_failed", "compensated", "cancelled"}
)


def _clip(text: str, limit: int | None) -> str:
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


def code_in_words(code: str, detail: str = "", *, detail_limit: int | None = None) -> str:
    """``code`` (and its ``detail``) as a person reads it: "No answer within the time
    limit (read timeout)". An unknown code is shown as it is ("card_declined: 402")."""
    detail = _clip((detail or "").strip(), detail_limit)
    words = CODE_WORDS.get(code)
    if words is None:
        return f"{code}: {detail}" if code and detail else code or detail
    if code in SELF_EXPLAINED and detail:
        return detail
    return f"{words} ({detail})" if detail else words


def actor_words(actor: str) -> str:
    """Who an event's actor is: "sam", "runner billing", "an automatic lookup"."""
    kind, _, name = actor.partition(":")
    if kind == "user":
        return name
    if kind == "runner":
        return f"runner {name}"
    return {"probe": "an automatic lookup", "inbound": "the provider's event"}.get(
        name, f"Effectgate ({name})" if name else actor
    )


# Each answer in words, with the state badge whose colour it borrows.
RESULT_WORDS = {
    "committed": ("It happened", "succeeded"),
    "not_found": ("It did not happen", "failed"),
    "still_unknown": ("Still unknown", "unknown"),
    "failed": ("No usable answer", "unknown"),
}
SOURCE_WORDS = {
    "probe": "automatic lookup",
    "runner": "the runner",
    "person": "a person",
    "inbound": "the provider's event",
}
# At most this many evidence values on a card; the event trace holds the rest.
MAX_EVIDENCE_ROWS = 20


class EventLike(Protocol):
    kind: str
    actor: str
    at: datetime
    data: Any
    from_status: str
    to_status: str


@dataclass
class Fact:
    label: str
    text: str
    mono: bool = False


@dataclass
class AnswerCard:
    title: str
    tone: str  # the state badge whose colour it borrows: succeeded, failed, unknown
    who: str
    source: str
    at: datetime
    became: str  # the operation's state after it, when the answer moved it
    facts: list[Fact] = field(default_factory=list)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _evidence_facts(evidence: Any) -> list[Fact]:
    if not isinstance(evidence, dict):
        return [Fact("Evidence", _text(evidence))] if evidence else []
    facts = []
    if evidence.get("note"):
        facts.append(Fact("Evidence note", _text(evidence["note"])))
    if evidence.get("confirmation"):
        facts.append(Fact("Confirmation note", _text(evidence["confirmation"])))
    rest = {key: value for key, value in evidence.items() if key not in {"note", "confirmation"}}
    rows = list(flatten(rest).items()) if rest else []
    for path, value in rows[:MAX_EVIDENCE_ROWS]:
        facts.append(Fact(f"Evidence {path}", _text(value)))
    if len(rows) > MAX_EVIDENCE_ROWS:
        more = len(rows) - MAX_EVIDENCE_ROWS
        facts.append(Fact("Evidence", f"{more} more values in the event trace below"))
    return facts


def answer_card(event: EventLike, *, lookup_request: str = "") -> AnswerCard:
    """One answer to "did it happen?" (a ``probe``, ``reconciled`` or ``late_success``
    event) as a card. ``lookup_request`` is what every automatic lookup of this operation
    asks ("GET https://…"): a function of the operation's frozen contract and ids, so the
    page shows it beside each lookup's answer."""
    data = event.data if isinstance(event.data, dict) else {}
    if event.kind == EventKind.LATE_SUCCESS:
        title, tone = RESULT_WORDS["committed"]
        source = f"a late outcome of attempt {data.get('attempt', '?')}"
    else:
        title, tone = RESULT_WORDS.get(str(data.get("result")), (event.kind, "unknown"))
        source = SOURCE_WORDS.get(str(data.get("source")), "")
    facts = []
    if data.get("source") == "probe" and lookup_request:
        facts.append(Fact("Request", lookup_request, mono=True))
    if data.get("error"):
        facts.append(Fact("Answer", _text(data["error"])))
    if data.get("downstream_id"):
        facts.append(Fact("Downstream reference", _text(data["downstream_id"]), mono=True))
    if data.get("event_type"):
        event_id = _text(data.get("event_id") or "")
        facts.append(Fact("Provider event", f"{_text(data['event_type'])} {event_id}".strip()))
    facts.extend(_evidence_facts(data.get("evidence")))
    if data.get("declared_by"):
        facts.append(Fact("Declared by", _text(data["declared_by"])))
    if data.get("confirmed_by"):
        facts.append(Fact("Confirmed by", _text(data["confirmed_by"])))
    if data.get("probes_exhausted"):
        facts.append(Fact("Lookups", f"{data.get('probes')}: none left, a person answers now"))
    elif data.get("probes"):
        facts.append(Fact("Lookups", f"{data['probes']} so far"))
    became = event.to_status if event.to_status != event.from_status else ""
    return AnswerCard(
        title=title,
        tone=tone,
        who=actor_words(event.actor),
        source=source,
        at=event.at,
        became=became,
        facts=facts,
    )


def attempt_resolutions(events: Iterable[EventLike]) -> dict[int, AnswerCard]:
    """For each attempt whose outcome was unknown, the answer that settled it.

    In the operation's events (in order), an attempt's unknown outcome moves the
    operation to ``outcome_unknown`` (its data names the attempt; so does a ``reopened``);
    the next event that moves it out of ``outcome_unknown`` is the answer.
    """
    resolved: dict[int, AnswerCard] = {}
    waiting: int | None = None
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        if event.to_status == Status.OUTCOME_UNKNOWN != event.from_status:
            attempt = data.get("attempt")
            waiting = attempt if isinstance(attempt, int) else None
        elif event.from_status == Status.OUTCOME_UNKNOWN != event.to_status:
            if waiting is not None:
                resolved[waiting] = answer_card(event)
            waiting = None
    return resolved
