"""CPU time of processes, read from ``/proc`` (Linux), for the bench's CPU split.

``/proc/<pid>/stat`` holds a process's user and system time (fields 14 and 15) in clock
ticks, for all its threads, including those that ended. The bench reads them before
and after a phase for three groups: the gunicorn master and its workers (the app),
the PostgreSQL backends serving the bench's connections, and the bench process itself
(the client). A tick is 10 ms on most kernels, so phases last seconds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Stat:
    pid: int
    comm: str
    ppid: int
    cpu_ticks: int  # utime + stime


def parse_stat(text: str) -> Stat:
    """One ``/proc/<pid>/stat`` line. The command name sits in parentheses and may
    itself hold spaces and parentheses, so the fields are split after the last ``)``."""
    head, _, tail = text.rpartition(")")
    pid, _, comm = head.partition(" (")
    fields = tail.split()
    # tail starts at field 3 (state): ppid is field 4, utime 14, stime 15.
    return Stat(
        pid=int(pid),
        comm=comm,
        ppid=int(fields[1]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
    )


def read_stat(pid: int, proc: Path = PROC) -> Stat | None:
    """The process's stat, or None when it is gone (or not ours to read)."""
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def children(pid: int, proc: Path = PROC) -> list[int]:
    """The processes whose parent is ``pid`` (gunicorn's workers)."""
    found = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name), proc)
            if stat is not None and stat.ppid == pid:
                found.append(stat.pid)
    return found


def cpu_ticks(pids: Iterable[int], proc: Path = PROC) -> dict[int, int]:
    """Cumulative CPU ticks of each process still alive."""
    found = {}
    for pid in pids:
        stat = read_stat(pid, proc)
        if stat is not None:
            found[pid] = stat.cpu_ticks
    return found


def spent_ms(before: dict[int, int], after: dict[int, int]) -> tuple[float, int]:
    """CPU milliseconds spent between two readings, and how many processes of the first
    reading were gone at the second (their time since the first reading is lost). A
    process first seen at the second reading started in between: all of it counts."""
    ticks = sum(after[pid] - before.get(pid, 0) for pid in after)
    lost = sum(1 for pid in before if pid not in after)
    return ticks * 1000 / TICKS_PER_S, lost
