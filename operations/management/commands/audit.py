"""``python manage.py audit verify``: recompute every event hash chain.

Prints how many events and streams were checked and a digest of the chain heads (keep
it elsewhere: a later run that prints another digest while no event was appended means
history was rewritten), then the first break, if any, by stream and seq with what
differs. Exits 1 when a chain is broken.
"""

from django.core.management.base import BaseCommand, CommandError

from operations.audit import chains_verify
from operations.models import Event


class Command(BaseCommand):
    help = "Verify the audit trail: recompute every event stream's hash chain."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        verify = sub.add_parser("verify", help="Recompute the hash chains; exit 1 on a break.")
        verify.add_argument("--stream", help="Only this stream (e.g. op_... or runner:rnr_...).")
        verify.add_argument(
            "--all", action="store_true", help="List the first break of every broken stream."
        )

    def handle(self, *args, **options):
        queryset = Event.objects.all()
        if options["stream"]:
            queryset = queryset.filter(stream=options["stream"])
        report = chains_verify(queryset, stop_at_first=not options["all"])
        self.stdout.write(
            f"Checked {report.events} events in {report.streams} streams; "
            f"heads digest {report.heads_digest}."
        )
        if report.ok:
            self.stdout.write("Every chain verifies.")
            return
        for found in report.breaks:
            self.stdout.write(f"BROKEN {found.describe()}")
        first = report.first_break
        raise CommandError(f"The audit trail is broken at {first.stream} seq {first.seq}.")
