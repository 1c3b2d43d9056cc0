"""The terms a row that decides what may run was opened with, as its opening event
records them and as ``audit verify`` reads them back from the row.

An approval request's quorum, lifetimes, escalation, barred people and editable fields
are not statuses: no later event repeats them, and a plain UPDATE
changes them. So the event that opens the row holds them (``terms`` in its data), and
``audit.state_verify`` compares the row with that record, column by column. Both sides
use the functions here, so what is written and what is compared cannot drift apart;
the values are plain JSON (times as RFC 3339), as an event's data is stored.
"""

from typing import Any

from ..payloads import iso


def approval_terms(request: Any, *, editable: list[str] | None) -> dict[str, Any]:
    """What an approval request (``approvals.ApprovalRequest``) decides beside its
    status: who must agree (quorum, barred people, the escalation group and when it may
    decide), until when, on which intent, what the grant is worth, and which argument
    fields a person may change when approving (``editable``, from the contract version
    of the request's operation)."""
    return {
        "intent_hash": request.intent_hash,
        "approvals_required": request.approvals_required,
        "expires_at": iso(request.expires_at),
        "grant_ttl_s": request.grant_ttl_s,
        "escalate_at": iso(request.escalate_at),
        "escalate_to": request.escalate_to,
        # As stored: the context's list is sorted when the request opens, and the
        # contract's list never changes.
        "barred_user_ids": request.context.get("barred_user_ids", []),
        "editable": editable or [],
    }
