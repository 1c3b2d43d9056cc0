"""Fuzzing support: a runner world with operations in every reachable state."""

import ipaddress
import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest

from operations import hosts, services
from operations.models import Event, LogLeaf, Operation
from tests.approvals.conftest import person
from tests.conftest import Api, contract, make_runner
from tests.support.audit_log import seal_all
from tests.support.world import Direct


@dataclass
class Known:
    """Ids the fuzzer may substitute into paths, so that it reaches real objects."""

    api: Api
    operation_id: list[str] = field(default_factory=list)
    run_id: list[str] = field(default_factory=list)
    approval_id: list[str] = field(default_factory=list)
    endpoint_id: list[str] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    runner_name: list[str] = field(default_factory=list)
    number: list[int] = field(default_factory=lambda: [1, 2, 3])
    # The transparency log: events in it (this runner's and another's), and tree sizes.
    event_id: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=lambda: [1, 2, 3])

    def values(self) -> dict[str, list[Any]]:
        return {
            "operation_id": self.operation_id,
            "run_id": self.run_id,
            "approval_id": self.approval_id,
            "endpoint_id": self.endpoint_id,
            "name": self.name,
            "tool": self.name,
            "runner_name": self.runner_name,
            "number": self.number,
            "event_id": self.event_id,
            "size": self.size,
        }


@pytest.fixture
def no_dns(monkeypatch):
    """Webhook URLs are checked on their resolved address; the fuzzer's host names are
    random, so resolve every name to one public address instead of asking DNS."""
    monkeypatch.setattr(
        hosts, "resolve", lambda host, port: [ipaddress.ip_address("93.184.215.14")]
    )


def build_world() -> Known:
    api = make_runner()
    known = Known(api=api)
    # Made through the services: the fuzzer's requests are what is tested, not these.
    direct = Direct(api)
    keys = itertools.count(1)
    tools = {
        "idem": contract("idempotent", concurrency_key="/payment_id"),
        "undo": contract("compensable"),
        "pay": contract("irreversible", approval={"mode": "never"}),
        "ask": contract("irreversible", approval={"mode": "always"}),
        "look": contract("read_only"),
    }
    for name, body in tools.items():
        direct.tool(name, body)
        known.name.append(name)
    run = direct.run(principal="user:fuzz")
    known.run_id.append(run)
    known.run_id.append(direct.run(principal="user:other"))

    def register(tool: str, **extra) -> dict[str, Any]:
        op = direct.register(
            run,
            tool,
            {"payment_id": f"pay_{next(keys)}", "amount_cents": 100},
            operation_key=f"fuzz-{next(keys)}",
            **extra,
        )
        known.operation_id.append(op["id"])
        if op.get("approval"):
            known.approval_id.append(op["approval"]["id"])
        return op

    register("idem")  # ready
    executing = register("idem")
    direct.claim(executing["id"])
    unknown = register("pay")
    direct.claim(unknown["id"])
    direct.outcome(unknown["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    compensating = register("undo")
    direct.claim(compensating["id"])
    direct.outcome(compensating["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    register("ask")  # awaiting approval
    done = register("look")
    direct.claim(done["id"])
    direct.outcome(done["id"], 1, {"kind": "succeeded", "result": {"ok": True}})
    assert Operation.objects.filter(pk=compensating["id"], status="compensating").exists()
    endpoint, _ = services.webhook_endpoint_create(
        runner=api.runner, url="https://93.184.215.14/effectgate", events=["operation.*"]
    )
    known.endpoint_id.append(endpoint.id)
    # Another runner's objects: always 404 for ours.
    other = Direct(make_runner())
    known.runner_name.append(other.runner.name)
    other.tool("theirs")
    theirs = other.register(other.run(), "theirs")
    known.operation_id.append(theirs["id"])
    person(username="fuzz-person")
    # Sealed, so that inclusion proofs reach the log (a checkpoint, where a key is set).
    seal_all()
    known.event_id.extend(
        Event.objects.filter(stream__in=[done["id"], theirs["id"]]).values_list("pk", flat=True)
    )
    known.size.append(LogLeaf.objects.count())
    return known


# How many generated cases and steps ran, reported at the end of the session.
FUZZ_COUNTS: dict[str, int] = {}


def count(kind: str, n: int = 1) -> None:
    FUZZ_COUNTS[kind] = FUZZ_COUNTS.get(kind, 0) + n


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if FUZZ_COUNTS:
        summary = ", ".join(f"{n} {kind}" for kind, n in sorted(FUZZ_COUNTS.items()))
        terminalreporter.write_line(f"fuzzing: {summary}")
