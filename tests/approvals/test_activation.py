"""Weakening contract versions are activated only by a permitted person, not the owner."""

import pytest
from guardian.shortcuts import assign_perm

from approvals.errors import PermissionRefused
from operations import services
from operations.models import Event, Tool, ToolVersion
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner


def _weakened(api):
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    return ToolVersion.objects.get(tool_id="refund", number=2)


def test_activation_by_a_permitted_person(api):
    version = _weakened(api)
    admin = person()
    assign_perm("operations.activate_tool", admin, Tool.objects.get(pk="refund"))
    services.tool_version_activate(version=version, user=admin)
    assert Tool.objects.get(pk="refund").active_version_id == version.pk
    assert Event.objects.filter(stream="tool:refund", kind="contract_activated").exists()
    assert api.register(api.run(), "refund")["status"] == "ready"


def test_activation_without_the_permission_is_refused(api):
    version = _weakened(api)
    with pytest.raises(PermissionRefused):
        services.tool_version_activate(version=version, user=person())
    assert Tool.objects.get(pk="refund").active_version.number == 1


def test_the_runner_owner_cannot_activate_even_as_superuser(db):
    owner = person(is_superuser=True)
    api = make_runner(owner=owner)
    version = _weakened(api)
    with pytest.raises(PermissionRefused, match="own the runner"):
        services.tool_version_activate(version=version, user=owner)
