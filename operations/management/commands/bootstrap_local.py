"""Local set-up for ``make run``: an admin user and a demo runner, each made once.

The admin password and the demo token are printed once, when they are created; only
hashes are stored. Run again, it changes nothing, says so, and prints the command that
sets a new admin password or issues a new demo token (``ADMIN_RESET_COMMAND``,
``DEMO_RENEWAL_COMMAND``).
"""

import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from operations import services
from operations.models import Runner

# Relative to the checkout, where `make run` runs these commands.
ADMIN_RESET_COMMAND = ".venv/bin/python manage.py changepassword admin"
DEMO_RENEWAL_COMMAND = ".venv/bin/python manage.py runner token demo"


class Command(BaseCommand):
    help = "Create the local admin user and demo runner if they do not exist."

    def handle(self, *args, **options):
        users = get_user_model()
        if not users.objects.filter(username="admin").exists():
            password = secrets.token_urlsafe(12)
            users.objects.create_superuser("admin", "admin@localhost", password)
            self.stdout.write(f"Console admin created: user admin, password {password}")
        else:
            self.stdout.write(
                f"Console admin exists (user admin); set a new password with: {ADMIN_RESET_COMMAND}"
            )
        if not Runner.objects.filter(name="demo").exists():
            _, token = services.runner_create(
                name="demo", owner=None, actor=services.Actor.system("bootstrap")
            )
            self.stdout.write(f"Demo runner token (shown once): {token}")
        else:
            self.stdout.write(f"Demo runner exists; issue a new token with: {DEMO_RENEWAL_COMMAND}")
