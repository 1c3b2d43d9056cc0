"""``python manage.py audit``: verify the audit trail, and anchor it elsewhere.

``audit verify``:

1. recomputes every event hash chain and names the first break (stream, seq, what
   differs); prints how many events and streams were checked;
2. with ``--expect ANCHOR``, recomputes the chain heads as of the anchor's time and
   compares them with the anchor kept since (``audit anchor``): a truncated table or a
   rewritten chain no longer matches, while events appended since do not matter;
3. checks that the ledger state follows from the events (``audit.state_verify``): the
   first decision, grant, approval request, resolution, review, operation, run or tool
   that no event explains is named with what is missing;
4. checks the transparency log (``audit.log_verify``): every stored checkpoint's
   signature with the configured key (or ``--audit-key PEM_FILE``), its root recomputed
   from the events as they are now, the consistency between consecutive checkpoints,
   and that no event the sealer is past was left out; the first fault is named.

With the event keys (``AUDIT_EVENT_KEY`` and ``AUDIT_EVENT_OLD_KEYS``, or
``--event-key-file FILE``), step 1 also checks every event's MAC and names the first
event without a valid one: written with the database's credentials, but not by the
application holding the key. Without a key it says the MACs were not checked.

Exits 1 when any of these fails. ``audit anchor`` prints an anchor of the chains as
they stood ``--lag`` seconds ago (default ten minutes, so that transactions still open
now are not half in it), after checking that every chain verifies. ``audit seal`` runs
the sealer once (``services.log_seal``): what the beat does every ``AUDIT_SEAL_EVERY_S``.
``audit export OPERATION_ID --to FILE`` writes the operation's evidence bundle
(``audit.evidence``), which ``effectgate-verify`` checks offline with the public key.

``audit mac`` counts the events without a MAC; ``audit mac --backfill`` gives those
written before the key was set their MAC under the current key, as the owner
(``DATABASE_OWNER_URL``) and only once every chain verifies (docs/deployment.md).
"""

from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db.models import Max
from django.utils import timezone

from operations import services
from operations.audit import (
    Anchor,
    archived_leaves,
    chains_verify,
    log_verify,
    state_verify,
    witnessed_checkpoint,
)
from operations.audit.evidence import evidence_bundle, evidence_json
from operations.dbroles import as_owner
from operations.errors import InvalidQuery, NotSealed
from operations.eventmac import keyring, keyring_parse
from operations.models import Checkpoint, Event, Operation
from operations.services.archive import ArchiveError, archive_recorded, archive_verify_file
from operations.services.macs import event_macs_backfill, event_macs_missing
from operations.services.seal import SEAL_BATCH
from operations.tlog import keys
from operations.tlog.notes import NoteError

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
        verify.add_argument(
            "--audit-key",
            action="append",
            default=[],
            metavar="PEM_FILE",
            help="A public key (or the private key) the log's checkpoints were signed with, "
            "instead of the configured one; repeat it for checkpoints of older keys.",
        )
        verify.add_argument(
            "--checkpoint",
            action="append",
            default=[],
            metavar="NOTE_FILE",
            help="A checkpoint kept outside the database (the signed note an audit.checkpoint "
            "webhook delivered): the log must still have its root at its size.",
        )
        seal = sub.add_parser(
            "seal", help="Run the sealer once: append new events to the log, sign a checkpoint."
        )
        seal.add_argument(
            "--limit",
            type=int,
            default=SEAL_BATCH,
            metavar="EVENTS",
            help="Append at most this many events (default %(default)s).",
        )
        export = sub.add_parser(
            "export",
            help="Write an operation's evidence bundle: its rows, its events with their "
            "inclusion proofs, the signed checkpoint (effectgate-verify checks it offline).",
        )
        export.add_argument("operation_id", metavar="OPERATION_ID")
        export.add_argument(
            "--to", required=True, metavar="FILE", help="Where to write the bundle (JSON)."
        )
        export.add_argument(
            "--witness-size",
            action="append",
            type=int,
            default=[],
            metavar="SIZE",
            help="The size of a checkpoint a witness kept: the bundle carries the consistency "
            "proof from it to the bundle's checkpoint (repeat for several).",
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
        elif options["action"] == "seal":
            self._seal(limit=options["limit"])
        elif options["action"] == "export":
            self._export(options["operation_id"], to=options["to"], sizes=options["witness_size"])
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

    def _seal(self, *, limit: int) -> None:
        if limit < 1:
            raise CommandError("--limit takes at least 1.")
        try:
            report = services.log_seal(limit=limit)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(report.describe())

    def _export(self, operation_id: str, *, to: str, sizes: list[int]) -> None:
        """``audit export``: the bundle (``audit.evidence``), written whole or not at all."""
        op = Operation.objects.filter(pk=operation_id).first()
        if op is None:
            raise CommandError(f"No operation {operation_id!r}.")
        try:
            bundle = evidence_bundle(operation=op, witness_sizes=sizes)
        except (NotSealed, InvalidQuery) as exc:
            raise CommandError(str(exc)) from exc
        text = evidence_json(bundle)
        target = Path(to)
        partial = target.with_name(f".{target.name}.partial")
        try:
            partial.write_text(text, encoding="utf-8")
            partial.replace(target)
        except OSError as exc:
            raise CommandError(f"Cannot write {to}: {exc.strerror}.") from exc
        checkpoint = bundle["checkpoint"]
        self.stdout.write(
            f"Wrote {to}: {len(bundle['events'])} events of {op.pk} with their inclusion "
            f"proofs in the checkpoint of size {checkpoint['size']} ({len(text.encode())} "
            "bytes). Verify it with: effectgate-verify "
            f"{to} --key <the log's public key, /.well-known/effectgate-audit-key>"
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

        if options["stream"]:
            self.stdout.write("Transparency log not checked (--stream checks one chain only).")
        else:
            self._verify_log(options, failures)

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

    def _verify_log(self, options, failures: list[str]) -> None:
        """Step 4: the transparency log, held to its signed checkpoints."""
        public_keys = self._audit_keys(options["audit_key"])
        if not public_keys and (Checkpoint.objects.exists() or options["checkpoint"]):
            failures.append(
                "The checkpoints' signatures cannot be checked without the log's key: set "
                "AUDIT_SIGNING_KEY_FILE or give --audit-key PEM_FILE."
            )
            return
        archived: dict[int, bytes] = {}
        for archive in options["archive"]:
            try:
                archived.update(archived_leaves(Path(archive)))
            except (OSError, ValueError, KeyError):
                continue  # the archive's own check below says what is wrong with it
        witnessed = []
        for path in options["checkpoint"]:
            try:
                note = Path(path).read_text(encoding="utf-8")
                witnessed.append(
                    witnessed_checkpoint(note, origin=keys.log_origin(), keys=public_keys)
                )
            except (OSError, UnicodeDecodeError, NoteError) as exc:
                failures.append(f"The kept checkpoint {path} does not verify: {exc}")
        report = log_verify(
            keys=public_keys,
            archived=archived,
            witnessed=witnessed,
            stop_at_first=not options["all"],
        )
        self.stdout.write(
            f"Checked {report.leaves} leaves of the transparency log and "
            f"{report.checkpoints} checkpoints."
        )
        for fault in report.faults:
            self.stdout.write(f"LOG FAULT {fault.describe()}")
        first = report.first_fault
        if first is None:
            self.stdout.write(
                "The log holds: every checkpoint verifies, matches the events and extends "
                "the one before."
            )
            if witnessed:
                self.stdout.write(f"The {len(witnessed)} kept checkpoints match the log.")
        else:
            failures.append(f"The transparency log does not hold at {first.describe()}.")

    def _audit_keys(self, paths: list[str]) -> list:
        if not paths:
            try:
                key = keys.public_key()
            except ImproperlyConfigured as exc:
                raise CommandError(str(exc)) from exc
            return [key] if key is not None else []
        found = []
        for path in paths:
            try:
                data = Path(path).read_bytes()
                found.append(keys.public_key_from_pem(data, source=f"--audit-key {path}"))
            except OSError as exc:
                raise CommandError(f"--audit-key {path} cannot be read ({exc.strerror}).") from exc
            except ImproperlyConfigured as exc:
                raise CommandError(str(exc)) from exc
        return found
