"""People's policies: what they cost a registration, and how long a simulation takes.

f. Simulation (``services.simulation``) of a Cedar policy's new version, and of a held
   contract version, over ``--policy-operations`` operations (100,000 by default)
   registered in the last day: the operations are seeded with one ``INSERT ... SELECT
   generate_series`` (time-ordered ids, as ``approvals.ids`` mints them, spread over
   1,000 runs), then each simulation is timed once, wall clock.
g. Added CPU per registration: ``--policy-registrations`` registrations with an inline
   claim through ``services.operation_register`` in this process with no policy, then
   the same with 100 active policies that apply to every tool and match none (so the
   lean path stays lean); process CPU time (``time.process_time``: this process only,
   not PostgreSQL's), in ms per registration, and the difference.

Requires ``django.setup()`` on the bench's own database (``bench.bench`` does it), and
runs before the scale part, whose seed would otherwise fall in the window.
"""

from __future__ import annotations

import time
from typing import Any

from .columns import sql_fill

SIM_TOOL = "bench_policy_refund"
HELD_TOOL = "bench_policy_payout"
RUNS = 1000
POLICIES = 100

CANDIDATE_V1 = """@id("bench-big-refunds")
@approval("required")
permit(principal, action == Action::"register", resource)
when { context.arguments has amount_cents && context.arguments.amount_cents > 50000 };"""
CANDIDATE_V2 = CANDIDATE_V1.replace("50000", "20000")


def _never_matching(number: int) -> str:
    return (
        f'@id("bench-p{number:03d}")\n@approval("required")\n'
        'permit(principal, action == Action::"register", resource)\n'
        f"when {{ context.arguments has amount_cents && context.arguments.amount_cents"
        f" > {10**12 + number} }};"
    )


def _stewards() -> tuple[Any, Any]:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    people = []
    for name in ("bench-steward-1", "bench-steward-2"):
        user = get_user_model().objects.create_user(name)
        user.user_permissions.add(Permission.objects.get(codename="manage_policies"))
        people.append(get_user_model().objects.get(pk=user.pk))
    return people[0], people[1]


def _seed(runner: Any, tools: tuple[Any, Any], size: int) -> float:
    """``size`` operations over the last 22 hours, of each tool in turn; seconds."""
    from django.db import connection

    from approvals.ids import id_floor
    from operations.models import Operation, Run

    started = time.monotonic()
    # Ids after the floor of this millisecond, in the order of i (digits are base32).
    base = id_floor("op", int(time.time() * 1000))[:-16]
    with connection.cursor() as cursor:
        names, marks, fill = sql_fill(
            Run,
            {"id", "runner_id", "external_id", "principal", "status", "tool_calls", "turns",
             "spend", "created_at", "updated_at"},
            key="run",
        )  # fmt: skip
        cursor.execute(
            f"""INSERT INTO operations_run (id, runner_id, external_id, principal, status,
                    tool_calls, turns, spend, created_at, updated_at{names})
                SELECT 'run_pol' || lpad(i::text, 6, '0'), %(runner)s, '', 'user:seed',
                    'active', 0, 0, 0, now(), now(){marks}
                FROM generate_series(0, %(last)s) AS i""",  # noqa: S608
            {"runner": runner.pk, "last": RUNS - 1, **fill},
        )
        columns = {
            "id": f"'{base}' || lpad(i::text, 16, '0')",
            "runner_id": "%(runner)s",
            "run_id": f"'run_pol' || lpad(mod(i, {RUNS})::text, 6, '0')",
            "tool_id": "CASE WHEN mod(i, 2) = 0 THEN %(tool0)s ELSE %(tool1)s END",
            "tool_version_id": "CASE WHEN mod(i, 2) = 0 THEN %(version0)s ELSE %(version1)s END",
            "effect_class": "'irreversible'",
            "call_id": "''",
            "operation_key": "'pol' || i",
            "arguments": "jsonb_build_object('payment_id', 'pay_' || i, "
            "'amount_cents', 100 + mod(i * 7919, 90000))",
            "intent_hash": "md5(i::text) || md5((i + 7)::text)",
            "principal": "'user:seed'",
            "idempotency_key": "'ik_pol' || i",
            "status": "'succeeded'",
            "attempts": "1",
            "downstream_id": "''",
            "error_code": "''",
            "error_detail": "''",
            "unknown_sticky": "false",
            "probes": "0",
            "turn": "mod(i, 50)",
            "created_at": "now() - make_interval(secs => (%(size)s - i) * 80000.0 / %(size)s)",
            "updated_at": "now()",
            "status_changed_at": "now()",
            "event_seq": "0",
            "event_head": "''",
        }
        names, marks, fill = sql_fill(Operation, columns, key="op")
        cursor.execute(
            f"INSERT INTO operations_operation ({', '.join(columns)}{names}) "  # noqa: S608
            f"SELECT {', '.join(columns.values())}{marks} "
            "FROM generate_series(0, %(size)s - 1) AS i",
            {
                "runner": runner.pk,
                "tool0": tools[0].name,
                "version0": tools[0].active_version_id,
                "tool1": tools[1].name,
                "version1": tools[1].active_version_id,
                "size": size,
                **fill,
            },
        )
        cursor.execute("ANALYZE operations_operation")
    return time.monotonic() - started


def _registrations(runner: Any, tool: str, count: int, label: str) -> float:
    """CPU ms per registration (with an inline claim) through the service."""
    from operations import services

    run = services.run_create(runner=runner, principal="user:bench", external_id=label, budgets={})
    arguments = {"payment_id": "pay_cpu", "amount_cents": 5}

    def register(key: str) -> None:
        services.operation_register(
            runner=runner,
            run_id=run.id,
            tool_name=tool,
            operation_key=key,
            arguments=arguments,
            claim_lease_s=30,
        )

    for warm in range(5):
        # The policies are loaded once per process and generation, not per registration.
        register(f"{label}-warm-{warm}")
    started = time.process_time()
    for number in range(count):
        register(f"{label}-{number}")
    return (time.process_time() - started) / count * 1000


def policies(*, runner: Any, contract: dict[str, Any], operations: int, registrations: int) -> dict:
    from operations import services
    from operations.models import Tool
    from operations.services.simulation import contract_simulate, policy_simulate

    first, second = _stewards()
    services.tool_register(name=SIM_TOOL, body=contract, runner=runner)
    services.tool_register(
        name=HELD_TOOL, body={**contract, "approval": {"mode": "always"}}, runner=runner
    )

    # g. No policy, then 100 that apply to every tool and match none.
    none_ms = _registrations(runner, SIM_TOOL, registrations, "cpu-none")
    for number in range(POLICIES):
        version = services.policies.policy_write(user=first, text=_never_matching(number))
        services.policies.policy_activate(user=second, policy_id=version.policy_id)
    hundred_ms = _registrations(runner, SIM_TOOL, registrations, "cpu-100")
    for number in range(POLICIES):
        services.policies.policy_retire(user=first, policy_id=f"bench-p{number:03d}")

    # f. The policy's first version in force, its second simulated; a weaker contract
    # version of the held tool (always -> rules) simulated against the active one.
    version = services.policies.policy_write(user=first, text=CANDIDATE_V1)
    services.policies.policy_activate(user=second, policy_id=version.policy_id)
    services.policies.policy_write(user=first, text=CANDIDATE_V2)
    rules = {"mode": "rules", "rules": [{"path": "/amount_cents", "op": "gt", "value": 50000}]}
    held = services.tool_register(
        name=HELD_TOOL, body={**contract, "approval": rules}, runner=runner
    )
    seed_s = _seed(
        runner, (Tool.objects.get(pk=SIM_TOOL), Tool.objects.get(pk=HELD_TOOL)), operations
    )

    started = time.monotonic()
    by_policy = policy_simulate(user=first, policy_id="bench-big-refunds", days=1)
    policy_s = time.monotonic() - started
    started = time.monotonic()
    by_contract = contract_simulate(user=first, tool=HELD_TOOL, version=held.version.number, days=1)
    contract_s = time.monotonic() - started
    return {
        "registrations": registrations,
        "cpu_ms_per_registration": {
            "none": round(none_ms, 3),
            "100_policies": round(hundred_ms, 3),
        },
        "added_cpu_ms_per_registration": round(hundred_ms - none_ms, 3),
        "cpu_ratio": round(hundred_ms / none_ms, 2) if none_ms else None,
        "seeded_operations": operations,
        "seed_s": round(seed_s, 1),
        "simulation": {
            "policy": {
                "operations": by_policy.operations,
                "seconds": round(policy_s, 2),
                "changes": {name: c.count for name, c in by_policy.changes.items()},
            },
            "contract": {
                "operations": by_contract.operations,
                "seconds": round(contract_s, 2),
                "changes": {name: c.count for name, c in by_contract.changes.items()},
            },
        },
    }


def table(figures: dict[str, Any]) -> list[str]:
    cpu = figures["cpu_ms_per_registration"]
    sim = figures["simulation"]
    lines = [
        f"(f) simulation over the last day ({figures['seeded_operations']:,} operations seeded"
        f" in {figures['seed_s']} s):",
    ]
    for name, label in (
        ("policy", "a Cedar policy's new version"),
        ("contract", "a contract version"),
    ):
        part = sim[name]
        lines.append(
            f"    {label:<30} {part['operations']:>8,} operations judged in"
            f" {part['seconds']:>6.2f} s  {part['changes']}"
        )
    lines += [
        f"(g) CPU per registration with an inline claim, {figures['registrations']} each:",
        f"    no policy {cpu['none']:.3f} ms  100 active policies {cpu['100_policies']:.3f} ms"
        f"  added {figures['added_cpu_ms_per_registration']:.3f} ms (x{figures['cpu_ratio']})",
    ]
    return lines
