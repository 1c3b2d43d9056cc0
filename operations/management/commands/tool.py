"""``python manage.py tool inbound-secret NAME [--secret whsec_...]``.

Sets the secret a provider signs its events with for this tool. Only people with
shell access set it: whoever holds it can report effects as done.
"""

import sys

from django.core.management.base import BaseCommand, CommandError

from operations import services, webhooks
from operations.models import Tool


class Command(BaseCommand):
    help = "Manage tools: the inbound events secret."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        secret = sub.add_parser("inbound-secret", help="Set the provider's signing secret.")
        secret.add_argument("name")
        secret.add_argument(
            "--stdin", action="store_true", help="Read the provider's whsec_ secret from stdin."
        )

    def handle(self, *args, **options):
        tool = Tool.objects.filter(pk=options["name"]).first()
        if tool is None:
            raise CommandError(f"No tool named {options['name']!r}.")
        generated = not options["stdin"]
        value = webhooks.new_secret() if generated else sys.stdin.readline().strip()
        services.tool_inbound_secret_set(
            tool=tool, secret=value, actor=services.Actor.system("cli")
        )
        self.stdout.write(
            f"Inbound events for {tool.name}: POST /api/v1/inbound/{tool.name}, signed with "
            + ("this new secret (shown once):" if generated else "the secret you gave.")
        )
        if generated:
            self.stdout.write(value)
