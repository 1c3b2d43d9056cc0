"""Fill 0007's columns for the rows that exist (``manage.py lean_fill`` runs the same).

Not atomic: each statement commits on its own, so no table stays locked for the whole
backfill while the previous release serves.
"""

from django.db import migrations

from operations.lean_fill import fill


def _fill(apps, schema_editor):
    fill(apps, schema_editor.connection)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("operations", "0007_lean_hot_path")]

    operations = [migrations.RunPython(_fill, migrations.RunPython.noop)]
