# The events' MAC under AUDIT_EVENT_KEY (operations/eventmac.py). Events written before
# the key was set keep "" until `audit mac --backfill` (docs/deployment.md).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('operations', '0019_transparency_log'),
    ]

    operations = [
        migrations.AddField(
            model_name='event',
            name='mac',
            field=models.CharField(blank=True, default='', max_length=80),
        ),
    ]
