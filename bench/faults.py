"""The seeded fault schedule shared by every runner in a chaos run.

A fault is a pure function of ``(seed, refund reference, request number)``: the third
request the provider sees for ``pay_000017`` meets the same fault whichever runner
sends it, so a naive runner and the Effectgate client face exactly the same world.
"""

import hashlib
from dataclasses import dataclass

NONE = "none"
TIMEOUT_AFTER_COMMIT = "timeout_after_commit"  # commits, answers after the client gave up
UNAVAILABLE = "unavailable"  # 503 before anything is committed
REFUSED = "refused"  # the connection is closed without an answer, before commit
SLOW = "slow"  # commits, answers late but within the client's timeout
RUNNER_CRASH = "runner_crash"  # commits; the runner dies right after sending

FAULTS = (TIMEOUT_AFTER_COMMIT, UNAVAILABLE, REFUSED, SLOW, RUNNER_CRASH)


def _uniform(*parts: object) -> float:
    """A number in [0, 1) that depends only on ``parts`` (stable across processes)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class FaultSchedule:
    """``rate`` of requests meet a fault, split evenly between ``faults``.

    ``lookup_fault_rate`` of reconciliation lookups answer 503, so that some unknown
    outcomes stay in the reconciliation queue for a later probe or a person.
    """

    seed: int = 20261129
    rate: float = 0.30
    faults: tuple[str, ...] = FAULTS
    lookup_fault_rate: float = 0.0

    def fault(self, ref: str, request_number: int) -> str:
        draw = _uniform(self.seed, "request", ref, request_number)
        if draw >= self.rate:
            return NONE
        return self.faults[int(draw / self.rate * len(self.faults))]

    def lookup_fails(self, ref: str, lookup_number: int) -> bool:
        return _uniform(self.seed, "lookup", ref, lookup_number) < self.lookup_fault_rate
