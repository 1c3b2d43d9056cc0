"""``migrate`` as the database's owner, then the runtime role's privileges again.

With ``DATABASE_OWNER_URL`` set, the tables are the owner's: Django's ``migrate`` runs
on the owner's login (``dbroles.as_owner``), and the grants of the runtime role
(``DATABASE_URL``'s user, ``effectgate db roles``) are applied afterwards, so a table
a migration adds (or rebuilds) is never left without them. Without it, one login does
both and this is Django's ``migrate``.
"""

from django.core.management.commands import migrate

from operations.dbroles import as_owner, roles_apply, runtime_role


class Command(migrate.Command):
    def handle(self, *args, **options):
        database = options["database"]
        runtime = runtime_role(database)
        with as_owner(database):
            super().handle(*args, **options)
            changed = not options.get("plan") and not options.get("check_unapplied")
            if runtime is not None and changed:
                roles_apply(runtime=runtime, using=database)
                if options["verbosity"] >= 1:
                    self.stdout.write(f"Privileges of the runtime role {runtime} applied.")
