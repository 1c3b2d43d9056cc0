"""``python manage.py audit``: verify the audit trail, and anchor it elsewhere.

``audit verify``:

1. recomputes every event hash chain and names the first break (stream, seq, what
   differs); prints how many events and streams were checked;
2. with ``--expect ANCHOR``, recomputes the chain heads as of the anchor's time and
   compares them with the anchor kept since (``audit anchor``): a truncated table or a
   rewritten chain no longer matches, while events appended since do not matter;
3. checks that the ledger state follows from the events (``audit.state_verify``): the
   first decision, grant, approval request, resolution, review, operation, run or tool
   that no event explains is named with what is missing.

With the event keys (``AUDIT_EVENT_KEY`` and ``AUDIT_EVENT_OLD_KEYS``, or
``--event-key-file FILE``), step 1 also checks every event's MAC and names the first
event without a valid one: written with the database's credentials, but not by the
application holding the key. Without a key it says the MACs were not checked.

Exits 1 when any of these fails. ``audit anchor`` prints an anchor of the chains as
they stood ``--lag`` seconds ago (default ten minutes, so that transactions still open
now are not half in it), after checking that every chain verifies.

``audit mac`` counts the events without a MAC; ``audit mac --backfill`` gives those
written before the key was set their MAC under the current key, as the owner
(``DATABASE_OWNER_URL``) and only once every chain verifies (docs/deployment.md).
"""

from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Max
from django.utils import timezone

from operations.audit import Anchor, chains_verify, state_verify
from operations.dbroles import as_owner
from operations.eventmac import keyring, keyring_parse
from operations.models import Event
from operations.services.archive import ArchiveError, archive_recorded, archive_verify_file
from operations.services.macs import event_macs_backfill, event_macs_missing

DEFAULT_LAG_S = 600


def _keys(path: str | None) -> dict[str, bytes]:
    """The event keys to verify with: those of ``--event-key-file``, else the settings'."""
    if not path:
        return keyring()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise CommandError(f"--event-key-file: cannot read {path}: {exc}") from exc
    try:
        return keyring_parse(text, default_id=settings.AUDIT_EVENT_KEY_ID)
    except ValueError as exc:
        raise CommandError(f"--event-key-file {path}: {exc}.") from exc


def _anchor(text: str) -> Anchor:
    try:
        return Anchor.parse(text)
    except ValueError as exc:
        raise CommandError(f"--expect takes an anchor printed by 'audit anchor': {exc}.") from exc


class Command(BaseCommand):
    help = "Verify the audit trail (hash chains, anchors, ledger state) or print an anchor."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        verify = sub.add_parser(
            "verify", help="Check the chains, an anchor and the ledger state; exit 1 on a fault."
        )
        verify.add_argument("--stream", help="Only this stream's chain (e.g. op_... or run_...).")
        verify.add_argument(
            "--all",
            action="store_true",
            help="List every broken stream and every unexplained row, not only the first.",
        )
        verify.add_argument(
            "--expect",
            metavar="ANCHOR",
            help="An anchor printed earlier by 'audit anchor' and kept outside the database.",
        )
        verify.add_argument(
            "--archive",
            action="append",
            default=[],
            metavar="FILE",
            help="An archive file written by 'archive': its chains are recomputed and it "
            "must be the one an 'archived' event of the live ledger records.",
        )
        verify.add_argument(
            "--event-key-file",
            metavar="FILE",
            help="The event keys to check the MACs with, one a line: hex (the id "
            "AUDIT_EVENT_KEY_ID) or id:hex; default AUDIT_EVENT_KEY and AUDIT_EVENT_OLD_KEYS.",
        )
        mac = sub.add_parser(
            "mac", help="Count the events without a MAC; --backfill writes them (as the owner)."
        )
        mac.add_argument(
            "--backfill",
            action="store_true",
            help="Give every event without a MAC its MAC under AUDIT_EVENT_KEY, once every "
            "chain verifies (events written before the key was set).",
        )
        anchor = sub.add_parser("anchor", help="Print an anchor of the chains to keep elsewhere.")
        anchor.add_argument(
            "--lag",
            type=int,
            default=DEFAULT_LAG_S,
            metavar="SECONDS",
            help="Anchor the chains as they stood this long ago (default %(default)s): "
            "longer than any transaction that writes events stays open.",
        )

    def handle(self, *args, **options):
        if options["action"] == "anchor":
            self._anchor(lag_s=options["lag"])
        elif options["action"] == "mac":
            self._mac(backfill=options["backfill"])
        else:
            self._verify(options)

    def _mac(self, *, backfill: bool) -> None:
        missing = event_macs_missing()
        self.stdout.write(f"{missing} events have no MAC.")
        if not backfill or not missing:
            return
        if not settings.AUDIT_EVENT_KEY:
            raise CommandError("No event key: set AUDIT_EVENT_KEY or AUDIT_EVENT_KEY_FILE.")
        # The last event there is now: only the events the verification below covers get
        # a MAC, not one a writer inserts meanwhile.
        last = Event.objects.aggregate(last=Max("id"))["last"] or 0
        report = chains_verify(stop_at_first=True)
        if report.first_break is not None:
            first = report.first_break
            raise CommandError(
                f"Not vouching for a broken audit trail: {first.stream} seq {first.seq}. "
                "Run 'audit verify'."
            )
        with as_owner():
            written = event_macs_backfill(up_to_id=last)
        self.stdout.write(
            f"Every chain verifies; wrote the MAC of {written} events under key "
            f"{settings.AUDIT_EVENT_KEY_ID}."
        )

    def _anchor(self, *, lag_s: int) -> None:
        if lag_s < 0:
            raise CommandError("--lag cannot be negative.")
        report = chains_verify(anchor_at=timezone.now() - timedelta(seconds=lag_s))
        first = report.first_break
        if first is not None:
            raise CommandError(
                f"Not anchoring a broken audit trail: {first.stream} seq {first.seq}. "
                "Run 'audit verify'."
            )
        self.stdout.write(str(report.anchor))

    def _verify(self, options) -> None:
        expected = _anchor(options["expect"]) if options["expect"] else None
        if expected is not None and options["stream"]:
            raise CommandError("--expect covers every stream; it cannot be used with --stream.")
        queryset = Event.objects.all()
        if options["stream"]:
            queryset = queryset.filter(stream=options["stream"])
        keys = _keys(options["event_key_file"])
        report = chains_verify(
            queryset,
            # An anchor is recomputed over the whole table, not up to the first break.
            stop_at_first=not options["all"] and expected is None,
            anchor_at=expected.at if expected is not None else None,
            keys=keys or None,
        )
        self.stdout.write(
            f"Checked {report.events} events in {report.streams} streams; "
            f"heads digest {report.heads_digest}."
        )
        failures = []
        first = report.first_break
        if first is None:
            self.stdout.write("Every chain verifies.")
        else:
            for found in report.breaks:
                self.stdout.write(f"BROKEN {found.describe()}")
            failures.append(f"The audit trail is broken at {first.stream} seq {first.seq}.")
        failures += self._macs(report, keys, counted=options["all"] or expected is not None)

        if expected is not None and report.anchor is not None:
            why = expected.compare(report.anchor)
            if why is None:
                self.stdout.write(
                    f"The anchor holds: the {expected.events} events recorded by "
                    f"{expected.at.isoformat()} are all there, unchanged."
                )
            else:
                self.stdout.write(f"ANCHOR MISMATCH expected {expected}")
                self.stdout.write(f"               found    {report.anchor}")
                failures.append(f"The anchor does not hold: {why}.")

        if options["stream"]:
            self.stdout.write("Ledger state not checked (--stream checks one chain only).")
        else:
            first_unexplained = None
            for unexplained in state_verify():
                self.stdout.write(f"UNEXPLAINED {unexplained.describe()}")
                first_unexplained = first_unexplained or unexplained
                if not options["all"]:
                    break
            if first_unexplained is not None:
                failures.append(f"No event explains {first_unexplained.describe()}.")
            else:
                self.stdout.write("Every state row follows from the events.")

        for archive in options["archive"]:
            try:
                summary = archive_verify_file(Path(archive))
            except (ArchiveError, OSError, ValueError, KeyError) as exc:
                failures.append(f"The archive {archive} does not verify: {exc}")
                continue
            if archive_recorded(summary):
                self.stdout.write(
                    f"The archive {archive} verifies: {summary.operations} operations, "
                    f"{summary.events} events, recorded by an archived event."
                )
            else:
                failures.append(
                    f"No archived event of the live ledger records {archive} "
                    f"(sha256 {summary.file_sha256})."
                )

        if failures:
            raise CommandError(" ".join(failures))

    def _macs(self, report, keys: dict[str, bytes], *, counted: bool) -> list[str]:
        if not keys:
            self.stdout.write(
                "MACs not checked: no event key (AUDIT_EVENT_KEY, or --event-key-file); "
                "an event written with the database's credentials alone would pass."
            )
            return []
        named = ", ".join(sorted(keys))
        fault = report.first_mac_fault
        if fault is None:
            self.stdout.write(f"Every event's MAC verifies (keys {named}).")
            return []
        for found in report.mac_faults:
            self.stdout.write(f"NO VALID MAC {found.describe()}")
        total = f" ({report.events_without_mac} events in all)" if counted else ""
        return [
            f"The event {fault.stream} seq {fault.seq} (event id {fault.event_id}) has no "
            f"valid MAC under the keys {named}{total}: {fault.problem}."
        ]
