"""The lean hot path's denormalized facts (issue 14), filled in for existing rows.

- ``Operation.event_seq`` / ``event_head``: the head of each operation's event chain, so
  that appending an event reads no event;
- ``Run.principal_user``: the person the run's principal names, found once per run
  instead of at each registration;
- ``Runner.webhook_events``: the patterns of the runner's active webhook endpoints, so
  that a write no pattern matches reads no endpoint.
"""

import unicodedata

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def _identity(username):
    return unicodedata.normalize("NFKC", username).casefold()


def fill(apps, schema_editor):
    Operation = apps.get_model("operations", "Operation")
    Run = apps.get_model("operations", "Run")
    Runner = apps.get_model("operations", "Runner")
    WebhookEndpoint = apps.get_model("operations", "WebhookEndpoint")
    User = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    table = Operation._meta.db_table
    events = apps.get_model("operations", "Event")._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET "
            f"event_seq = COALESCE((SELECT MAX(e.seq) FROM {events} e WHERE e.stream = {table}.id), 0), "
            f"event_head = COALESCE((SELECT e.hash FROM {events} e WHERE e.stream = {table}.id "
            "ORDER BY e.seq DESC LIMIT 1), '')"
        )
    people = {}
    for pk, username in User.objects.exclude(username__startswith="runner:").values_list(
        "pk", "username"
    ).order_by("pk"):
        people.setdefault(_identity(username), pk)
    for run in Run.objects.filter(principal__startswith="user:").only("id", "principal"):
        pk = people.get(_identity(run.principal[len("user:") :]))
        if pk is not None:
            Run.objects.filter(pk=run.pk).update(principal_user_id=pk)
    patterns = {}
    for runner_id, events_ in WebhookEndpoint.objects.filter(is_active=True).values_list(
        "runner_id", "events"
    ):
        patterns.setdefault(runner_id, set()).update(events_)
    for runner_id, found in patterns.items():
        Runner.objects.filter(pk=runner_id).update(webhook_events=sorted(found))


class Migration(migrations.Migration):

    dependencies = [
        ('operations', '0006_toolversion_registering_owner'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='operation',
            name='event_head',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='operation',
            name='event_seq',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='run',
            name='principal_user',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='runner',
            name='webhook_events',
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
