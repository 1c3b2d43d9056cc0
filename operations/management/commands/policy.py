"""``effectgate policy ...``: people's policies kept in a repository (docs/policies.md).

``apply FILE --as USERNAME [--shadow]`` stores each statement of a Cedar file as the
newest version of the policy its ``@id`` names (a draft, or watched in shadow), all or
nothing; ``activate ID --as USERNAME [--version N]`` puts a version in force, refused
when USERNAME wrote it or does not manage policies; ``retire ID --as USERNAME``;
``simulate ID --days N --as USERNAME [--version V]`` replays the last N days of
registrations against a version (the newest by default) and prints one line per count
of what would change, then its example operations; ``list`` prints one line per policy.
Every change goes through the services as the person ``--as`` names, so the command is
refused exactly what the console would be; a refusal prints its reason on standard
error and exits 1.
"""

from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from approvals.errors import Refusal
from operations import selectors
from operations.models import PolicyVersion
from operations.policies import files
from operations.policies.simulation import CHANGES
from operations.services import policies
from operations.services.simulation import MAX_DAYS, policy_simulate


class Command(BaseCommand):
    help = "People's policies in Cedar: apply a file, activate, retire, simulate, list."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        apply = sub.add_parser("apply", help="Store a Cedar file's statements as drafts.")
        apply.add_argument("file", type=Path)
        apply.add_argument("--as", dest="username", required=True, help="Who writes them.")
        apply.add_argument(
            "--shadow", action="store_true", help="Watch them in shadow mode at once."
        )
        activate = sub.add_parser("activate", help="Put a policy's version in force.")
        activate.add_argument("policy_id")
        activate.add_argument("--as", dest="username", required=True)
        activate.add_argument("--version", type=int, help="Default: the newest version.")
        retire = sub.add_parser("retire", help="Take a policy out of force and shadow.")
        retire.add_argument("policy_id")
        retire.add_argument("--as", dest="username", required=True)
        retire.add_argument("--reason", default="")
        simulate = sub.add_parser(
            "simulate", help="What a version would change over past registrations."
        )
        simulate.add_argument("policy_id")
        # The simulation shows past operations' figures: only to people who manage
        # policies, so it runs as a named person like the other actions.
        simulate.add_argument("--as", dest="username", required=True)
        simulate.add_argument(
            "--days", type=int, required=True, help=f"How many days to replay (1 to {MAX_DAYS})."
        )
        simulate.add_argument("--version", type=int, help="Default: the newest version.")
        sub.add_parser("list", help="One line per policy: id, state, versions.")

    def handle(self, *args, **options):
        try:
            getattr(self, f"_{options['action']}")(options)
        except Refusal as refusal:
            raise CommandError(refusal.detail) from refusal

    def _person(self, username):
        user = get_user_model().objects.filter(username=username).first()
        if user is None or not user.is_active:
            raise CommandError(f"No active user named {username!r}.")
        return user

    def _apply(self, options):
        user = self._person(options["username"])
        try:
            text = options["file"].read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"Cannot read {options['file']}: {exc}") from exc
        statements = files.split(text)
        newest = {
            policy.pk: policy.newest_number
            for policy in selectors.policy_rows().filter(pk__in=[s.policy_id for s in statements])
        }
        lines = []
        # All or nothing: a file is reviewed as one change, so a statement Cedar refuses
        # leaves every policy as it was.
        with transaction.atomic():
            for statement in statements:
                try:
                    version = policies.policy_write(
                        user=user, text=statement.text, shadow=options["shadow"]
                    )
                except Refusal as refusal:
                    raise CommandError(
                        f"Nothing was stored. {statement.policy_id} (line {statement.line}): "
                        f"{refusal.detail}"
                    ) from refusal
                lines.append(self._written(version, newest.get(statement.policy_id)))
        for line in lines:
            self.stdout.write(line)

    def _written(self, version: PolicyVersion, before: int | None) -> str:
        state = version.policy.state
        if before == version.number:
            return f"{version.policy_id}: unchanged, version {version.number} ({state})"
        return f"{version.policy_id}: version {version.number} written ({state})"

    def _activate(self, options):
        user = self._person(options["username"])
        policy = policies.policy_activate(
            user=user, policy_id=options["policy_id"], number=options["version"]
        )
        version = policy.active_version
        self.stdout.write(f"{policy.pk}: version {version.number} is active")

    def _retire(self, options):
        user = self._person(options["username"])
        policy = policies.policy_retire(
            user=user, policy_id=options["policy_id"], reason=options["reason"]
        )
        self.stdout.write(f"{policy.pk}: retired")

    def _simulate(self, options):
        user = self._person(options["username"])
        result = policy_simulate(
            user=user,
            policy_id=options["policy_id"],
            days=options["days"],
            version=options["version"],
        )
        cut = " (truncated: the newest of the window only)" if result.truncated else ""
        self.stdout.write(f"operations replayed: {result.operations}{cut}")
        for name in CHANGES:
            self.stdout.write(f"{name.replace('_', ' ')}: {result.changes[name].count}")
        for name in CHANGES:
            for example in result.changes[name].examples:
                self.stdout.write(
                    f"{name.replace('_', ' ')}\t{example['operation']}\t{example['tool']}\t"
                    f"{example['before']} -> {example['after']}"
                )

    def _list(self, options):
        for policy in selectors.policy_rows():
            active = f"v{policy.active_version.number}" if policy.active_version else "-"
            shadow = f"v{policy.shadow_version.number}" if policy.shadow_version else "-"
            self.stdout.write(
                f"{policy.pk}\t{policy.state}\t{policy.newest_kind}\tactive={active}\t"
                f"shadow={shadow}\tnewest=v{policy.newest_number}"
            )
