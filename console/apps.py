from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"

    def ready(self) -> None:
        # Connects the sign-in and sign-out receivers that audit console sessions.
        from . import signals  # noqa: F401
