from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The append-only triggers of the audit tables (installed after every migrate),
        # and the path converters the URL patterns name (before any pattern is read).
        # The tasks module connects its receivers to the services' signals (the services
        # never import tasks): importing it here makes every process listen.
        from django.db.models.signals import post_delete, post_migrate, post_save

        from . import tasks, triggers  # noqa: F401
        from .http import converters
        from .models import WebhookEndpoint
        from .services.endpoints import runner_webhook_events_refresh

        triggers.register()
        converters.register()
        for signal in (post_save, post_delete):
            signal.connect(runner_webhook_events_refresh, sender=WebhookEndpoint)
        # The database cache's table (without Redis, Django's cache, which console/slack.py
        # uses), like the triggers after every migrate: no migration file, so it exists
        # whichever cache is configured. The throttle counts in a table of its own
        # (migration 0021).
        post_migrate.connect(_cache_table, sender=self)


def _cache_table(sender: AppConfig, using: str, **kwargs: object) -> None:
    from .http.throttling import cache_table_create

    cache_table_create(using=using)
