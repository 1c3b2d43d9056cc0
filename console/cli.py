"""The ``effectgate`` command: Django's management commands for an installed Effectgate.

``effectgate migrate``, ``effectgate runserver``, ``effectgate runner create NAME`` and
every other ``manage.py`` command, from any folder (the wheel's console script).
"""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
