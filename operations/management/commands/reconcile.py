"""``python manage.py reconcile``: run the due reconciliation lookups once (or in a loop)."""

import time

from django.core.management.base import BaseCommand

from operations.dispatch.probes import probe_due


class Command(BaseCommand):
    help = "Query the lookup URLs of outcome_unknown operations whose probe is due."

    def add_arguments(self, parser):
        parser.add_argument(
            "--loop", type=float, metavar="SECONDS", help="Repeat every SECONDS until stopped."
        )

    def handle(self, *args, **options):
        while True:
            report = probe_due()
            self.stdout.write(
                f"probed: {report.probed}, resolved: {report.resolved}, failed: {report.failed}"
            )
            if not options["loop"]:
                return
            time.sleep(options["loop"])
