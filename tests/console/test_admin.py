"""The Django admin: it shows the ledger and writes nothing a service does not.

Every admin of an ``operations`` or ``approvals`` model is enumerated from the admin
site, so a model registered later is checked without anyone remembering to add it.
"""

from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.auth.models import Group, Permission
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone
from django_otp.plugins.otp_totp.models import TOTPDevice
from guardian.shortcuts import get_group_perms, get_perms

from approvals.models import ApprovalRequest, Decision, Grant
from operations import services
from operations.crypto import decrypt
from operations.dispatch import notices
from operations.models import (
    Attempt,
    Event,
    Operation,
    Run,
    Runner,
    RunnerToken,
    Tool,
    ToolVersion,
    WebhookEndpoint,
)
from tests.approvals.conftest import person
from tests.conftest import contract, make_runner
from tests.support.world import Direct

LEDGER_APPS = {"operations", "approvals"}

# The only ledger models the admin may change, each through the service named: the
# change form of a runner calls services.runner_update, which writes runner_updated.
AUDITED_THROUGH_A_SERVICE = {Runner: "runner_update"}

# Actions an admin may offer on a ledger model; each calls the service named.
SERVICE_ACTIONS = {
    (ToolVersion, "activate"): "tool_version_activate",
    (RunnerToken, "revoke"): "token_revoke_by_user",
}


def ledger_admins():
    return [
        (model, model_admin)
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label in LEDGER_APPS
    ]


def staff_with_every_permission():
    user = person(is_staff=True)
    user.user_permissions.set(Permission.objects.all())
    return user


@pytest.fixture
def ledger(api, settings):
    """One row of every model the admin shows, and the secrets they hold."""
    direct = Direct(api)  # the tests are about the admin's pages, not the runner API
    settings.WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    direct.tool("refund", contract("irreversible", approval={"mode": "always"}))
    direct.tool("refund", contract("irreversible", approval={"mode": "never"}))
    run = direct.run()
    op = direct.register(run, "refund")
    approver = person(decide_on="refund", email="approver@example.com")
    notices.deliver_due()  # a notice and its delivery (mail to the approver)
    services.approval_decide(
        request_id=ApprovalRequest.objects.get(operation_id=op["id"]).id,
        user=approver,
        approve=True,
        comment="ok",
    )
    direct.claim(op["id"])
    services.standing_grant_issue(
        services.StandingTerms(
            tool="refund", max_uses=1, expires_at=timezone.now() + timedelta(hours=1)
        ),
        user=approver,
    )
    tool = Tool.objects.get(pk="refund")
    inbound_secret = "whsec_" + "c2VjcmV0LW9mLXRoZS1wcm92aWRlcg=="
    services.tool_inbound_secret_set(
        tool=tool, secret=inbound_secret, actor=services.Actor.system("test")
    )
    endpoint, webhook_secret = services.webhook_endpoint_create(
        runner=api.runner, url="http://127.0.0.1:9/hook", events=["operation.*"]
    )
    device = TOTPDevice.objects.create(user=approver, name="phone", confirmed=True)
    token = RunnerToken.objects.get(runner=api.runner)
    tool.refresh_from_db()
    endpoint = WebhookEndpoint.objects.get(pk=endpoint.pk)
    return {
        "api": api,
        "other runner": make_runner().runner,
        "op": Operation.objects.get(pk=op["id"]),
        "tool": tool,
        "approver": approver,
        "secrets": {
            "runner token": api.token,
            "token hash": token.token_hash,
            "inbound secret": inbound_secret,
            "inbound secret, encrypted": tool.inbound_secret_encrypted,
            "webhook secret": webhook_secret,
            "webhook secret, encrypted": endpoint.secret_encrypted,
            "TOTP key": device.key,
            "password hash": approver.password.split("$")[-1],
        },
    }


def _row(model, pk):
    return model.objects.filter(pk=pk).values().first()


def _client(user):
    client = Client()
    client.force_login(user)
    return client


def _url(model, view, *args):
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def _tampered(model, obj, ledger):
    """A change-form body that would rewrite guarded columns if it were saved."""
    body = {
        field.name: "" if getattr(obj, field.attname) is None else getattr(obj, field.attname)
        for field in model._meta.concrete_fields
        if not field.primary_key and not field.is_relation
    }
    body.update(
        {
            "owner": ledger["other runner"].pk,
            "breaker_state": "open",
            "breaker_failures": 99,
            "breaker_probe": ledger["op"].pk,
            "inbound_secret_encrypted": "planted",
            "status": "succeeded",
            "revoked_at_0": "2030-01-01",
            "revoked_at_1": "00:00:00",
            "is_active": "",
            "restrict_tools": "on",
            "decision": "reject",
            "seq": 99,
        }
    )
    return body


SIGN_INS = {"superuser": lambda: person(is_superuser=True, is_staff=True)}
SIGN_INS["staff with every model permission"] = staff_with_every_permission


# --- the registry ----------------------------------------------------------------------


def test_every_admin_of_a_ledger_model_is_read_only_unless_it_writes_through_a_service(ledger):
    request = RequestFactory().get("/admin/")
    request.user = person(is_superuser=True, is_staff=True)
    registered = ledger_admins()
    assert {model for model, _ in registered} >= {
        Tool,
        ToolVersion,
        Runner,
        RunnerToken,
        Run,
        Operation,
        Attempt,
        Event,
        ApprovalRequest,
        Decision,
        Grant,
    }
    for model, model_admin in registered:
        obj = model.objects.first()
        assert obj is not None, f"the fixture makes no {model.__name__}"
        name = model.__name__
        assert not model_admin.has_add_permission(request), name
        assert not model_admin.has_delete_permission(request), name
        assert not model_admin.has_delete_permission(request, obj), name
        if model not in AUDITED_THROUGH_A_SERVICE:
            assert not model_admin.has_change_permission(request, obj), name
        actions = set(model_admin.get_actions(request))
        assert "delete_selected" not in actions, name
        for action in actions:
            assert (model, action) in SERVICE_ACTIONS, f"{name}: {action} calls no known service"


def test_the_actions_and_change_forms_allowed_name_services_that_exist():
    for service in [*AUDITED_THROUGH_A_SERVICE.values(), *SERVICE_ACTIONS.values()]:
        assert callable(getattr(services, service)), service


# --- refused writes, row by row ----------------------------------------------------------


@pytest.mark.parametrize("sign_in", SIGN_INS)
def test_the_admin_refuses_every_write_to_a_ledger_row(ledger, sign_in):
    client = _client(SIGN_INS[sign_in]())
    for model, _ in ledger_admins():
        obj = model.objects.first()
        before = _row(model, obj.pk)
        count = model.objects.count()

        added = client.post(_url(model, "add"), _tampered(model, obj, ledger))
        assert added.status_code == 403, (model.__name__, added.status_code)

        if model not in AUDITED_THROUGH_A_SERVICE:
            changed = client.post(_url(model, "change", obj.pk), _tampered(model, obj, ledger))
            assert changed.status_code == 403, (model.__name__, changed.status_code)

        deleted = client.post(_url(model, "delete", obj.pk), {"post": "yes"})
        assert deleted.status_code == 403, (model.__name__, deleted.status_code)

        client.post(
            _url(model, "changelist"),
            {
                "action": "delete_selected",
                helpers.ACTION_CHECKBOX_NAME: [obj.pk],
                "index": 0,
                "post": "yes",
            },
        )

        assert model.objects.count() == count, model.__name__
        if model not in AUDITED_THROUGH_A_SERVICE:
            assert _row(model, obj.pk) == before, model.__name__


@pytest.mark.parametrize("sign_in", SIGN_INS)
def test_a_tools_owner_breaker_and_inbound_secret_cannot_be_changed_in_the_admin(ledger, sign_in):
    tool = ledger["tool"]
    before = _row(Tool, tool.pk)
    client = _client(SIGN_INS[sign_in]())
    events = Event.objects.count()
    response = client.post(_url(Tool, "change", tool.pk), _tampered(Tool, tool, ledger))
    assert response.status_code == 403
    assert _row(Tool, tool.pk) == before
    assert (
        decrypt(Tool.objects.get(pk=tool.pk).inbound_secret_encrypted)
        == (ledger["secrets"]["inbound secret"])
    )
    assert Event.objects.count() == events


@pytest.mark.parametrize("sign_in", SIGN_INS)
def test_a_runner_changed_in_the_admin_is_changed_through_the_service_with_its_event(
    ledger, sign_in
):
    runner = ledger["api"].runner
    response = _client(SIGN_INS[sign_in]()).post(
        _url(Runner, "change", runner.pk),
        {"owner": "", "restrict_tools": "on", "is_active": "on"},
    )
    assert response.status_code == 302
    assert Runner.objects.get(pk=runner.pk).restrict_tools is True
    event = Event.objects.filter(stream=f"runner:{runner.pk}").latest("seq")
    assert event.kind == "runner_updated"
    assert event.data["changes"] == {"restrict_tools": {"from": False, "to": True}}


# --- what the pages show -----------------------------------------------------------------


def test_the_change_page_of_a_tool_lists_no_operations(ledger):
    api = ledger["api"]
    run = api.run()
    others = [api.register(run, "refund")["id"] for _ in range(3)]
    client = _client(person(is_superuser=True, is_staff=True))
    html = client.get(_url(Tool, "change", "refund")).content.decode()
    assert "<select" not in html
    for op_id in [ledger["op"].pk, *others]:
        assert op_id not in html


def test_no_change_page_of_a_ledger_row_renders_a_drop_down(ledger):
    client = _client(person(is_superuser=True, is_staff=True))
    for model, _ in ledger_admins():
        response = client.get(_url(model, "change", model.objects.first().pk))
        assert response.status_code == 200, model.__name__
        assert "<select" not in response.content.decode(), model.__name__


def _admin_pages(client, ledger):
    """Every page the admin links a superuser to, from the index down one level: each
    model's list, add page and the change pages of its first rows; the tool's
    object-permission page."""
    pages = ["/admin/"]
    for model in admin.site._registry:
        pages += [_url(model, "changelist"), _url(model, "add")]
        pages += [_url(model, "change", obj.pk) for obj in model.objects.all()[:5]]
    pages.append(_url(Tool, "permissions", ledger["tool"].pk))
    for page in pages:
        response = client.get(page)
        assert response.status_code in (200, 403), (page, response.status_code)
        yield page, response.content.decode()


def test_no_admin_page_shows_a_secret(ledger):
    client = _client(person(is_superuser=True, is_staff=True))
    secrets = ledger["secrets"]
    assert all(len(value) >= 16 for value in secrets.values())
    for page, html in _admin_pages(client, ledger):
        for name, value in secrets.items():
            assert value not in html, f"{page} shows the {name}"


# --- what the admin still does, through services ---------------------------------------


def test_admin_pages_load_for_a_superuser(api):
    api.tool("refund", contract("irreversible"))
    client = _client(person(is_superuser=True, is_staff=True))
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
    client = _client(person(is_superuser=True, is_staff=True))
    response = client.post(
        "/admin/operations/toolversion/",
        {"action": "activate", helpers.ACTION_CHECKBOX_NAME: [weaker.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert Tool.objects.get(pk="refund").active_version_id == weaker.pk
    assert Event.objects.filter(stream="tool:refund", kind="contract_activated").exists()


def test_the_revoke_action_revokes_through_the_service_with_its_event(ledger):
    token = RunnerToken.objects.get(runner=ledger["api"].runner)
    client = _client(person(is_superuser=True, is_staff=True))
    response = client.post(
        _url(RunnerToken, "changelist"),
        {"action": "revoke", helpers.ACTION_CHECKBOX_NAME: [token.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert RunnerToken.objects.get(pk=token.pk).revoked_at is not None
    assert Event.objects.filter(stream=f"runner:{token.runner_id}", kind="token_revoked").exists()


def test_object_permissions_set_in_the_admin_are_events_on_the_tools_stream(ledger):
    """The permission pages of a tool stay (they are how a person is allowed to decide);
    each change goes through the service and is recorded."""
    tool = ledger["tool"]
    alice = person(username="alice")
    approvers = Group.objects.create(name="approvers")
    client = _client(person(is_superuser=True, is_staff=True))
    user_page = _url(Tool, "permissions_manage_user", tool.pk, alice.pk)
    group_page = _url(Tool, "permissions_manage_group", tool.pk, approvers.pk)

    assert (
        client.post(user_page, {"permissions": ["decide_tool", "reconcile_tool"]}).status_code
        == 302
    )
    assert client.post(user_page, {"permissions": ["reconcile_tool"]}).status_code == 302
    assert client.post(group_page, {"permissions": ["activate_tool"]}).status_code == 302

    assert get_perms(alice, tool) == ["reconcile_tool"]
    assert get_group_perms(approvers, tool).get() == "activate_tool"
    changes = Event.objects.filter(stream="tool:refund", kind="tool_permissions_changed")
    assert [event.data for event in changes.order_by("seq")] == [
        {"holder": "user:alice", "granted": ["decide_tool", "reconcile_tool"], "revoked": []},
        {"holder": "user:alice", "granted": [], "revoked": ["decide_tool"]},
        {"holder": "group:approvers", "granted": ["activate_tool"], "revoked": []},
    ]


def test_the_permission_pages_offer_only_what_people_hold_and_keep_a_runners_invoke(ledger):
    """``invoke_tool`` is a runner's, set by tool_invoker_set: the page neither offers it
    nor takes it away when it saves the service user's other permissions."""
    tool = ledger["tool"]
    runner = ledger["other runner"]
    owner = ledger["api"].runner
    services.tool_invoker_set(
        tool=tool, runner=runner, allow=True, actor=services.Actor.of_runner(owner)
    )
    client = _client(person(is_superuser=True, is_staff=True))
    page = _url(Tool, "permissions_manage_user", tool.pk, runner.service_user.pk)
    html = client.get(page).content.decode()
    assert 'value="decide_tool"' in html
    assert 'value="invoke_tool"' not in html
    assert 'value="change_tool"' not in html

    refused = client.post(page, {"permissions": ["invoke_tool", "change_tool"]})
    assert refused.status_code == 200  # the form answers what is wrong
    assert get_perms(runner.service_user, tool) == ["invoke_tool"]
    assert not Event.objects.filter(kind="tool_permissions_changed").exists()

    assert client.post(page, {"permissions": ["reconcile_tool"]}).status_code == 302
    assert sorted(get_perms(runner.service_user, tool)) == ["invoke_tool", "reconcile_tool"]
    change = Event.objects.get(kind="tool_permissions_changed")
    assert (change.data["granted"], change.data["revoked"]) == (["reconcile_tool"], [])


def test_staff_without_change_tool_cannot_set_permissions_on_a_tool(ledger):
    tool = ledger["tool"]
    alice = person(username="alice")
    staff = person(is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename="view_tool"))
    response = _client(staff).post(
        _url(Tool, "permissions_manage_user", tool.pk, alice.pk), {"permissions": ["decide_tool"]}
    )
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:index")
    assert get_perms(alice, tool) == []
    assert not Event.objects.filter(kind="tool_permissions_changed").exists()
