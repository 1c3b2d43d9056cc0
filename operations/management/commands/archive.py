"""``python manage.py archive --before DATE --to FILE``: move terminal operations older
than DATE out of the live ledger into a verified JSON Lines file
(``operations.services.archive``); ``audit verify --archive FILE`` checks it later.
It deletes from the audit tables, which only the owner may: with ``DATABASE_OWNER_URL``
set it runs on the owner's login (``dbroles.as_owner``)."""

from datetime import UTC, date, datetime, time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from operations.dbroles import as_owner
from operations.services.archive import ArchiveError, archive_operations
from operations.services.core import Actor


class Command(BaseCommand):
    help = "Archive terminal operations older than a date into a verified JSON Lines file."

    def add_arguments(self, parser):
        parser.add_argument("--before", required=True, help="A date, YYYY-MM-DD (UTC).")
        parser.add_argument("--to", required=True, type=Path, help="The file to create.")

    def handle(self, *args, **options):
        try:
            day = date.fromisoformat(options["before"])
        except ValueError as exc:
            raise CommandError(f"--before takes a date such as 2026-01-31: {exc}") from exc
        before = datetime.combine(day, time.min, UTC)
        path: Path = options["to"]
        try:
            with as_owner():
                summary = archive_operations(
                    before=before, path=path, actor=Actor.system("archive")
                )
        except ArchiveError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"Archived {summary.operations} operations ({summary.events} events) ended "
            f"before {day.isoformat()} to {path}; verified.\n"
            f"file sha256 {summary.file_sha256}\nheads digest {summary.heads_digest}"
        )
