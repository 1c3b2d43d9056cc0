"""``effectgate sso link USERNAME SUB``: an operator links a person to their account at
the OpenID provider (docs/deployment.md §4a).

For the people single sign-on never links by email (superusers and staff) and for anyone
whose email differs at the provider. ``SUB`` is the provider's subject identifier of the
account (its ``sub`` claim: in the provider's user details, or the person's ID token).
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from console import sso
from operations.services import Actor


class Command(BaseCommand):
    help = "Link a person to their account at the OpenID provider."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        link = sub.add_parser("link", help="Link a person to the provider's account SUB.")
        link.add_argument("username")
        link.add_argument("subject", help="The provider's sub claim of the account.")

    def handle(self, *args, **options):
        person = get_user_model().objects.filter(username=options["username"]).first()
        if person is None:
            raise CommandError(f"No person named {options['username']!r}.")
        try:
            sso.identity_link(
                user=person, subject=options["subject"].strip(), actor=Actor.system("cli")
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"Linked {person.get_username()} to {options['subject']}.")
