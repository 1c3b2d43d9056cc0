"""The essential statements of a lifecycle: the anchor the API is measured against.

What must reach PostgreSQL for one register -> claim -> outcome, and nothing else:
three transactions of two statements each, twelve statements counting ``BEGIN`` and
``COMMIT`` (each is a round trip):

1. register: ``INSERT`` the operation (``ready``), ``INSERT`` its ``registered`` event;
2. claim: compare-and-set ``UPDATE ... WHERE id = ... AND status = 'ready'
   RETURNING attempts`` (zero rows: someone else won), ``INSERT`` the ``claimed``
   event;
3. outcome: compare-and-set ``UPDATE ... WHERE status = 'executing' AND attempts = n``,
   ``INSERT`` the ``outcome`` event.

What is *not* essential, and why:

- the attempt row: the claim's facts (attempt number, lease) live on the operation row
  and in the ``claimed`` event; a table of attempts is a read model of the events;
- reads before writes: the token, run and tool are what a server would cache or fold
  into the writes; the compare-and-set replaces the row lock and the status check;
- the event chain's ``SELECT`` of the previous hash: the anchor keeps each operation's
  last ``(seq, hash)`` from the statement that wrote it (the same thread runs the whole
  lifecycle); a lean path could carry it on the operation row and get it back from the
  compare-and-set's ``RETURNING``;
- the run's tool-call count and the outbox check (``SELECT`` of webhook endpoints):
  budgets and webhooks are features, not the lifecycle.

The rows are real: the app's tables, a runner, run and tool made through the API, the
same hash chain (``operations.canonical``, RFC 8785 then SHA-256), so the database pays
for the same indexes, constraints and triggers as with the API.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from approvals.ids import new_id
from operations.canonical import intent_hash, sha256_hex
from operations.eventmac import event_mac

from .columns import unnamed_defaults
from .lifecycle_sql import EVENT_COLUMNS, OP_COLUMNS, Statements, new_operation_row

GENESIS = "0" * 64
# The compare-and-set of several outcomes: ``{values}`` is one ``(%s::text,
# %s::integer, %s::text)`` per outcome (id, attempt, downstream id).
BATCH_OUTCOME = (
    "UPDATE operations_operation o SET status = 'succeeded', lease_until = NULL, "
    "downstream_id = v.downstream_id, status_changed_at = %s, updated_at = %s "
    "FROM (VALUES {values}) AS v(id, attempts, downstream_id) "
    "WHERE o.id = v.id AND o.status = 'executing' AND o.attempts = v.attempts "
    "RETURNING o.id"
)


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class EssentialRunner(Statements):
    """One runner's lifecycles in the twelve essential statements."""

    def __init__(self, url: str, *, runner_id: str, runner_name: str, tool: str) -> None:
        super().__init__(url)
        self.runner_id = runner_id
        self.actor = f"runner:{runner_name}"
        self.tool = tool
        self.version_id = self.conn.execute(
            "SELECT active_version_id FROM operations_tool WHERE name = %s", (tool,)
        ).fetchone()[0]
        from operations.models import Event, Operation

        self.extra_op = unnamed_defaults(Operation, OP_COLUMNS)
        self.extra_event = unnamed_defaults(Event, EVENT_COLUMNS)
        # The last (seq, hash) of each operation's stream this runner wrote.
        self._chain: dict[str, tuple[int, str]] = {}

    def _event_row(
        self,
        op_id: str,
        run_id: str,
        kind: str,
        source: str,
        target: str,
        now: datetime,
        data: dict[str, Any],
    ) -> dict[str, Any]:
        """The next event of ``op_id``'s stream, chained to the last one this runner wrote."""
        seq, prev = self._chain.get(op_id, (0, GENESIS))
        seq += 1
        digest = sha256_hex(
            {
                "stream": op_id,
                "seq": seq,
                "kind": kind,
                "from": source,
                "to": target,
                "actor": self.actor,
                "at": _iso(now),
                "data": data,
                "prev": prev,
            }
        )
        self._chain[op_id] = (seq, digest)
        return {
            "stream": op_id,
            "seq": seq,
            "kind": kind,
            "operation_id": op_id,
            "run_id": run_id,
            "tool_name": self.tool,
            "from_status": source,
            "to_status": target,
            "actor": self.actor,
            "actor_runner_id": self.runner_id,
            "at": now,
            "data": json.dumps(data),
            "prev_hash": prev,
            "hash": digest,
            "mac": event_mac(digest),
            **self.extra_event,
        }

    def _event(
        self,
        op_id: str,
        run_id: str,
        kind: str,
        source: str,
        target: str,
        now: datetime,
        data: dict[str, Any],
    ) -> None:
        self._insert(
            "operations_event", self._event_row(op_id, run_id, kind, source, target, now, data)
        )

    def register(self, *, run_id: str, principal: str, key: str, arguments: dict[str, Any]) -> str:
        op_id = new_id("op")
        now = datetime.now(UTC)
        digest = intent_hash(tool=self.tool, arguments=arguments, principal=principal)
        with self._transaction():
            self._insert(
                "operations_operation",
                {
                    **new_operation_row(
                        op_id=op_id,
                        runner_id=self.runner_id,
                        run_id=run_id,
                        tool=self.tool,
                        version_id=self.version_id,
                        key=key,
                        arguments=json.dumps(arguments),
                        intent_hash=digest,
                        principal=principal,
                        now=now,
                    ),
                    **self.extra_op,
                },
            )
            self._event(
                op_id,
                run_id,
                "registered",
                "",
                "ready",
                now,
                {"tool": self.tool, "operation_key": key, "intent_hash": digest},
            )
        return op_id

    def claim(self, op_id: str, *, run_id: str, lease_s: int = 30) -> int:
        now = datetime.now(UTC)
        lease_until = now + timedelta(seconds=lease_s)
        with self._transaction():
            row = self._x(
                "UPDATE operations_operation SET status = 'executing', "
                "attempts = attempts + 1, lease_until = %s, not_before = NULL, "
                "status_changed_at = %s, updated_at = %s "
                "WHERE id = %s AND status = 'ready' RETURNING attempts",
                (lease_until, now, now, op_id),
            ).fetchone()
            if row is None:
                raise RuntimeError(f"{op_id} was not ready: another claim won")
            number = row[0]
            self._event(
                op_id,
                run_id,
                "claimed",
                "ready",
                "executing",
                now,
                {"attempt": number, "lease_until": _iso(lease_until)},
            )
        return number

    def outcome(self, op_id: str, number: int, *, run_id: str, body: dict[str, Any]) -> None:
        now = datetime.now(UTC)
        with self._transaction():
            row = self._x(
                "UPDATE operations_operation SET status = 'succeeded', lease_until = NULL, "
                "downstream_id = %s, status_changed_at = %s, updated_at = %s "
                "WHERE id = %s AND status = 'executing' AND attempts = %s RETURNING id",
                (body.get("downstream_id", ""), now, now, op_id, number),
            ).fetchone()
            if row is None:
                raise RuntimeError(f"{op_id} attempt {number} is no longer executing")
            self._event(
                op_id,
                run_id,
                "outcome",
                "executing",
                "succeeded",
                now,
                {"attempt": number, "outcome": body},
            )
        self._chain.pop(op_id, None)

    # --- batches: the same facts for several effects, in two transactions ---------------------

    def register_claim_batch(
        self,
        *,
        run_id: str,
        principal: str,
        items: list[tuple[str, dict[str, Any]]],
        lease_s: int = 30,
    ) -> list[tuple[str, int]]:
        """Register ``items`` (operation key, arguments) and claim each one's first attempt
        in one transaction of four statements: one multi-row ``INSERT`` of the operations,
        already ``executing`` (as the inline claim does), ``ON CONFLICT DO NOTHING
        RETURNING id``, so that a key already taken leaves the others in, then one
        ``INSERT`` of the ``registered`` and ``claimed`` events of those inserted. The
        (operation, attempt) pairs of those inserted, in order."""
        now = datetime.now(UTC)
        lease_until = now + timedelta(seconds=lease_s)
        rows = []
        facts = {}
        for key, arguments in items:
            op_id = new_id("op")
            digest = intent_hash(tool=self.tool, arguments=arguments, principal=principal)
            facts[op_id] = (key, digest)
            rows.append(
                {
                    **new_operation_row(
                        op_id=op_id,
                        runner_id=self.runner_id,
                        run_id=run_id,
                        tool=self.tool,
                        version_id=self.version_id,
                        key=key,
                        arguments=json.dumps(arguments),
                        intent_hash=digest,
                        principal=principal,
                        now=now,
                    ),
                    **self.extra_op,
                    "status": "executing",
                    "attempts": 1,
                    "lease_until": lease_until,
                }
            )
        with self._transaction():
            inserted = {
                op_id for (op_id,) in self._insert_many("operations_operation", rows).fetchall()
            }
            events = []
            for op_id, (key, digest) in facts.items():
                if op_id not in inserted:
                    continue
                events.append(
                    self._event_row(
                        op_id,
                        run_id,
                        "registered",
                        "",
                        "ready",
                        now,
                        {"tool": self.tool, "operation_key": key, "intent_hash": digest},
                    )
                )
                events.append(
                    self._event_row(
                        op_id,
                        run_id,
                        "claimed",
                        "ready",
                        "executing",
                        now,
                        {"attempt": 1, "lease_until": _iso(lease_until)},
                    )
                )
            if events:
                self._insert_many("operations_event", events, conflict=False)
        return [(op_id, 1) for op_id in facts if op_id in inserted]

    def outcome_batch(
        self, *, run_id: str, outcomes: list[tuple[str, int, dict[str, Any]]]
    ) -> list[str]:
        """Record each (operation, attempt, outcome) in one transaction of four
        statements: one compare-and-set ``UPDATE ... FROM (VALUES ...)`` that moves only
        the operations still ``executing`` that attempt (``RETURNING`` says which), then
        one ``INSERT`` of their ``outcome`` events. The operations recorded."""
        now = datetime.now(UTC)
        values = ", ".join(["(%s::text, %s::integer, %s::text)"] * len(outcomes))
        params: list[Any] = [now, now]
        for op_id, number, body in outcomes:
            params += [op_id, number, body.get("downstream_id", "")]
        with self._transaction():
            moved = {
                op_id
                for (op_id,) in self._x(
                    BATCH_OUTCOME.format(values=values),
                    params,
                ).fetchall()
            }
            events = [
                self._event_row(
                    op_id,
                    run_id,
                    "outcome",
                    "executing",
                    "succeeded",
                    now,
                    {"attempt": number, "outcome": body},
                )
                for op_id, number, body in outcomes
                if op_id in moved
            ]
            if events:
                self._insert_many("operations_event", events, conflict=False)
        for op_id in moved:
            self._chain.pop(op_id, None)
        return [op_id for op_id, _, _ in outcomes if op_id in moved]
