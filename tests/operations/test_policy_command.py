"""``effectgate policy ...`` (docs/policies.md, "Policies in your repository"): a Cedar
file applied as drafts or shadow, all or nothing; activation as a second person only;
retiring; simulating over past registrations; one line per policy. Every change goes
through the services as ``--as``."""

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from operations.models import Event, Policy, PolicyVersion
from operations.services import policies
from tests.approvals.conftest import person
from tests.operations.test_policies import steward
from tests.support.runtime_role import database_env

FILE = """// Refund rules of the payments team.
@id("no-huge")
@message("Nobody refunds more than 5000.00")
forbid(principal, action == Action::"register", resource)
when { context.arguments has amount_cents && context.arguments.amount_cents > 500000 };

@id("weekend-refunds")
@approval("required")
permit(principal, action == Action::"register", resource)
when { context.time.weekday == "Sunday" };
"""


@pytest.fixture(autouse=True)
def _fresh_policies():
    policies.forget()
    yield
    policies.forget()


def policy(*args: str) -> str:
    out = StringIO()
    call_command("policy", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def cedar_file(tmp_path) -> Path:
    path = tmp_path / "refunds.cedar"
    path.write_text(FILE)
    return path


def test_apply_stores_each_statement_as_a_draft_once(db, cedar_file):
    steward("ann")
    assert policy("apply", str(cedar_file), "--as", "ann").splitlines() == [
        "no-huge: version 1 written (draft)",
        "weekend-refunds: version 1 written (draft)",
    ]
    stored = PolicyVersion.objects.get(policy_id="no-huge")
    assert stored.text.startswith('// Refund rules of the payments team.\n@id("no-huge")')
    assert stored.written_by.username == "ann"
    assert policy("apply", str(cedar_file), "--as", "ann").splitlines() == [
        "no-huge: unchanged, version 1 (draft)",
        "weekend-refunds: unchanged, version 1 (draft)",
    ]
    assert PolicyVersion.objects.count() == 2
    assert policy("apply", str(cedar_file), "--as", "ann", "--shadow").splitlines() == [
        "no-huge: unchanged, version 1 (shadow)",
        "weekend-refunds: unchanged, version 1 (shadow)",
    ]
    assert set(Policy.objects.values_list("state", flat=True)) == {"shadow"}


def test_a_file_with_one_refused_statement_stores_nothing(db, tmp_path, api):
    api.tool("refund")
    steward("ann")
    path = tmp_path / "bad.cedar"
    path.write_text(
        FILE + '\n@id("typo")\nforbid(principal, action, resource)\n'
        "when { context.arguments.amount_cent > 5 };\n"
    )
    with pytest.raises(
        CommandError, match=r"Nothing was stored. typo \(line 12\): Cedar's validator refuses"
    ):
        policy("apply", str(path), "--as", "ann")
    assert not Policy.objects.exists()
    assert not Event.objects.filter(stream__startswith="policy:").exists()


def test_apply_as_someone_who_does_not_manage_policies_is_refused(db, cedar_file):
    person(username="eve")
    with pytest.raises(CommandError, match="You may not manage policies"):
        policy("apply", str(cedar_file), "--as", "eve")
    with pytest.raises(CommandError, match="No active user named 'nobody'"):
        policy("apply", str(cedar_file), "--as", "nobody")
    assert not Policy.objects.exists()


def test_activate_needs_a_second_person_and_retire_takes_it_out(db, cedar_file):
    steward("ann")
    steward("bob")
    person(username="eve")
    policy("apply", str(cedar_file), "--as", "ann")
    with pytest.raises(CommandError, match="You wrote version 1 of no-huge; another person"):
        policy("activate", "no-huge", "--as", "ann")
    with pytest.raises(CommandError, match="You may not manage policies"):
        policy("activate", "no-huge", "--as", "eve")
    assert Policy.objects.get(pk="no-huge").state == "draft"
    assert policy("activate", "no-huge", "--as", "bob") == "no-huge: version 1 is active\n"
    assert policy("list").splitlines() == [
        "no-huge\tactive\tforbid\tactive=v1\tshadow=-\tnewest=v1",
        "weekend-refunds\tdraft\trequire\tactive=-\tshadow=-\tnewest=v1",
    ]
    assert policy("retire", "no-huge", "--as", "bob", "--reason", "moved") == "no-huge: retired\n"
    assert Policy.objects.get(pk="no-huge").state == "retired"
    with pytest.raises(CommandError, match="No policy 'gone'"):
        policy("activate", "gone", "--as", "bob")


def _seed_refunds(api) -> list[str]:
    """Three registrations of ``refund``: two the no-huge forbid would have refused."""
    api.tool("refund")
    run = api.run()
    return [
        api.register(run, "refund", {"payment_id": f"p{amount}", "amount_cents": amount})["id"]
        for amount in (600000, 5, 700000)
    ]


def test_simulate_prints_one_line_per_count_then_the_examples(db, api, cedar_file):
    huge, _small, huger = _seed_refunds(api)
    steward("ann")
    policy("apply", str(cedar_file), "--as", "ann")
    lines = policy("simulate", "no-huge", "--days", "7", "--as", "ann").splitlines()
    assert lines[:5] == [
        "operations replayed: 3",
        "newly asking: 0",
        "newly forbidden: 2",
        "no longer asking: 0",
        "no longer forbidden: 0",
    ]
    assert lines[5:] == [
        f"newly forbidden\t{huge}\trefund\tnone -> forbid",
        f"newly forbidden\t{huger}\trefund\tnone -> forbid",
    ]
    # Simulating writes nothing: the policy is still a draft, nothing was refused.
    assert Policy.objects.get(pk="no-huge").state == "draft"


def test_simulate_is_refused_with_the_reason(db, api, cedar_file):
    _seed_refunds(api)
    steward("ann")
    person(username="eve")
    policy("apply", str(cedar_file), "--as", "ann")
    with pytest.raises(CommandError, match="You may not manage policies"):
        policy("simulate", "no-huge", "--days", "7", "--as", "eve")
    with pytest.raises(CommandError, match="A simulation replays 1 to 366 days"):
        policy("simulate", "no-huge", "--days", "0", "--as", "ann")
    with pytest.raises(CommandError, match="Policy no-huge has no version 9"):
        policy("simulate", "no-huge", "--days", "7", "--version", "9", "--as", "ann")
    with pytest.raises(CommandError, match="--as"):
        policy("simulate", "no-huge", "--days", "7")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_effectgate_command_exits_1_with_the_reason_on_stderr(cedar_file, api):
    """The documented form, as a real process: ``effectgate policy ...``."""
    _seed_refunds(api)
    steward("ann")
    steward("bob")
    effectgate = Path(sys.executable).parent / "effectgate"
    env = {
        **os.environ,
        **database_env(),
        "SECRET_KEY": settings.SECRET_KEY,
        "DB_CONN_MAX_AGE": "0",
    }

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(effectgate), "policy", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    applied = run("apply", str(cedar_file), "--as", "ann")
    assert applied.returncode == 0, applied.stderr
    assert "no-huge: version 1 written (draft)" in applied.stdout
    simulated = run("simulate", "no-huge", "--days", "7", "--as", "ann")
    assert simulated.returncode == 0, simulated.stderr
    assert "newly forbidden: 2\n" in simulated.stdout
    refused = run("activate", "no-huge", "--as", "ann")
    assert refused.returncode == 1
    assert "You wrote version 1 of no-huge" in refused.stderr
    assert refused.stdout == ""
    activated = run("activate", "no-huge", "--as", "bob")
    assert activated.returncode == 0, activated.stderr
    listed = run("list")
    assert "no-huge\tactive\tforbid\tactive=v1" in listed.stdout
    assert Policy.objects.get(pk="no-huge").state == "active"
