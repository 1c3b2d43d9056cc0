"""Fill the lean hot path's denormalized columns (migration 0007) from the rows they
summarize. Idempotent; run by migration 0008 and by ``manage.py lean_fill``, which an
upgrade runs once the previous release has stopped (docs/deployment.md, Upgrades):
what that release wrote while the new one migrated is then summarized too.

- each operation's event-chain head (``event_seq``, ``event_head``) from its stream;
- each run's ``principal_user`` where it is empty, from the principal's name (NFKC,
  case-folded, as ``access.principal_user_ids``);
- each runner's ``webhook_events``: the patterns of its active endpoints.

``apps`` is a migration's app registry or ``django.apps.apps``: only the models' tables
and fields are used.
"""

import unicodedata
from typing import Any

from django.conf import settings


def _identity(username: str) -> str:
    return unicodedata.normalize("NFKC", username).casefold()


def fill(apps: Any, connection: Any) -> dict[str, int]:
    Operation = apps.get_model("operations", "Operation")
    Run = apps.get_model("operations", "Run")
    Runner = apps.get_model("operations", "Runner")
    WebhookEndpoint = apps.get_model("operations", "WebhookEndpoint")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    table = Operation._meta.db_table
    events = apps.get_model("operations", "Event")._meta.db_table
    with connection.cursor() as cursor:
        # Only rows whose head is behind their stream; names from the models' metadata.
        cursor.execute(
            f"UPDATE {table} SET "  # noqa: S608
            f"event_seq = (SELECT MAX(e.seq) FROM {events} e WHERE e.stream = {table}.id), "
            f"event_head = (SELECT e.hash FROM {events} e WHERE e.stream = {table}.id "
            "ORDER BY e.seq DESC LIMIT 1) "
            f"WHERE event_seq < (SELECT COALESCE(MAX(e.seq), 0) FROM {events} e "
            f"WHERE e.stream = {table}.id)"
        )
        heads = cursor.rowcount
    people: dict[str, int] = {}
    for pk, username in (
        User.objects.exclude(username__startswith="runner:")
        .order_by("pk")
        .values_list("pk", "username")
    ):
        people.setdefault(_identity(username), pk)
    principals = 0
    for run_id, principal in Run.objects.filter(
        principal__startswith="user:", principal_user__isnull=True
    ).values_list("id", "principal"):
        pk = people.get(_identity(principal[len("user:") :]))
        if pk is not None:
            principals += Run.objects.filter(pk=run_id).update(principal_user_id=pk)
    patterns: dict[str, set[str]] = {}
    for runner_id, found in WebhookEndpoint.objects.filter(is_active=True).values_list(
        "runner_id", "events"
    ):
        patterns.setdefault(runner_id, set()).update(found)
    runners = 0
    for runner_id, current in Runner.objects.values_list("id", "webhook_events"):
        wanted = sorted(patterns.get(runner_id, ()))
        if current != wanted:
            runners += Runner.objects.filter(pk=runner_id).update(webhook_events=wanted)
    return {"heads": heads, "principal_users": principals, "webhook_patterns": runners}
