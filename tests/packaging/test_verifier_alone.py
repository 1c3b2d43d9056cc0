"""``effectgate-verify`` from the client's wheel alone: a new virtual environment with
``effectgate-client[verify]`` and nothing of the server (no Django, no Effectgate
server package) verifies a bundle this checkout exported, with the public key alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.security.test_evidence_bundle import _export, _lifecycle, _public_key, _seal

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], *, cwd: Path, env: dict[str, str], check: bool = True):
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    if check:
        assert done.returncode == 0, f"{' '.join(args)}: {done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def client_alone(tmp_path_factory):
    """(bin folder, environment) of a venv holding the client's wheel with [verify]."""
    base = tmp_path_factory.mktemp("verifier")
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "DATABASE_URL", "VIRTUAL_ENV"}
    }
    shutil.copytree(
        ROOT / "client",
        base / "client",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
    )
    _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(base / "dist"), str(base / "client")],
        cwd=base, env=env,
    )  # fmt: skip
    (wheel,) = (base / "dist").glob("effectgate_client-*.whl")
    environment = base / "venv"
    venv.EnvBuilder(with_pip=True).create(environment)
    bindir = environment / "bin"
    _run(
        [str(bindir / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[verify]"],
        cwd=base, env=env,
    )  # fmt: skip
    return bindir, env


def test_the_verifier_runs_without_the_server_or_django(client_alone, api, audit_key, tmp_path):
    bindir, env = client_alone
    for module in ("django", "operations", "console"):
        found = _run(
            [str(bindir / "python"), "-c", f"import {module}"], cwd=tmp_path, env=env, check=False
        )
        assert found.returncode != 0, f"{module} is importable beside the client alone"
    op = _lifecycle(api)
    _seal()
    bundle = tmp_path / "evidence.json"
    _export(op["id"], bundle)
    key = _public_key(tmp_path, audit_key)
    done = _run(
        [str(bindir / "effectgate-verify"), str(bundle), "--key", str(key)], cwd=tmp_path, env=env
    )
    assert f"Verified: the 7 events of operation {op['id']}" in done.stdout
    assert "user:ann.approver APPROVED" in done.stdout
