"""Production settings: `check --deploy` with zero warnings, HSTS, a Content-Security-
Policy without inline script, and pages that need nothing else."""

import os
import re
import secrets
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from tests.console.conftest import client_for

ROOT = Path(__file__).resolve().parents[2]


def _deploy_check(tmp_path, **overrides: str) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "EFFECTGATE_VAR_DIR": str(tmp_path / "var"),
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "effectgate.example.com",
        "CSRF_TRUSTED_ORIGINS": "https://effectgate.example.com",
        "SECURE_SSL_REDIRECT": "1",
        "BEHIND_TLS_PROXY": "1",
        "DATABASE_URL": "postgres://effectgate:secret@db.internal:5432/effectgate",
    }
    env.update(overrides)
    env = {key: value for key, value in env.items() if value is not None}
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_check_deploy_passes_with_zero_warnings(tmp_path):
    result = _deploy_check(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "warning"),
    [
        ({"DEBUG": "1"}, "security.W018"),
        ({"SECURE_SSL_REDIRECT": None}, "security.W008"),
        ({"SECRET_KEY": "short"}, "security.W009"),
        ({"SECURE_HSTS_SECONDS": "0"}, "security.W004"),
    ],
)
def test_check_deploy_catches_what_production_must_set(tmp_path, overrides, warning):
    result = _deploy_check(tmp_path, **overrides)
    assert result.returncode != 0
    assert warning in result.stdout + result.stderr


def test_https_responses_carry_hsts(db):
    response = Client().get("/login/", secure=True)
    assert response["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"


def _directives(response) -> dict[str, list[str]]:
    policy = response["Content-Security-Policy"]
    parsed = {}
    for part in policy.split(";"):
        name, *values = part.split()
        parsed[name] = values
    return parsed


class _InlineFinder(HTMLParser):
    """Finds what a strict CSP would block: inline scripts, event handler attributes,
    javascript: URLs, <style> elements and style attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        names = dict(attrs)
        if tag == "script" and not names.get("src"):
            self._in_script = True
        if tag == "style":
            self.found.append("<style> element")
        for name, value in attrs:
            if name.startswith("on"):
                self.found.append(f"{tag} {name}=")
            if name == "style":
                self.found.append(f"{tag} style=")
            if name in {"href", "src", "action"} and (value or "").strip().startswith(
                "javascript:"
            ):
                self.found.append(f"{tag} {name}=javascript:")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script and data.strip():
            self.found.append(f"inline script: {data.strip()[:60]}")


def _console_pages(world) -> list[str]:
    op = world.visible[0]["id"]
    return [
        "/",
        "/reconciliation/",
        "/operations/",
        f"/operations/{op}/",
        "/runs/",
        f"/runs/{world.visible_run}/",
        "/tools/",
        "/tools/refund/",
        "/audit/",
        "/dashboard/",
        "/runners/",
        f"/runners/{world.api.runner.id}/",
        "/account/",
        "/account/verify",
        "/admin/",
        "/admin/auth/user/",
        "/admin/operations/operation/",
        "/api/docs/",
    ]


def test_every_page_has_a_strict_policy_and_nothing_inline(world, superuser):
    client = client_for(superuser)
    pages = [*_console_pages(world), "/login/"]
    for path in pages:
        response = client.get(path)
        assert response.status_code == 200, path
        csp = _directives(response)
        assert csp["script-src"] == ["'self'"], path
        assert csp["style-src"] == ["'self'"], path
        assert csp["default-src"] == ["'self'"], path
        assert csp["object-src"] == ["'none'"], path
        assert csp["frame-ancestors"] == ["'none'"], path
        assert csp["base-uri"] == ["'none'"], path
        finder = _InlineFinder()
        finder.feed(response.content.decode())
        assert not finder.found, (path, finder.found)


def test_the_api_docs_script_is_a_separate_same_origin_file(db):
    page = Client().get("/api/docs/").content.decode()
    scripts = re.findall(r'<script src="([^"]+)"', page)
    assert len(scripts) == 3
    assert all(src.startswith("/") for src in scripts)
    init = Client().get(scripts[-1])
    assert init.status_code == 200
    assert init["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle" in init.content.decode()


def test_oversize_console_posts_are_refused(db, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    user = get_user_model().objects.create_user("big", password="pw-for-tests-1")
    client = client_for(user)
    response = client.post("/account/verify", {"code": "1" * 5000})
    assert response.status_code == 400
