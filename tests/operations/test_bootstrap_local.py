"""``manage.py bootstrap_local``, which every ``make run`` runs: the admin and the demo
runner are made once, and every later run prints the commands that give back what was
shown only once (the admin's password, the demo token). Those commands work as printed."""

import os
import shlex
import subprocess
import sys
from io import StringIO

import pytest
from django.conf import global_settings, settings
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command

from operations.models import Runner
from operations.services import token_authenticate
from tests.docs.blocks import ROOT
from tests.support.runtime_role import database_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _bootstrap() -> str:
    out = StringIO()
    call_command("bootstrap_local", stdout=out)
    return out.getvalue()


def _run_printed_command(output: str, line_start: str, stdin: str = "") -> str:
    """Run the command printed after ``with: `` on the line that starts so, from the
    checkout as `make run` does, on the test database; return what it printed."""
    line = next(line for line in output.splitlines() if line.startswith(line_start))
    argv = shlex.split(line.partition("with: ")[2])
    # The printed command names the checkout's interpreter; the suite's may live elsewhere.
    assert argv[0] == ".venv/bin/python", line
    done = subprocess.run(
        [sys.executable, *argv[1:]],
        cwd=ROOT,
        input=stdin,
        env={
            **os.environ,
            **database_env(),
            "SECRET_KEY": settings.SECRET_KEY,
            "DB_CONN_MAX_AGE": "0",
        },
        # No controlling terminal: changepassword's prompts read the input piped here
        # instead of waiting on the terminal that runs the suite.
        start_new_session=True,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_a_second_run_prints_how_to_set_a_new_admin_password_and_that_command_works(settings):
    # The command hashes with Django's default hashers, not the suite's fast one.
    settings.PASSWORD_HASHERS = global_settings.PASSWORD_HASHERS
    first = _bootstrap()
    assert "Console admin created: user admin, password " in first
    second = _bootstrap()
    assert (
        "Console admin exists (user admin); set a new password with: "
        ".venv/bin/python manage.py changepassword admin\n" in second
    )
    assert get_user_model().objects.filter(username="admin").count() == 1

    printed = _run_printed_command(
        second, "Console admin exists", stdin="a-new-admin-passphrase-29\n" * 2
    )

    assert "Password changed successfully for user 'admin'" in printed
    assert authenticate(username="admin", password="a-new-admin-passphrase-29") is not None


def test_a_second_run_prints_how_to_issue_a_demo_token_and_that_command_works():
    _bootstrap()
    second = _bootstrap()
    assert "Demo runner exists; issue a new token with: " in second
    assert Runner.objects.filter(name="demo").count() == 1

    printed = _run_printed_command(second, "Demo runner exists")

    token = printed.strip().splitlines()[-1]
    found = token_authenticate(token)
    assert found is not None
    assert found[0].name == "demo"
