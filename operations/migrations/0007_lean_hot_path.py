"""The lean hot path's denormalized facts (issue 14); 0008 fills them for existing rows.

- ``Operation.event_seq`` / ``event_head``: the head of each operation's event chain, so
  that appending an event reads no event;
- ``Run.principal_user``: the person the run's principal names, found once per run;
- ``Runner.webhook_events``: the patterns of the runner's active webhook endpoints, so
  that a write no pattern matches reads no endpoint.

The columns carry database defaults, so the previous release, still serving while this
migrates, goes on inserting rows. What it writes meanwhile is made right by the new
release itself (a chain head behind its stream is caught when the next event is
appended, ``services.core.event_append``) and by ``manage.py lean_fill`` once the
previous release has stopped (docs/deployment.md, Upgrades).
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('operations', '0006_toolversion_registering_owner'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='operation',
            name='event_head',
            field=models.CharField(blank=True, db_default='', default='', max_length=64),
        ),
        migrations.AddField(
            model_name='operation',
            name='event_seq',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='run',
            name='principal_user',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AddField(
            model_name='runner',
            name='webhook_events',
            field=models.JSONField(blank=True, db_default=models.Value([], models.JSONField()), default=list),
        ),
    ]
