"""One traced lifecycle of each path of ``bench.lifecycle``: the statements each sends,
as the API's statement counter (``bench.gunicorn_conf``) or the raw runners' logs saw
them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from .dbos_anchor import PING
from .essential import EssentialRunner
from .gunicorn_conf import TRACE_HEADER
from .lifecycle_seats import LEASE_S, STEPS, Seat, seat_arguments
from .lifecycle_sql import SqlRunner
from .statements import labels


def trace_api(http: httpx.Client, seat: Seat, trace_dir: Path) -> dict[str, list[str]]:
    """The statements of one lifecycle through the API, as gunicorn's counter saw them."""
    for step in STEPS["api"]:
        (trace_dir / f"{step}.json").unlink(missing_ok=True)
    registered = http.post(
        "/operations",
        headers={TRACE_HEADER: "register_claim"},
        json={
            "run": seat.run_id,
            "tool": seat.tool,
            "operation_key": "traced",
            "arguments": seat_arguments(0, 0),
            "claim": {"lease_s": LEASE_S},
        },
    ).json()
    http.post(
        f"/operations/{registered['id']}/attempts/{registered['attempt']['attempt']}/outcome",
        headers={TRACE_HEADER: "outcome"},
        json={"kind": "succeeded", "downstream_id": "re_traced"},
    ).raise_for_status()
    return {step: json.loads((trace_dir / f"{step}.json").read_text()) for step in STEPS["api"]}


def _logged(sql: EssentialRunner | SqlRunner, call: Any) -> tuple[Any, list[str]]:
    sql.log = []
    try:
        result = call()
        return result, sql.log
    finally:
        sql.log = None


def trace_essential(sql: EssentialRunner, seat: Seat) -> dict[str, list[str]]:
    op_id, register = _logged(
        sql,
        lambda: sql.register(
            run_id=seat.run_id,
            principal=seat.principal,
            key="traced",
            arguments=seat_arguments(0, 0),
        ),
    )
    number, claim = _logged(sql, lambda: sql.claim(op_id, run_id=seat.run_id))
    _, outcome = _logged(
        sql,
        lambda: sql.outcome(
            op_id, number, run_id=seat.run_id, body={"kind": "succeeded", "downstream_id": "re"}
        ),
    )
    return {"register": register, "claim": claim, "outcome": outcome}


def trace_essential_batch(sql: EssentialRunner, seat: Seat, size: int) -> dict[str, list[str]]:
    claimed, register_claim = _logged(
        sql,
        lambda: sql.register_claim_batch(
            run_id=seat.run_id,
            principal=seat.principal,
            items=[(f"traced-x{size}-{i}", seat_arguments(0, i)) for i in range(size)],
        ),
    )
    _, outcome = _logged(
        sql,
        lambda: sql.outcome_batch(
            run_id=seat.run_id,
            outcomes=[(op_id, number, {"kind": "succeeded"}) for op_id, number in claimed],
        ),
    )
    return {"register_claim": register_claim, "outcome": outcome}


def dbos_labels(statements: list[str]) -> list[str]:
    """Short names of DBOS's statements: its tables without their schema (``dbos.``), the
    workflow's last statement (an UPDATE and an INSERT in a ``WITH``) by both."""
    named = []
    for sql in statements:
        if sql == PING:
            named.append(sql)
        elif sql.startswith("WITH updated AS (UPDATE dbos.workflow_status"):
            named.append("WITH (UPDATE workflow_status, INSERT workflow_output) SELECT")
        else:
            named.append(labels([sql.replace("dbos.", "")])[0])
    return named


def trace_replica(sql: SqlRunner, seat: Seat) -> dict[str, list[str]]:
    (op_id, number), register = _logged(
        sql,
        lambda: sql.register_and_claim(
            run_id=seat.run_id, key="traced", arguments=seat_arguments(0, 0)
        ),
    )
    _, outcome = _logged(
        sql, lambda: sql.outcome(op_id, number, {"kind": "succeeded", "downstream_id": "re"})
    )
    return {"register_claim": register, "outcome": outcome}
