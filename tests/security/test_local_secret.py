"""The secret key generated for local mode is trusted only when no other local user could
have written or can read it (a shared folder must not let someone plant the signing key)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LOAD = "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)"


def _load_settings(var_dir: Path) -> subprocess.CompletedProcess:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"SECRET_KEY", "DJANGO_SETTINGS_MODULE"}
    }
    env |= {"EFFECTGATE_VAR_DIR": str(var_dir), "DJANGO_SETTINGS_MODULE": "console.settings"}
    return subprocess.run(
        [sys.executable, "-c", LOAD], cwd=ROOT, env=env, capture_output=True, text=True,
        check=False, timeout=60,
    )  # fmt: skip


def test_a_generated_key_is_private_and_kept(tmp_path):
    first = _load_settings(tmp_path)
    assert first.returncode == 0, first.stderr
    key = tmp_path / "secret_key"
    assert key.stat().st_mode & 0o777 == 0o600
    assert _load_settings(tmp_path).stdout == first.stdout, "the same key on the next start"


@pytest.mark.parametrize("mode", [0o644, 0o660, 0o604])
def test_a_key_others_can_read_or_write_is_refused(tmp_path, mode):
    key = tmp_path / "secret_key"
    key.write_text("planted-by-someone-else")
    key.chmod(mode)
    loaded = _load_settings(tmp_path)
    assert loaded.returncode != 0
    assert "readable by nobody else" in loaded.stderr
    assert "planted-by-someone-else" not in loaded.stdout + loaded.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give the file to another user")
def test_a_key_another_user_owns_is_refused(tmp_path):
    key = tmp_path / "secret_key"
    key.write_text("planted-by-someone-else")
    key.chmod(0o600)
    os.chown(key, 65534, 65534)  # nobody
    loaded = _load_settings(tmp_path)
    assert loaded.returncode != 0
    assert "must belong to this user" in loaded.stderr
