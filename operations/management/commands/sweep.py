"""``python manage.py sweep``: run every time-driven transition once (or in a loop)."""

import time

from django.core.management.base import BaseCommand

from operations.services import sweep


class Command(BaseCommand):
    help = (
        "Expire leases, approval requests and standing grants; end operations and runs past "
        "their deadline."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--loop", type=float, metavar="SECONDS", help="Repeat every SECONDS until stopped."
        )

    def handle(self, *args, **options):
        while True:
            report = sweep()
            self.stdout.write(
                f"leases expired: {report.leases_expired}, "
                f"approvals expired: {report.approvals_expired}, "
                f"approvals escalated: {report.approvals_escalated}, "
                f"operations past deadline: {report.operations_past_deadline}, "
                f"runs expired: {report.runs_expired}, "
                f"standing grants expired: {report.standing_grants_expired}, "
                f"window entries deleted: {report.window_entries_deleted}"
            )
            if not options["loop"]:
                return
            time.sleep(options["loop"])
