"""``effectgate db roles [--apply]``: the runtime role's privileges (operations/dbroles.py).

Prints the SQL that leaves the runtime role (``DATABASE_URL``'s user) owning nothing,
reading and writing the ordinary tables, only reading and inserting the audit tables
(events, decisions, resolutions and their reviews, standing grants' signatures, the
transparency log), only reading ``django_migrations``, and using the sequences; with
``--apply`` runs it as the owner (``DATABASE_OWNER_URL``) and reads back what the
runtime role may do, exiting 1 if it may still rewrite history. ``migrate`` applies it
again by itself; docs/deployment.md §1 gives the order.
"""

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection

from operations.dbroles import as_owner, roles_apply, roles_sql, runtime_role


class Command(BaseCommand):
    help = "The database roles: print (or --apply) the runtime role's privileges."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        roles = sub.add_parser(
            "roles", help="Print the runtime role's grants; --apply runs them as the owner."
        )
        roles.add_argument(
            "--apply", action="store_true", help="Run the statements as the owner, then check."
        )

    def handle(self, *args, **options):
        if connection.vendor != "postgresql":
            raise CommandError("Database roles need PostgreSQL (SQLite has none).")
        runtime = runtime_role()
        if runtime is None:
            raise CommandError(
                "DATABASE_OWNER_URL is not set, or names DATABASE_URL's user: the application "
                "and the migrations share one login. Set DATABASE_URL to the runtime role's "
                "login and DATABASE_OWNER_URL to the owner's (docs/deployment.md §1)."
            )
        try:
            with as_owner():
                if options["apply"]:
                    statements = roles_apply(runtime=runtime)
                else:
                    statements = roles_sql(runtime=runtime)
        except (DatabaseError, RuntimeError) as exc:
            raise CommandError(f"The runtime role's privileges were not applied: {exc}") from exc
        if options["apply"]:
            self.stdout.write(
                f"Applied {len(statements) - 1} statements; {runtime} owns nothing and may only "
                "read and insert the audit tables."
            )
        else:
            for statement in statements:
                self.stdout.write(statement if statement.startswith("--") else f"{statement};")
