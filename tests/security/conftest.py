"""Fixtures for the security tests: PostgreSQL-only markers, ledger row counts."""

from io import StringIO

from django.apps import apps
from django.core.management import CommandError, call_command
from django.db import connection

from tests.support.db import skip_unless_postgresql

# The tables a refused request must leave untouched.
LEDGER_MODELS = (
    "operations.Tool",
    "operations.ToolVersion",
    "operations.Run",
    "operations.Operation",
    "operations.Attempt",
    "operations.Event",
    "operations.Resolution",
    "operations.ResolutionReview",
    "operations.WebhookEndpoint",
    "operations.OutboxMessage",
    "operations.DeliveryAttempt",
    "approvals.ApprovalRequest",
    "approvals.Decision",
    "approvals.Grant",
)


def ledger_counts() -> dict[str, int]:
    return {label: apps.get_model(label).objects.count() for label in LEDGER_MODELS}


def ledger_state() -> dict[str, object]:
    """Row counts of every ledger table, and every operation's and run's mutable state."""
    operation = apps.get_model("operations.Operation")
    run = apps.get_model("operations.Run")
    attempt = apps.get_model("operations.Attempt")
    return {
        **ledger_counts(),
        "operations": sorted(
            operation.objects.values_list("id", "status", "attempts", "updated_at")
        ),
        "runs": sorted(run.objects.values_list("id", "status", "tool_calls", "spend")),
        "attempts": sorted(
            attempt.objects.values_list("id", "status", "lease_until", "outcome_code")
        ),
    }


def on_postgresql() -> bool:
    return connection.vendor == "postgresql"


postgresql_only = skip_unless_postgresql(
    "needs PostgreSQL: the append-only triggers exist only there (SQLite, the local "
    "mode, has none); CI runs the suite on PostgreSQL",
)


def audit_verify(*args: str) -> tuple[int, str]:
    """``manage.py audit verify`` with ``args``: its exit status and what it printed."""
    out = StringIO()
    try:
        call_command("audit", "verify", *args, stdout=out)
    except CommandError as exc:
        return 1, out.getvalue() + str(exc)
    return 0, out.getvalue()


# The console's small world (two tools, operations of each) for pages to render.
from tests.console.conftest import superuser, world  # noqa: E402, F401


def steward(name: str | None = None):
    """A person who may write, shadow, activate and retire policies."""
    from django.contrib.auth.models import Permission

    from tests.approvals.conftest import person

    someone = person(**({"username": name} if name else {}))
    someone.user_permissions.add(Permission.objects.get(codename="manage_policies"))
    # Fetched again: the permission cache of the object above predates the grant.
    return type(someone).objects.get(pk=someone.pk)
