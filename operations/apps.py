from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The append-only triggers of the audit tables (installed after every migrate).
        from . import triggers

        triggers.register()
