"""``manage.py lean_fill``: summarize again what migration 0008 summarized.

Run once after an upgrade to the lean hot path, when no process of the previous release
is left (docs/deployment.md, Upgrades): endpoints that release registered, and runs it
started, while the new one migrated are then known to the new release. Idempotent.
"""

from django.apps import apps
from django.core.management.base import BaseCommand
from django.db import connection

from operations.lean_fill import fill


class Command(BaseCommand):
    help = (
        "Fill the lean hot path's summary columns (chain heads, principal users, webhook patterns)."
    )

    def handle(self, *args, **options):
        changed = fill(apps, connection)
        self.stdout.write(
            "Updated: {heads} chain heads, {principal_users} principal users, "
            "{webhook_patterns} runners' webhook patterns.".format(**changed)
        )
