"""Runner tokens: format, hashing, scopes on every view, expiry, revocation, last use,
and their management by admins in the console."""

import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from operations import services
from operations.models import Event, RunnerToken
from tests.conftest import contract

TOKEN_FORMAT = re.compile(r"^egr_[A-Za-z0-9_-]{43}$")


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _token(api, scopes, **kwargs) -> str:
    return services.token_create(
        runner=api.runner, actor=services.Actor.system("test"), scopes=scopes, **kwargs
    )


def test_tokens_are_prefixed_random_and_stored_only_as_a_hash(api):
    assert TOKEN_FORMAT.match(api.token)  # 32 random bytes: 256 bits
    stored = RunnerToken.objects.get(runner=api.runner)
    assert stored.prefix == api.token[:12]
    assert api.token not in {stored.token_hash, stored.prefix, str(stored.scopes)}
    assert len(stored.token_hash) == 64
    assert all(api.token not in str(event.data) for event in Event.objects.all())
    others = {services.token_create(runner=api.runner, actor=services.Actor.system("t"))}
    others |= {services.token_create(runner=api.runner, actor=services.Actor.system("t"))}
    assert len(others | {api.token}) == 3


WRITE_FOR_USE_TOOLS = [
    ("post", "/api/v1/runs", {"principal": "user:x"}),
    ("post", "/api/v1/operations", {"run": "run_x", "tool": "t", "operation_key": "k"}),
    ("post", "/api/v1/operations/op_x/attempts", {}),
    ("post", "/api/v1/operations/op_x/attempts/1/outcome", {"kind": "succeeded"}),
    ("post", "/api/v1/operations/op_x/attempts/1/heartbeat", {}),
    ("post", "/api/v1/operations/op_x/reconciliations", {"result": "committed"}),
    ("post", "/api/v1/operations/op_x/compensations", {"result": "committed"}),
    ("post", "/api/v1/runs/run_x/cancel", {}),
    ("post", "/api/v1/webhook-endpoints", {"url": "https://example.com/h", "events": ["*"]}),
]
READ_FOR_USE_TOOLS = [
    "/api/v1/operations",
    "/api/v1/operations/op_x",
    "/api/v1/operations/op_x/events",
    "/api/v1/operations/op_x/tool-result",
    "/api/v1/runs/run_x",
    "/api/v1/approvals/apr_x",
    "/api/v1/webhook-endpoints",
    "/api/v1/webhook-endpoints/whe_x",
]


@pytest.mark.parametrize(("method", "path", "body"), WRITE_FOR_USE_TOOLS)
def test_a_contracts_only_token_cannot_use_tools(api, method, path, body):
    client = _client(_token(api, [RunnerToken.SCOPE_REGISTER_CONTRACTS]))
    response = getattr(client, method)(path, body, format="json")
    assert response.status_code == 403, response.content
    assert response.json()["code"] == "forbidden"


@pytest.mark.parametrize("path", READ_FOR_USE_TOOLS)
def test_a_contracts_only_token_reads_no_operations_runs_or_endpoints(api, path):
    client = _client(_token(api, [RunnerToken.SCOPE_REGISTER_CONTRACTS]))
    response = client.get(path)
    assert response.status_code == 403, response.content
    assert response.json()["code"] == "forbidden"


def test_a_tools_only_token_reads_contracts_but_cannot_register_them(api):
    api.tool("t")
    client = _client(_token(api, [RunnerToken.SCOPE_USE_TOOLS]))
    assert client.get("/api/v1/tools").status_code == 200
    assert client.get("/api/v1/tools/t").status_code == 200
    response = client.put("/api/v1/tools/t", contract("read_only"), format="json")
    assert response.status_code == 403
    run = client.post("/api/v1/runs", {"principal": "user:x"}, format="json")
    assert run.status_code == 201


def test_a_contracts_only_token_reads_and_registers_contracts(api):
    client = _client(_token(api, [RunnerToken.SCOPE_REGISTER_CONTRACTS]))
    assert client.put("/api/v1/tools/t", contract(), format="json").status_code == 201
    assert client.get("/api/v1/tools").status_code == 200
    assert client.get("/api/v1/tools/t").status_code == 200


def test_an_expired_token_is_refused(api):
    token = _token(api, RunnerToken.ALL_SCOPES, expires_at=timezone.now() + timedelta(hours=1))
    client = _client(token)
    assert client.get("/api/v1/tools").status_code == 200
    with time_machine.travel(timezone.now() + timedelta(hours=1, seconds=1)):
        response = client.get("/api/v1/tools")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


def test_a_revoked_token_is_refused_at_once_and_the_revocation_audited(api):
    token = _token(api, RunnerToken.ALL_SCOPES)
    client = _client(token)
    assert client.get("/api/v1/tools").status_code == 200
    record = RunnerToken.objects.get(prefix=token[:12])
    services.token_revoke(token=record, actor=services.Actor.system("test"))
    assert client.get("/api/v1/tools").status_code == 401
    assert _client(api.token).get("/api/v1/tools").status_code == 200
    event = Event.objects.get(stream=f"runner:{api.runner.id}", kind="token_revoked")
    assert event.data["prefix"] == token[:12]


def test_an_inactive_runner_is_refused(api):
    api.runner.is_active = False
    api.runner.save()
    assert api.get("/api/v1/tools").status_code == 401


def test_last_use_is_recorded_at_most_once_a_minute(api):
    record = RunnerToken.objects.get(runner=api.runner)
    assert record.last_used_at is None
    start = timezone.now()
    with time_machine.travel(start, tick=False):
        api.get("/api/v1/tools")
        record.refresh_from_db()
        assert record.last_used_at == start
    with time_machine.travel(start + timedelta(seconds=30), tick=False):
        api.get("/api/v1/tools")
        record.refresh_from_db()
        assert record.last_used_at == start
    with time_machine.travel(start + timedelta(seconds=61), tick=False):
        api.get("/api/v1/tools")
        record.refresh_from_db()
        assert record.last_used_at == start + timedelta(seconds=61)


def test_malformed_authorization_headers_are_401(api):
    for header in ("Bearer", "Bearer ", "Basic Zm9vOmJhcg==", "Bearer egr_" + "x" * 500, "Token x"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        response = client.get("/api/v1/operations")
        assert response.status_code == 401, header
        assert response.json()["code"] == "not_authenticated"


# --- the console ------------------------------------------------------------------------


@pytest.fixture
def admin_client(db):
    user = get_user_model().objects.create_user("tokenadmin", password="pw-for-tests-1")
    user.user_permissions.add(Permission.objects.get(codename="change_runner"))
    client = Client()
    client.force_login(user)
    client.user = user
    return client


@pytest.fixture
def plain_client(db):
    user = get_user_model().objects.create_user("plain", password="pw-for-tests-1")
    client = Client()
    client.force_login(user)
    return client


def test_people_without_the_permission_see_no_runner_pages(api, plain_client):
    token = RunnerToken.objects.get(runner=api.runner)
    for path in ("/runners/", f"/runners/{api.runner.id}/"):
        assert plain_client.get(path).status_code == 403
    response = plain_client.post(f"/runners/{api.runner.id}/tokens", {"scopes": ["use_tools"]})
    assert response.status_code == 403
    revoke = plain_client.post(f"/runners/{api.runner.id}/tokens/{token.id}/revoke")
    assert revoke.status_code == 403
    assert RunnerToken.objects.filter(runner=api.runner).count() == 1
    assert RunnerToken.objects.get(pk=token.pk).revoked_at is None
    assert "/runners/" not in plain_client.get("/").content.decode()


def test_admins_list_runners_and_tokens(api, admin_client):
    api.get("/api/v1/tools")
    listing = admin_client.get("/runners/")
    assert listing.status_code == 200
    page = listing.content.decode()
    assert api.runner.name in page
    assert 'href="/runners/"' in admin_client.get("/").content.decode()
    detail = admin_client.get(f"/runners/{api.runner.id}/").content.decode()
    token = RunnerToken.objects.get(runner=api.runner)
    assert f"{token.prefix}…" in detail
    assert "use_tools" in detail
    assert "register_contracts" in detail
    assert api.token not in detail
    assert token.token_hash not in detail


def test_an_admin_issues_a_scoped_expiring_token_shown_once(api, admin_client):
    response = admin_client.post(
        f"/runners/{api.runner.id}/tokens",
        {"label": "deploys", "scopes": ["register_contracts"], "expires_in_days": "7"},
    )
    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
    issued = re.search(r"egr_[A-Za-z0-9_-]{43}", response.content.decode()).group(0)
    record = RunnerToken.objects.get(prefix=issued[:12])
    assert record.scopes == ["register_contracts"]
    assert record.label == "deploys"
    assert timedelta(days=6, hours=23) < record.expires_at - timezone.now() <= timedelta(days=7)
    # Usable with its scope only.
    client = _client(issued)
    assert client.put("/api/v1/tools/t", contract(), format="json").status_code == 201
    assert client.get("/api/v1/operations").status_code == 403
    # Never shown again: the runner page has only its prefix.
    again = admin_client.get(f"/runners/{api.runner.id}/").content.decode()
    assert issued not in again
    assert f"{issued[:12]}…" in again
    assert issued not in str(admin_client.session.items())
    event = Event.objects.get(
        stream=f"runner:{api.runner.id}", kind="token_created", actor="user:tokenadmin"
    )
    assert event.data["scopes"] == ["register_contracts"]


def test_a_token_needs_a_scope(api, admin_client):
    response = admin_client.post(f"/runners/{api.runner.id}/tokens", {"label": "x"})
    assert response.status_code == 400
    assert "Choose at least one scope." in response.content.decode()
    assert RunnerToken.objects.filter(runner=api.runner).count() == 1


def test_an_admin_revokes_a_token(api, admin_client):
    token = RunnerToken.objects.get(runner=api.runner)
    response = admin_client.post(f"/runners/{api.runner.id}/tokens/{token.id}/revoke")
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert api.get("/api/v1/tools").status_code == 401
    page = admin_client.get(response["Location"]).content.decode()
    assert "revoked" in page
    event = Event.objects.get(stream=f"runner:{api.runner.id}", kind="token_revoked")
    assert event.actor == "user:tokenadmin"


def test_superusers_manage_tokens_too(api):
    root = get_user_model().objects.create_superuser("root", password="pw-for-tests-1")
    client = Client()
    client.force_login(root)
    assert client.get(f"/runners/{api.runner.id}/").status_code == 200


def test_the_service_refuses_people_without_the_permission(api):
    person = get_user_model().objects.create_user("nobody")
    from approvals.errors import PermissionRefused

    with pytest.raises(PermissionRefused):
        services.token_issue_by_user(runner=api.runner, user=person, scopes=["use_tools"])
    with pytest.raises(PermissionRefused):
        services.token_revoke_by_user(token=RunnerToken.objects.get(), user=person)
