"""``python manage.py runlocal [ADDRPORT]``: the development server plus background work.

Local mode (no ``CELERY_BROKER_URL``): lease expiry, approval expiry, deadlines,
reconciliation probes and webhook delivery run on a thread of this process.
"""

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from console.background import LocalScheduler


class Command(BaseCommand):
    help = "Serve the console and API with background work in-process (no broker)."

    def add_arguments(self, parser):
        parser.add_argument("addrport", nargs="?", default="127.0.0.1:8000")

    def handle(self, *args, **options):
        if settings.CELERY_BROKER_URL:
            raise CommandError(
                "CELERY_BROKER_URL is set: run `celery -A console worker` and "
                "`celery -A console beat` beside the web server instead."
            )
        scheduler = LocalScheduler(settings.CELERY_BEAT_SCHEDULE)
        scheduler.start()
        self.stdout.write("Background work runs in-process (no broker configured).")
        try:
            call_command("runserver", options["addrport"], use_reloader=False)
        finally:
            scheduler.stop()
