"""The benchmarks' hand-written INSERTs take the columns they do not name from the
models (bench/columns.py), so that a column added later cannot break them."""

import pytest

from approvals.models import ApprovalRequest
from bench.columns import sql_fill, unnamed_defaults
from operations.models import Run

# What make bench's seed of approval requests names (bench/scale.py).
SEEDED = {
    "id", "operation_id", "intent_hash", "status", "approvals_required", "grant_ttl_s",
    "reason", "context", "created_at", "expires_at", "decided_at",
}  # fmt: skip


def test_a_not_null_column_the_seed_leaves_out_gets_the_models_default():
    # escalate_to came after the seed was written; left out, it failed make bench.
    assert unnamed_defaults(ApprovalRequest, SEEDED) == {"escalate_to": ""}
    names, marks, params = sql_fill(ApprovalRequest, SEEDED, key="apr")
    assert (names, marks, params) == (
        ", escalate_to",
        ", %(apr_escalate_to)s",
        {"apr_escalate_to": ""},
    )


def test_nullable_columns_and_those_the_database_fills_are_left_alone():
    named = SEEDED | {"escalate_to"}
    assert unnamed_defaults(ApprovalRequest, named) == {}
    assert "escalate_at" not in unnamed_defaults(ApprovalRequest, SEEDED)


def test_a_not_null_column_without_a_default_is_named_not_guessed():
    with pytest.raises(
        LookupError, match=r"operations_run\.runner_id is NOT NULL and has no default"
    ):
        unnamed_defaults(Run, {"id"})
