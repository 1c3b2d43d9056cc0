"""``flush`` as the database's owner, with the audit tables' TRUNCATE triggers ignored.

Django's ``flush`` empties every table with one ``TRUNCATE``; the test runner calls it
between transactional tests. The audit tables refuse ``TRUNCATE`` (operations/triggers.py)
so that SQL sent with the application's credentials cannot empty them; emptying the
whole database on purpose from the application's own command line stays possible, for
the owner: the runtime role holds no TRUNCATE at all (operations/dbroles.py), so with
``DATABASE_OWNER_URL`` set the flush runs on the owner's login (``as_owner``).
"""

from django.core.management.commands import flush
from django.core.management.sql import emit_post_migrate_signal

from operations.dbroles import as_owner
from operations.triggers import ignored, truncate_trigger_uris


class Command(flush.Command):
    def handle(self, **options):
        database = options["database"]
        with as_owner(database):
            # post_migrate (which reinstalls the triggers) runs after the ignore has
            # ended. When an interactive flush is cancelled, post_migrate still runs;
            # everything it does (permissions, content types, triggers) is idempotent.
            with ignored(*truncate_trigger_uris(), database=database):
                super().handle(**{**options, "inhibit_post_migrate": True})
            if not options.get("inhibit_post_migrate", False):
                emit_post_migrate_signal(options["verbosity"], options["interactive"], database)
