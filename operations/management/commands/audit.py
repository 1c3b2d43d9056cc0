"""``python manage.py audit verify``: verify the audit trail.

1. Recomputes every event hash chain and names the first break (stream, seq, what
   differs); prints how many events and streams were checked and a digest of the chain
   heads (keep it elsewhere: a later run that prints another digest while no event was
   appended means history was rewritten).
2. Checks that the ledger state follows from the events (``audit.state_verify``): the
   first decision, grant, approval request, resolution, review, operation, run or tool
   that no event explains is named with what is missing.

Exits 1 when either fails.
"""

from django.core.management.base import BaseCommand, CommandError

from operations.audit import chains_verify, state_verify
from operations.models import Event


class Command(BaseCommand):
    help = "Verify the audit trail: the hash chains, and the ledger state against the events."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        verify = sub.add_parser(
            "verify", help="Check the chains and the ledger state; exit 1 on a fault."
        )
        verify.add_argument("--stream", help="Only this stream's chain (e.g. op_... or run_...).")
        verify.add_argument(
            "--all",
            action="store_true",
            help="List every broken stream and every unexplained row, not only the first.",
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
        failures = []
        if report.ok:
            self.stdout.write("Every chain verifies.")
        else:
            for found in report.breaks:
                self.stdout.write(f"BROKEN {found.describe()}")
            first = report.first_break
            failures.append(f"The audit trail is broken at {first.stream} seq {first.seq}.")

        if options["stream"]:
            self.stdout.write("Ledger state not checked (--stream checks one chain only).")
        else:
            first_unexplained = None
            for found in state_verify():
                self.stdout.write(f"UNEXPLAINED {found.describe()}")
                first_unexplained = first_unexplained or found
                if not options["all"]:
                    break
            if first_unexplained is not None:
                failures.append(f"No event explains {first_unexplained.describe()}.")
            else:
                self.stdout.write("Every state row follows from the events.")

        if failures:
            raise CommandError(" ".join(failures))
