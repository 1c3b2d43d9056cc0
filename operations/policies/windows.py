"""Limits over time (docs/policies.md, Limits over time): what one registration a
windowed policy matched adds to its window, and what a person is told when the window
passes its bound.

Pure: the caller reads the window's figures under a lock (``services.windows``) and
hands them in. A registration is counted under its group's key: everything the policy
matches, or one principal, tool, runner or argument value.
"""

import hashlib
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from approvals.policy import is_missing, resolve_pointer
from approvals.standing import amount_at

from .cedar import Policy, Window

# The stored key's column; a longer key is stored as its digest.
KEY_LENGTH = 200
# What the amount's column holds (``PolicyWindowEntry.amount``: 20 digits, 6 after
# the point); an amount it cannot hold is not summed: a person decides.
AMOUNT_LIMIT = Decimal(10) ** 14
AMOUNT_QUANTUM = Decimal("0.000001")
SHOWN_LENGTH = 60


@dataclass(frozen=True)
class Counted:
    """One registration a windowed policy matched: what it adds to which window."""

    policy: Policy
    version: int | None
    key: str  # ``<group_by>:<value>``, bounded (``stored_key``)
    group: str  # the group in words for a person ("/customer_id c-1"); "" for everything
    amount: Decimal  # the value at @sum_of; 0 without a @max_sum

    @property
    def window(self) -> Window:
        assert self.policy.window is not None
        return self.policy.window

    @property
    def lock_key(self) -> int:
        """A signed 64-bit number for ``pg_advisory_xact_lock``: one per (policy, key)."""
        digest = hashlib.sha256(f"{self.policy.policy_id}\0{self.key}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)


def stored_key(group_by: str, value: str) -> str:
    key = f"{group_by}:{value}"
    if len(key) <= KEY_LENGTH:
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _group_value(window: Window, *, principal: str, tool: str, runner: str, arguments: Any) -> Any:
    if window.group_by == "":
        return ""
    if window.group_by == "principal":
        return principal
    if window.group_by == "tool":
        return tool
    if window.group_by == "runner":
        return runner
    return resolve_pointer(arguments, window.group_by)


def _amount(window: Window, arguments: Any) -> Decimal | None:
    if window.max_sum is None:
        return Decimal(0)
    amount = amount_at(arguments, window.sum_of)
    if amount is None or amount >= AMOUNT_LIMIT or amount != amount.quantize(AMOUNT_QUANTUM):
        return None
    return amount


def counted(
    policy: Policy,
    *,
    version: int | None,
    principal: str,
    tool: str,
    runner: str,
    arguments: Any,
) -> Counted | None:
    """What a registration ``policy`` matched adds to its window, or None when the
    policy cannot tell: the argument it groups by is absent, or the value it sums is
    absent, not a number, negative or too precise (then, as for any policy that cannot
    be evaluated, a person decides unless ``@when_missing("skip")``)."""
    window = policy.window
    assert window is not None
    value = _group_value(window, principal=principal, tool=tool, runner=runner, arguments=arguments)
    amount = _amount(window, arguments)
    if is_missing(value) or amount is None:
        return None
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    )
    shown = text if len(text) <= SHOWN_LENGTH else text[: SHOWN_LENGTH - 1] + "…"
    return Counted(
        policy=policy,
        version=version,
        key=stored_key(window.group_by, text),
        group=f"{window.group_by} {shown}" if window.group_by else "",
        amount=amount,
    )


def duration_label(seconds: int) -> str:
    """A window in the words it is usually written in: 86400 is "24h", 604800 "7d"."""
    if seconds % 86400 == 0 and seconds > 86400:
        return f"{seconds // 86400}d"
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def passed(entry: Counted, *, count: int, total: Decimal) -> str | None:
    """Whether the window, this registration included (``count`` and ``total`` count
    it), passes a bound: the figure in words for a person, or None below every bound."""
    window = entry.window
    where = f" for {entry.group}" if entry.group else ""
    span = duration_label(window.seconds)
    if window.max_count is not None and count > window.max_count:
        return f"{count} operations in {span}{where}, bound {window.max_count}"
    if window.max_sum is not None and total > window.max_sum:
        return (
            f"sum of {window.sum_of} {_number(total)} in {span}{where}, "
            f"bound {_number(window.max_sum)}"
        )
    return None


def _number(value: Decimal) -> str:
    """A decimal without trailing zeros after its point: 2100, 19.5."""
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text
