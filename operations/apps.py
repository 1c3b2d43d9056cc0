from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The append-only triggers of the audit tables (installed after every migrate).
        # The tasks module connects its receivers to the services' signals (the services
        # never import tasks): importing it here makes every process listen.
        from . import tasks, triggers  # noqa: F401

        triggers.register()
