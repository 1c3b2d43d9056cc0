"""The Django admin: object permissions per tool and the activation action."""

from django.test import Client

from operations.models import Tool, ToolVersion
from tests.approvals.conftest import person
from tests.conftest import contract


def test_admin_pages_load_for_a_superuser(api):
    api.tool("refund", contract("irreversible"))
    client = Client()
    client.force_login(person(is_superuser=True, is_staff=True))
    for url in (
        "/admin/",
        "/admin/operations/tool/",
        "/admin/operations/tool/refund/change/",
        "/admin/operations/tool/refund/permissions/",
        "/admin/operations/toolversion/",
        "/admin/operations/runner/",
        "/admin/operations/runnertoken/",
        "/admin/operations/operation/",
        "/admin/operations/event/",
        "/admin/approvals/approvalrequest/",
    ):
        assert client.get(url).status_code == 200, url


def test_activation_action_in_the_admin(api):
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    weaker = ToolVersion.objects.get(tool_id="refund", number=2)
    client = Client()
    client.force_login(person(is_superuser=True, is_staff=True))
    response = client.post(
        "/admin/operations/toolversion/",
        {"action": "activate", "_selected_action": [weaker.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert Tool.objects.get(pk="refund").active_version_id == weaker.pk
