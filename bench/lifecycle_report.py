"""The figures of ``bench.lifecycle`` per effect, against the peer and the anchor, and
the tables ``make bench`` prints from them."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .lifecycle_seats import NO_BATCH_ENDPOINT, ORDER, PEERS, batch_path


def per_effect(reports: dict[str, dict[str, Any]], batch_sizes: tuple[int, ...]) -> dict:
    """Throughput, statements and CPU per effect of the essential anchor, DBOS and the
    API, single and in batches, and the API's throughput over the other two's (None
    where the API has no batch path)."""
    sizes: dict[str, dict[str, Any]] = {}
    over: dict[str, dict[str, float | None]] = {"api_over_dbos": {}, "api_over_essential": {}}
    for size in (1, *batch_sizes):
        label = "single" if size == 1 else f"batch_{size}"
        row = {}
        for kind in PEERS:
            path = reports.get(kind if size == 1 else batch_path(kind, size))
            row[kind] = (
                None
                if path is None
                else {
                    "effects_s": path["lifecycles_s"],
                    "statements_per_effect": path["statements_per_lifecycle"],
                    "cpu_ms_per_effect": path["cpu_ms_per_lifecycle"],
                    **({"in_process": True} if path.get("in_process") else {}),
                }
            )
        sizes[label] = row
        api = row["api"]
        for key, other in (
            ("api_over_dbos", row["dbos"]),
            ("api_over_essential", row["essential"]),
        ):
            over[key][label] = (
                None
                if api is None or other is None
                else round(api["effects_s"] / other["effects_s"], 3)
            )
    return {"sizes": sizes, **over}


# --- the table ---------------------------------------------------------------------------------


def table(life: dict[str, Any]) -> list[str]:
    paths = life["paths"]
    essential_rate = paths["essential"]["lifecycles_s"]
    lines = [
        f"(a) lifecycle (register with inline claim -> outcome), {life['lifecycles_per_path']}"
        f" per path, {life['threads']} client threads",
        f"    {'path':<12}{'lifecycles/s':>13}{'x essential':>13}{'statements':>12}"
        f"{'CPU ms per lifecycle: app':>27}{'postgres':>10}{'client':>8}{'total':>8}",
    ]
    for name in ORDER:
        path = paths[name]
        cpu = path["cpu_ms_per_lifecycle"]
        lines.append(
            f"    {name:<12}{path['lifecycles_s']:>13.1f}"
            f"{essential_rate / path['lifecycles_s']:>13.2f}"
            f"{path['statements_per_lifecycle']:>12.1f}"
            f"{cpu['app']:>27.2f}{cpu['postgres']:>10.2f}{_client(path):>8}{cpu['total']:>8.2f}"
        )
    lines.append("    latency p50 / p99 ms per step:")
    for name in ORDER:
        steps = paths[name]["steps"]
        lines.append(
            f"      {name:<12}"
            + "   ".join(
                f"{step} {values['p50_ms']:.1f} / {values['p99_ms']:.1f}"
                for step, values in steps.items()
            )
        )
    django = paths["api"].get("django_cpu_ms_per_request")
    if django:
        lines += [
            "    API CPU ms per request inside the Django app: "
            + ", ".join(f"{step} {ms:.1f}" for step, ms in django.items()),
            f"      (gunicorn's processes: {paths['api']['cpu_ms_per_lifecycle']['app']:.1f}"
            " per lifecycle; the rest is HTTP, the worker's threads, the master)",
        ]
    if not life["replica_matches_api"]:
        lines.append(
            "    the replica's statement count differs from the API's:"
            " bench/lifecycle_sql.py needs an update"
        )
    traced, usual = life["traced_statements"]["api"], life["usual_statements"]["api"]
    lines.append(
        "    statements the API sends beyond the essential ones, in the traced lifecycle"
        + (f" ({traced} statements; most sent {usual}):" if traced != usual else ":")
    )
    for label, count in Counter(life["api_beyond_essential"]).most_common():
        lines.append(f"      {count} x {label}")
    if life["essential_beyond_api"]:
        lines.append(
            "    essential statements the API does not send: "
            + ", ".join(life["essential_beyond_api"])
        )
    return lines + peer_table(life)


def _client(path: dict[str, Any]) -> str:
    """The client's CPU cell: "in app" where the app runs in the client's process."""
    return "in app" if path.get("in_process") else f"{path['cpu_ms_per_lifecycle']['client']:.2f}"


def _ratio(value: float | None) -> str:
    return NO_BATCH_ENDPOINT if value is None else f"{value:.2f}"


def peer_table(life: dict[str, Any]) -> list[str]:
    """Per effect: the API against DBOS and the essential anchor, single and batched."""
    peer = life.get("peer")
    if not peer:
        return []
    lines = [
        "(a) per effect, against the durable-execution peer (DBOS, one workflow step per"
        " effect, in the client's process) and the essential anchor",
        f"    {'batch':<8}{'path':<11}{'effects/s':>10}{'statements':>12}"
        f"{'CPU ms per effect: app':>24}{'postgres':>10}{'client':>8}{'total':>8}",
    ]
    for label, row in peer["sizes"].items():
        size = "1" if label == "single" else label.removeprefix("batch_")
        for kind, path in row.items():
            if path is None:
                lines.append(f"    {size:<8}{kind:<11}{NO_BATCH_ENDPOINT:>10}")
                continue
            cpu = path["cpu_ms_per_effect"]
            client = "in app" if path.get("in_process") else f"{cpu['client']:.2f}"
            lines.append(
                f"    {size:<8}{kind:<11}{path['effects_s']:>10.1f}"
                f"{path['statements_per_effect']:>12.2f}{cpu['app']:>24.2f}"
                f"{cpu['postgres']:>10.2f}{client:>8}{cpu['total']:>8.2f}"
            )
    for key, name in (("api_over_dbos", "api / DBOS"), ("api_over_essential", "api / essential")):
        lines.append(
            f"    throughput {name}: "
            + ", ".join(
                f"{'single' if label == 'single' else 'x' + label.removeprefix('batch_')}"
                f" {_ratio(value)}"
                for label, value in peer[key].items()
            )
        )
    if "dbos_idle_cpu_ms_per_s" in life:
        lines.append(
            f"    DBOS's background threads, idle: {life['dbos_idle_cpu_ms_per_s']:.1f} ms of CPU"
            " per second (in this process: in every path's client figure)"
        )
    dbos = life.get("statements", {}).get("dbos")
    if dbos:
        lines.append("    what DBOS sends for one effect (its traced workflow):")
        for label, count in Counter(dbos["workflow"]).most_common():
            lines.append(f"      {count} x {label}")
    return lines
