"""``effectgate slack link USERNAME SLACK_USER_ID``, ``slack unlink USERNAME`` and
``slack links``: an operator links a person to their Slack account (docs/notifications.md).

Slack's buttons then decide as that person, under the console's rules. Link only an
account you know is theirs (Slack's member id, "U0123ABCD", from their Slack profile:
"Copy member ID"); people can link their own from Slack without an operator.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from approvals.models import ExternalIdentity
from operations import services
from operations.selectors.notices import SLACK_ISSUER

SLACK_ID_HELP = "Slack's member id (U… or W…), from the person's Slack profile."


class Command(BaseCommand):
    help = "Link people to their Slack accounts, so Slack's buttons decide as them."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        link = sub.add_parser("link", help="Link a person to a Slack account.")
        link.add_argument("username")
        link.add_argument("slack_user_id", help=SLACK_ID_HELP)
        unlink = sub.add_parser("unlink", help="Remove a person's Slack link.")
        unlink.add_argument("username")
        sub.add_parser("links", help="List the people linked to Slack accounts.")

    def _person(self, username: str):
        person = get_user_model().objects.filter(username=username).first()
        if person is None:
            raise CommandError(f"No person named {username!r}.")
        return person

    def handle(self, *args, **options):
        actor = services.Actor.system("cli")
        if options["action"] == "link":
            person = self._person(options["username"])
            slack_user = options["slack_user_id"].strip()
            if not slack_user.isascii() or not slack_user.isalnum() or slack_user[:1] not in "UW":
                raise CommandError(f"{slack_user!r} is not a Slack member id: {SLACK_ID_HELP}")
            try:
                services.slack_link(
                    user=person, slack_user_id=slack_user, actor=actor, via="operator"
                )
            except ValueError as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"Linked {person.get_username()} to the Slack account {slack_user}.")
        elif options["action"] == "unlink":
            person = self._person(options["username"])
            if not services.slack_unlink(user=person, actor=actor):
                raise CommandError(f"{person.get_username()} has no Slack link.")
            self.stdout.write(f"Unlinked {person.get_username()} from Slack.")
        else:
            links = ExternalIdentity.objects.filter(issuer=SLACK_ISSUER).select_related("user")
            for link in links.order_by("user__username"):
                self.stdout.write(f"{link.user.get_username()}\t{link.subject}")
