"""``python manage.py tool inbound-secret NAME [--stdin]``.

Sets the secret a provider signs its events for this tool with (docs/api.md, "Inbound
provider events"). Without ``--stdin`` it generates a new ``whsec_...`` secret and
prints it once, to give to the provider; with ``--stdin`` it reads the provider's own
secret (one line) from standard input, which keeps it out of the process list and the
shell history. Only people with shell access set it: whoever holds it can report effects
as done.
"""

import sys

from django.core.management.base import BaseCommand, CommandError

from operations import services, signing
from operations.models import Tool


class Command(BaseCommand):
    help = (
        "Manage tools. inbound-secret NAME [--stdin]: set the secret a provider signs "
        "inbound events with (a new one, printed once, or with --stdin the provider's own)."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        secret = sub.add_parser(
            "inbound-secret",
            help="Set the provider's signing secret: a new one, printed once, or with "
            "--stdin the provider's own.",
        )
        secret.add_argument("name")
        secret.add_argument(
            "--stdin",
            action="store_true",
            help="Read the provider's whsec_... secret (one line) from stdin instead of "
            "generating one.",
        )

    def handle(self, *args, **options):
        tool = Tool.objects.filter(pk=options["name"]).first()
        if tool is None:
            raise CommandError(f"No tool named {options['name']!r}.")
        generated = not options["stdin"]
        value = signing.new_secret() if generated else sys.stdin.readline().strip()
        services.tool_inbound_secret_set(
            tool=tool, secret=value, actor=services.Actor.system("cli")
        )
        self.stdout.write(
            f"Inbound events for {tool.name}: POST /api/v1/inbound/{tool.name}, signed with "
            + ("this new secret (shown once):" if generated else "the secret you gave.")
        )
        if generated:
            self.stdout.write(value)
