"""Shadow mode (docs/policies.md#shadow-mode): a policy version watched without being
enforced is evaluated on every live registration, and what it would have done is
recorded, never applied.

1. ``shadow_observe`` (before the registration's transaction, beside the policies in
   force) evaluates the shadow policies on the same facts and compares each with what
   the policies in force did (``policies.shadow.compare``). No shadow policy: nothing
   is computed.
2. ``shadow_record`` runs after the registration committed (``transaction.on_commit``,
   ``robust``: a failure is logged and never reaches the runner) and writes:

   - the tally, one upsert for all the shadow policies that matched or diverged
     (``count = count + 1`` per policy version, hour and would-have), which keeps the
     last ``EXAMPLES`` examples (operation id and tool, never arguments);
   - an event ``policy_shadow_diverged`` on the policy's stream for a divergence, at
     most one per policy and operation and at most ``EVENTS_PER_HOUR`` per policy
     version, hour and would-have; the divergences past the cap are counted in the
     tally only, so a flood of registrations cannot fill the ledger;
   - the Prometheus counter ``effectgate_policy_shadow_total{policy, would}``.

Why after the commit, not in the registration's transaction: the tally row of a busy
hour is one row every matching registration updates; inside the transaction its lock
would be held to the commit and serialize those registrations on it, and a shadow
policy must not slow what it only watches. The price: a process that dies between the
commit and the tally loses that one observation (a statistic, not the ledger).
"""

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from ..machine import EventKind
from ..metrics import POLICY_SHADOW
from ..models import Policy, PolicyShadowTally
from ..policies import cedar
from ..policies.shadow import Seen, compare
from .core import Actor, event_append
from .policies import InForce, stream_of

logger = logging.getLogger(__name__)

EXAMPLES = 10
EVENTS_PER_HOUR = 10


@dataclass(frozen=True)
class Observation:
    """What the shadow policies would have done to one registration."""

    tool: str
    at: datetime
    seen: tuple[Seen, ...]


def shadow_observe(
    policies: InForce, facts: cedar.Facts, verdict: cedar.Verdict, *, contract_asks: bool = False
) -> Observation | None:
    """Evaluate the shadow policies on a live registration; None when none is in
    shadow, or none matched nor diverged (then nothing is written)."""
    if not len(policies.shadow):
        return None
    if verdict.forbids:
        # What each policy in force did, the permits behind the forbid included.
        verdict = policies.active.evaluate_each(facts)
    seen = compare(
        policies.shadow.evaluate_each(facts),
        verdict,
        shadow_versions=policies.shadow_versions,
        active_versions=policies.versions,
        contract_asks=contract_asks,
    )
    return Observation(tool=facts.tool, at=timezone.now(), seen=seen) if seen else None


def hour_of(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _example(observation: Observation, seen: Seen, operation_id: str) -> dict[str, str]:
    return {
        "operation": operation_id,
        "tool": observation.tool,
        "at": observation.at.isoformat(),
        "would": seen.would,
        "in_force": seen.in_force,
        "diverged": "yes" if seen.diverged else "no",
    }


# Newest example first; a row keeps EXAMPLES of them (``jsonb - n`` drops the n-th).
UPSERT = """
INSERT INTO operations_policyshadowtally AS t
    (policy_id, version, hour, would, count, diverged, examples)
VALUES {values}
ON CONFLICT (policy_id, version, hour, would) DO UPDATE SET
    count = t.count + 1,
    diverged = t.diverged + EXCLUDED.diverged,
    examples = EXCLUDED.examples || CASE WHEN jsonb_array_length(t.examples) >= {keep}
        THEN t.examples - {last} ELSE t.examples END
RETURNING policy_id, diverged
"""


def _tally_postgresql(observation: Observation, operation_id: str) -> dict[str, int]:
    hour = hour_of(observation.at)
    params: list[Any] = []
    for seen in observation.seen:
        example = json.dumps([_example(observation, seen, operation_id)])
        params += [seen.policy_id, seen.version, hour, seen.would, 1, int(seen.diverged), example]
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s::jsonb)"] * len(observation.seen))
    sql = UPSERT.format(values=values, keep=EXAMPLES, last=EXAMPLES - 1)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return dict(cursor.fetchall())


def _tally_other(observation: Observation, operation_id: str) -> dict[str, int]:
    """SQLite (local mode): the same, read then written in one transaction (SQLite
    takes its write lock at BEGIN)."""
    hour = hour_of(observation.at)
    diverged = {}
    with transaction.atomic():
        for seen in observation.seen:
            key: dict[str, Any] = {
                "policy_id": seen.policy_id,
                "version": seen.version,
                "hour": hour,
                "would": seen.would,
            }
            tally, _ = PolicyShadowTally.objects.get_or_create(**key)
            tally.count = F("count") + 1
            tally.diverged = F("diverged") + int(seen.diverged)
            tally.examples = [_example(observation, seen, operation_id), *tally.examples][:EXAMPLES]
            tally.save(update_fields=["count", "diverged", "examples"])
            tally.refresh_from_db(fields=["diverged"])
            diverged[seen.policy_id] = tally.diverged
    return diverged


def _divergence_event(
    observation: Observation, seen: Seen, operation_id: str, in_hour: int
) -> None:
    with transaction.atomic():
        # The policy's row is the lock of its stream, as for its other events.
        if not list(Policy.objects.select_for_update().filter(pk=seen.policy_id).values("pk")):
            return
        event_append(
            stream=stream_of(seen.policy_id),
            kind=EventKind.POLICY_SHADOW_DIVERGED,
            actor=Actor.system("shadow"),
            tool_name=observation.tool,
            data={
                "policy": seen.policy_id,
                "version": seen.version,
                "would": seen.would,
                "in_force": seen.in_force,
                "operation": operation_id,
                "tool": observation.tool,
                "hour": hour_of(observation.at).isoformat(),
                "diverged_in_hour": in_hour,
            },
            now=observation.at,
        )


def shadow_record(observation: Observation, *, operation_id: str = "") -> None:
    """Write what ``shadow_observe`` saw (module docstring, step 2). ``operation_id``
    is empty for a registration the policies in force refused."""
    tally = _tally_postgresql if connection.vendor == "postgresql" else _tally_other
    diverged = tally(observation, operation_id)
    for seen in observation.seen:
        POLICY_SHADOW.labels(policy=seen.policy_id, would=seen.would).inc()
        in_hour = diverged.get(seen.policy_id, 0)
        if seen.diverged and in_hour <= EVENTS_PER_HOUR:
            _divergence_event(observation, seen, operation_id, in_hour)


def shadow_record_safely(observation: Observation, *, operation_id: str = "") -> None:
    """``shadow_record`` for a caller outside a transaction (a refused registration):
    a failure is logged, never raised, as ``on_commit(robust=True)`` does."""
    try:
        shadow_record(observation, operation_id=operation_id)
    except Exception:
        logger.exception("shadow policies: the observation could not be recorded")
