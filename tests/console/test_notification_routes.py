"""The Slack channel of a tool's or a group's requests, set on their console pages by
people who manage tools' permissions, each change audited."""

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from operations.models import Event, NotificationRoute
from tests.approvals.conftest import person
from tests.conftest import contract

pytestmark = pytest.mark.django_db


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_tool_and_a_group_get_their_channel_from_their_pages(api, settings):
    settings.SLACK_BOT_TOKEN = "xoxb-test"
    api.tool("refund", contract())
    finance = Group.objects.create(name="Finance")
    admin = _signed_in(person(is_superuser=True))
    page = admin.get("/tools/refund/")
    assert b"Where its requests are told" in page.content
    response = admin.post("/tools/refund/route", {"slack_channel": "#refunds"}, follow=True)
    assert b"refund&#x27;s requests now go to refunds" in response.content
    assert NotificationRoute.objects.get(tool_id="refund").slack_channel == "refunds"
    admin.post(f"/groups/{finance.pk}/route", {"slack_channel": "C0FINANCE"})
    assert NotificationRoute.objects.get(group=finance).slack_channel == "C0FINANCE"
    assert b"C0FINANCE" in admin.get("/groups/").content
    response = admin.post("/tools/refund/route", {"slack_channel": "Not A Channel!"}, follow=True)
    assert b"Nothing was saved" in response.content
    kinds = Event.objects.filter(kind="notifications_routed").values_list("stream", flat=True)
    assert sorted(kinds) == sorted(["tool:refund", f"group:{finance.pk}"])


def test_someone_who_does_not_manage_permissions_changes_no_route(api, settings):
    settings.SLACK_BOT_TOKEN = "xoxb-test"
    api.tool("refund", contract())
    finance = Group.objects.create(name="Finance")
    reader = person()
    from guardian.shortcuts import assign_perm

    from operations.models import Tool

    assign_perm("operations.decide_tool", reader, Tool.objects.get(pk="refund"))
    client = _signed_in(reader)
    assert client.get("/groups/").status_code == 403
    client.post("/tools/refund/route", {"slack_channel": "#mine"})
    client.post(f"/groups/{finance.pk}/route", {"slack_channel": "#mine"})
    assert not NotificationRoute.objects.exists()
    assert not Event.objects.filter(kind="notifications_routed").exists()
