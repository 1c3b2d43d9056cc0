"""The vocabulary of ``effectgate-verify``'s checks (``checks``): the bundle's form,
the hashes, the failures and the checker that collects them. Pure."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import rfc8785

from . import merkle
from .notes import Checkpoint

FORMAT = "effectgate-evidence/1"
GENESIS = "0" * 64
HASHED = ("stream", "seq", "kind", "from", "to", "actor", "at", "data", "prev")
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
MAX_EVENTS = 100_000
# Rows of all kinds: each rests on at least one event.
MAX_ROWS = 20_000
MAX_PROOF = 64
MAX_FAILURES = 200
_HEX64 = re.compile(r"[0-9a-f]{64}")
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,6})?(Z|[+-]\d{2}:\d{2})")

# The settling events of an approval request and the status each leaves it in; without
# one a request is pending, or expired or withdrawn (which no event of their own writes).
REQUEST_STATUS_AFTER = {
    "granted": "approved",
    "rejected": "rejected",
    "grant_revoked": "revoked",
    "approval_expired": "expired",
    "superseded": "superseded",
}
REQUEST_STATUSES_WITHOUT_EVENT = {"pending", "expired", "withdrawn"}
REQUEST_OPENED_BY = ("approval_requested", "grant_invalid", "reconciled")
ATTEMPT_STATUS_AFTER = {"succeeded": "succeeded", "failed": "failed", "unknown": "unknown"}
STANDING_KINDS = {
    "standing_grant_issued",
    "standing_grant_signed",
    "standing_grant_activated",
    "standing_grant_used",
}


class BundleError(ValueError):
    """A file that is no evidence bundle at all: not JSON, too large, another format."""


@dataclass(frozen=True)
class Failure:
    where: str
    problem: str

    def __str__(self) -> str:
        return f"{self.where}: {self.problem}"


@dataclass
class Report:
    """What the verification found: the failures (none when the bundle holds), the
    checkpoint it verified, the witnesses' checkpoints that held, and the bundle."""

    bundle: dict[str, Any]
    failures: list[Failure] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    witnessed: list[Checkpoint] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


class _Stop(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise BundleError(f"the key {key[:60]!r} appears twice in one object")
        found[key] = value
    return found


def _no_constant(name: str) -> Any:
    raise BundleError(f"{name} is not a JSON number")


def load_bundle(data: bytes) -> dict[str, Any]:
    """The bundle in ``data``, strictly: UTF-8 JSON, no duplicate key, no NaN."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(f"the file is larger than {MAX_BUNDLE_BYTES} bytes")
    try:
        bundle = json.loads(
            data.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
        )
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, long integers
        raise BundleError(f"the file is not JSON ({exc})") from None
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise BundleError(f"the file is not an evidence bundle (format {FORMAT})")
    return bundle


def event_hash(event: dict[str, Any]) -> str:
    """The event hash: SHA-256 hex of the RFC 8785 canonical JSON of its hashed fields."""
    return hashlib.sha256(rfc8785.dumps({name: event[name] for name in HASHED})).hexdigest()


def intent_hash(*, tool: str, arguments: Any, principal: str) -> str:
    document = {"tool": tool, "arguments": arguments, "principal": principal}
    return hashlib.sha256(rfc8785.dumps(document)).hexdigest()


def sha256_json(value: Any) -> str:
    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def entry(*, event: int, hash: str, seq: int, stream: str) -> bytes:
    """A leaf's entry: the canonical JSON of the event's id, hash, seq and stream."""
    return rfc8785.dumps({"event": event, "hash": hash, "seq": seq, "stream": stream})


# --- Form -------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str(value: Any) -> bool:
    return isinstance(value, str)


def _opt_str(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _list(value: Any) -> bool:
    return isinstance(value, list)


def _dict(value: Any) -> bool:
    return isinstance(value, dict)


def _any(value: Any) -> bool:
    return True


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


Spec = dict[str, Callable[[Any], bool]]

TOP: Spec = {
    "format": _str,
    "origin": _str,
    "operation": _dict,
    "contract": lambda v: v is None or isinstance(v, dict),
    "attempts": _list,
    "approvals": _list,
    "grants": _list,
    "standing_grants": _list,
    "resolutions": _list,
    "events": _list,
    "related_events": _list,
    "checkpoint": _dict,
    "consistency": _list,
    "unrecorded": _dict,
}
CHECKPOINT: Spec = {"size": _is_int, "root": _str, "time": _str, "origin": _str, "note": _str}
EVENT: Spec = {
    "id": _is_int,
    "stream": _str,
    "seq": _is_int,
    "kind": _str,
    "from": _str,
    "to": _str,
    "actor": _str,
    "at": _str,
    "data": _dict,
    "prev": _str,
    "hash": _str,
    "leaf_index": _is_int,
    "inclusion": _list,
}
OPERATION: Spec = {
    "id": _str,
    "tool": _str,
    "tool_version": _is_int,
    "effect_class": _str,
    "operation_key": _str,
    "call_id": _str,
    "principal": _str,
    "arguments": _any,
    "intent_hash": _hex64,
    "idempotency_key": _str,
    "status": _str,
    "attempts": _is_int,
}
CONTRACT: Spec = {"tool": _str, "version": _is_int, "contract_hash": _hex64, "contract": _dict}
ATTEMPT: Spec = {
    "number": _is_int,
    "status": _str,
    "claimed_at": _str,
    "closed_at": _opt_str,
    "outcome": lambda v: v is None or isinstance(v, dict),
}
APPROVAL: Spec = {
    "id": _str,
    "status": _str,
    "terms": _dict,
    "reason": _str,
    "decisions": _list,
}
DECISION: Spec = {"user": _str, "decision": _str, "comment": _str, "at": _str}
GRANT: Spec = {
    "id": _str,
    "approval": _str,
    "intent_hash": _hex64,
    "expires_at": _str,
    "standing_grant": _opt_str,
    "revoked_at": _opt_str,
}
STANDING: Spec = {"id": _str, "terms": _dict, "issued_by": _str, "signed_by": _list}
RESOLUTION: Spec = {
    "id": _str,
    "declared_by": _str,
    "note": _str,
    "created_at": _str,
    "review": lambda v: v is None or isinstance(v, dict),
}
REVIEW: Spec = {"decision": _str, "user": _opt_str, "note": _str, "at": _str}
CONSISTENCY: Spec = {
    "first": _is_int,
    "second": _is_int,
    "hashes": _list,
    "first_checkpoint": lambda v: v is None or isinstance(v, dict),
}


class _Checker:
    def __init__(self, report: Report) -> None:
        self.report = report

    def fail(self, where: str, problem: str) -> None:
        if len(self.report.failures) < MAX_FAILURES:
            self.report.failures.append(Failure(where, problem))
        else:
            raise _Stop

    def shape(self, value: Any, spec: Spec, where: str, *, optional: tuple[str, ...] = ()) -> bool:
        """Whether ``value`` is an object with exactly the fields of ``spec`` (those in
        ``optional`` may be absent), each of its type; each difference is a failure."""
        if not isinstance(value, dict):
            self.fail(where, "is not a JSON object")
            return False
        good = True
        for name in sorted(set(value) - set(spec)):
            self.fail(where, f"has a field {name[:60]!r} that no bundle has")
            good = False
        for name, valid in spec.items():
            if name not in value:
                if name not in optional:
                    self.fail(where, f"lacks its field {name!r}")
                    good = False
            elif not valid(value[name]):
                self.fail(where, f"its field {name!r} is not of its type")
                good = False
        return good


def _b64(value: Any) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        digest = base64.b64decode(value, validate=True)
    except binascii.Error:
        return None
    # Canonical only: base64 leaves the last character's low bits free, and a hash
    # written two ways would be a byte changed that changes nothing.
    if len(digest) != merkle.HASH_SIZE or base64.b64encode(digest).decode() != value:
        return None
    return digest


def _time(value: Any) -> datetime | None:
    """An RFC 3339 time with its offset, read strictly (``datetime.fromisoformat`` alone
    takes any character between the date and the time)."""
    if not isinstance(value, str) or _RFC3339.fullmatch(value) is None:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


def same_time(a: Any, b: Any) -> bool:
    """Whether two RFC 3339 times (or two nulls) name the same instant."""
    if a is None or b is None:
        return a is None and b is None
    first, second = _time(a), _time(b)
    return first is not None and first == second


def _event_where(event: dict[str, Any]) -> str:
    return (
        f"event {event.get('stream')!s:.60} seq {event.get('seq')} (id {event.get('id')}, "
        f"leaf {event.get('leaf_index')})"
    )
