"""``python manage.py runner create NAME [--owner USERNAME]`` and token management.

The token is printed once, alone on the last line of standard output; only its hash is
stored.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from operations import services
from operations.models import Runner, RunnerToken


class Command(BaseCommand):
    help = "Create runner accounts and their API tokens."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="Create a runner and print its first token.")
        create.add_argument("name")
        create.add_argument("--owner", help="Username of the person responsible for it.")
        token = sub.add_parser("token", help="Issue another token for a runner.")
        token.add_argument("name")
        token.add_argument(
            "--scope",
            action="append",
            choices=RunnerToken.ALL_SCOPES,
            help="Limit the token (repeatable); default: all scopes.",
        )
        sub.add_parser("list", help="List runners and their tokens (never the secrets).")

    def handle(self, *args, **options):
        actor = services.Actor.system("cli")
        if options["action"] == "create":
            owner = None
            if options["owner"]:
                owner = get_user_model().objects.filter(username=options["owner"]).first()
                if owner is None:
                    raise CommandError(f"No user named {options['owner']!r}.")
            if Runner.objects.filter(name=options["name"]).exists():
                raise CommandError(f"A runner named {options['name']!r} exists already.")
            runner, token = services.runner_create(name=options["name"], owner=owner, actor=actor)
            self.stdout.write(f"Created runner {runner.name} ({runner.id}). Its token, shown once:")
            self.stdout.write(token)
        elif options["action"] == "token":
            runner = Runner.objects.filter(name=options["name"]).first()
            if runner is None:
                raise CommandError(f"No runner named {options['name']!r}.")
            token = services.token_create(runner=runner, actor=actor, scopes=options["scope"])
            self.stdout.write(f"New token for {runner.name}, shown once:")
            self.stdout.write(token)
        else:
            for runner in Runner.objects.prefetch_related("tokens").order_by("name"):
                owner = runner.owner.get_username() if runner.owner else "-"
                self.stdout.write(f"{runner.name}\t{runner.id}\towner={owner}")
                for token in runner.tokens.all():
                    state = "revoked" if token.revoked_at else "active"
                    self.stdout.write(f"  {token.prefix}…\t{','.join(token.scopes)}\t{state}")
