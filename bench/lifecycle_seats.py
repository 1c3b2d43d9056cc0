"""The lifecycle bench's seats (a runner, a tool and a run per client thread), its
paths' names and the arguments of each effect: what ``bench.lifecycle``, its traces and
its report share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from effectgate_client import EffectgateClient

PRINCIPAL = "user:bench"
LEASE_S = 30
WARM_PER_THREAD = 10
ORDER = ("essential", "replica", "unprepared", "dbos", "api")
STEPS = {
    "essential": ("register", "claim", "outcome"),
    "replica": ("register_claim", "outcome"),
    "unprepared": ("register_claim", "outcome"),
    "dbos": ("workflow",),
    "api": ("register_claim", "outcome"),
}
# The paths compared per effect, single and in batches; the API's batches go through
# ``api_batch_phase``.
PEERS = ("essential", "dbos", "api")
BATCH_SIZES = (5, 20)
NO_BATCH_ENDPOINT = "n/a (no batch endpoint)"


def batch_path(kind: str, size: int) -> str:
    """The name of a batch path: ``essential_x5``, ``dbos_x20``, ``api_x5``."""
    return f"{kind}_x{size}"


def batch_size(name: str) -> int:
    """Effects per batch of the path ``name``; 0 for a path of single calls."""
    return int(name.rsplit("_x", 1)[1]) if "_x" in name else 0


@dataclass(frozen=True)
class Seat:
    """What one client thread works with: its runner, tool and run."""

    runner_id: str
    runner_name: str
    token: str
    tool: str
    run_id: str
    principal: str


def make_seats(base_url: str, *, count: int, tag: str, contract: dict) -> list[Seat]:
    """``count`` runners, each with a tool it owns and a run. Django must be set up on
    the bench's database: runners are made only by the service (``manage.py runner``)."""
    from django.db import connections

    from operations import services

    seats = []
    try:
        for index in range(count):
            name = f"bench-{tag}-{index}"
            runner, token = services.runner_create(name=name, actor=services.Actor.system("bench"))
            tool = f"bench_{tag}_{index}"
            with EffectgateClient(base_url, token) as client:
                client.put_tool(tool, contract)
                run = client.create_run(principal=PRINCIPAL, external_id=name)
            seats.append(Seat(runner.id, runner.name, token, tool, run["id"], run["principal"]))
    finally:
        # No idle backend of this process beside the measured ones.
        connections.close_all()
    return seats


def seat_arguments(index: int, n: int) -> dict[str, Any]:
    return {"payment_id": f"pay_{index}_{n}", "amount_cents": 500}
