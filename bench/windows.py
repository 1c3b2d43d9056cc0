"""What a limit over time adds to a registration (docs/benchmarks.md, Limits over time).

``python -m bench.windows [--n 400] [--prior 0,1000,20000]`` on a fresh database of its own
(``effectgate_windows``, on the server ``DATABASE_URL`` names; PostgreSQL by default):
registrations through ``services.operation_register``, one after another, with no
policy in force, with a windowed policy that does not match, and with one that matches
below its bound while its group already holds each ``--prior`` number of entries in the
window (the window's read is an index range over them). Prints p50 and p99 per registration.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from bench.stack import fresh_database
from bench.timing import latency_ms

POLICY = """@id("bench-window")
@approval("required")
@window("24h")
@max_count("1000000")
@group_by("principal")
permit(principal, action == Action::"register", resource == Tool::"{tool}");"""


def _setup(base_url: str) -> None:
    os.environ["DATABASE_URL"] = fresh_database("effectgate_windows", base_url=base_url)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _measure(n: int, priors: list[int]) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.db import connection
    from django.utils import timezone

    from operations import services
    from operations.models import Operation, PolicyWindowEntry
    from operations.services import policies

    runner, _ = services.runner_create(name="bench", actor=services.Actor.system("bench"))
    contract = {
        "effect_class": "idempotent",
        "input_schema": {
            "type": "object",
            "required": ["payment_id"],
            "properties": {"payment_id": {"type": "string"}},
            "additionalProperties": False,
        },
        "approval": {"mode": "never"},
    }
    for tool in ("refund", "other"):
        services.tool_register(runner=runner, name=tool, body=contract)
    run = services.run_create(runner=runner, principal="user:bench", budgets={})
    user_model = get_user_model()
    manage = Permission.objects.get(codename="manage_policies")
    stewards = []
    for name in ("author", "second"):
        steward = user_model.objects.create_user(username=name)
        steward.user_permissions.add(manage)
        stewards.append(user_model.objects.get(pk=steward.pk))
    counter = iter(range(10**9))

    def register_many() -> list[float]:
        seconds = []
        for _ in range(n):
            key = f"k-{next(counter)}"
            started = time.perf_counter()
            services.operation_register(
                runner=runner,
                run_id=run.id,
                tool_name="refund",
                operation_key=key,
                arguments={"payment_id": key},
            )
            seconds.append(time.perf_counter() - started)
        return seconds

    def in_force(tool: str) -> None:
        text = POLICY.format(tool=tool)
        version = services.policies.policy_write(user=stewards[0], text=text)
        services.policies.policy_activate(user=stewards[1], policy_id=version.policy_id)

    results: dict[str, Any] = {}
    register_many()  # warm-up: the token, the contract, the statements' texts
    results["no policy"] = latency_ms(register_many())
    in_force("other")
    results["windowed policy, not matching"] = latency_ms(register_many())
    in_force("refund")
    policies.forget()
    anchor = Operation.objects.first()
    for prior in priors:
        PolicyWindowEntry.objects.all().delete()
        PolicyWindowEntry.objects.bulk_create(
            PolicyWindowEntry(
                policy_id="bench-window",
                key="principal:user:bench",
                at=timezone.now(),
                operation=anchor,
            )
            for _ in range(prior)
        )
        if connection.vendor == "postgresql":
            # What autovacuum does soon after: the visibility map lets the window's
            # read answer from the index alone.
            with connection.cursor() as cursor:
                cursor.execute(f"VACUUM ANALYZE {PolicyWindowEntry._meta.db_table}")
        results[f"windowed policy, matching, {prior} entries in the window"] = latency_ms(
            register_many()
        )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--prior", default="0,1000,20000", help="entries already in the window")
    parser.add_argument(
        "--base-url",
        default=os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432"),
    )
    args = parser.parse_args(argv)
    _setup(args.base_url)
    for label, figures in _measure(args.n, [int(p) for p in args.prior.split(",")]).items():
        print(f"{label:55} p50 {figures['p50_ms']:6.2f} ms  p99 {figures['p99_ms']:6.2f} ms")


if __name__ == "__main__":
    main()
