"""The server's wheel runs outside the checkout.

Builds the wheel from a copy of the sources, installs it into a new virtual environment
and runs it from a folder that is not the checkout: the ``effectgate`` console script
(migrate, runner create, collectstatic, runserver), gunicorn serving ``console.wsgi``, the
console's templates and static files and the API, all from the installed package; and the
client's own wheel installed beside it, talking to that server.

SQLite on purpose: what is under test is the package, and the embedded default is what a
first ``pip install`` runs on; it also shows where an installed Effectgate keeps its local
state: one folder per user (``$XDG_DATA_HOME/effectgate``), not site-packages, not the
working folder.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import venv
from pathlib import Path

import httpx
import pytest

from tests.support.net import free_port, wait_for_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["pyproject.toml", "README.md", "console", "operations", "approvals"]


def run(args: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    )
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(bin folder, working folder, environment) of the wheel installed in a new venv."""
    base = tmp_path_factory.mktemp("wheel")
    # A copy, so that the build leaves no build/ or egg-info behind in the checkout and
    # nothing outside SOURCES (tests, bench, manage.py) can reach the wheel.
    source = base / "source"
    for name in SOURCES:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(
                origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "build")
            )
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(origin, source / name)
    dist = base / "dist"
    # The environment of the test run, minus anything that would point back at the checkout.
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH", "DATABASE_URL", "VIRTUAL_ENV"}
        and not key.startswith("EFFECTGATE_")
    }
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(dist), str(source)],
        cwd=base, env=env,
    )  # fmt: skip
    (wheel,) = dist.glob("effectgate-0*.whl")
    # The client is its own distribution: built the same way, installed beside the server.
    shutil.copytree(
        ROOT / "client",
        base / "client",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"),
    )
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(dist), str(base / "client")],
        cwd=base, env=env,
    )  # fmt: skip
    (client_wheel,) = dist.glob("effectgate_client-*.whl")
    environment = base / "venv"
    venv.EnvBuilder(with_pip=True).create(environment)
    bindir = environment / "bin"
    run(
        [str(bindir / "python"), "-m", "pip", "install", "--quiet", str(wheel), str(client_wheel)],
        cwd=base, env=env,
    )  # fmt: skip
    work = base / "somewhere"
    work.mkdir()
    env["XDG_DATA_HOME"] = str(base / "data")
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    return bindir, work, env, (wheel, client_wheel)


def test_the_wheel_carries_the_console_and_not_the_tests(installed):
    *_, (wheel, client_wheel) = installed
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(
        ["git", "ls-files", "console/templates", "console/static"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    tracked = [name for name in tracked if not Path(name).name.startswith(".")]
    assert len(tracked) > 20
    for needed in [*tracked, "console/wsgi.py", "operations/migrations/0001_initial.py"]:
        assert needed in names, f"{needed} is not in {wheel.name}"
    assert not [name for name in names if name.startswith(("tests/", "bench/", "client/"))]
    assert not [name for name in names if name.startswith("effectgate_client/")], (
        "the client is its own distribution, effectgate-client"
    )
    client_names = set(zipfile.ZipFile(client_wheel).namelist())
    assert "effectgate_client/py.typed" in client_names
    shared = {name for name in names & client_names if ".dist-info/" not in name}
    assert not shared, f"both wheels install {shared}"
    entry_points = next(name for name in names if name.endswith("entry_points.txt"))
    assert "effectgate = console.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_installed_package_runs_from_any_folder(installed):
    bindir, work, env, _ = installed
    where = run(
        [str(bindir / "python"), "-c", "import console, operations; print(console.__file__)"],
        cwd=work, env=env,
    )  # fmt: skip
    assert Path(where.strip()).is_relative_to(bindir.parent), where
    assert not Path(where.strip()).is_relative_to(ROOT), where

    commands = run([str(bindir / "effectgate"), "help"], cwd=work, env=env)
    for command in ["migrate", "runserver", "runner", "sweep", "reconcile", "audit", "archive"]:
        assert re.search(rf"^\s+{command}$", commands, re.MULTILINE), command

    run([str(bindir / "effectgate"), "migrate", "--noinput", "-v0"], cwd=work, env=env)
    state = Path(env["XDG_DATA_HOME"]) / "effectgate"
    assert (state / "effectgate.sqlite3").is_file(), "the database belongs in the user's folder"
    assert (state / "secret_key").stat().st_mode & 0o777 == 0o600
    assert not (work / "var").exists(), "nothing is left in the working folder"
    assert not list(bindir.parent.glob("lib/python*/site-packages/var"))
    created = run([str(bindir / "effectgate"), "runner", "create", "wheelbot"], cwd=work, env=env)
    token = re.search(r"egr_\S+", created).group(0)
    run([str(bindir / "effectgate"), "collectstatic", "--noinput", "-v0"], cwd=work, env=env)

    # gunicorn serves console.wsgi from the installed package.
    port = free_port()
    log = (work / "gunicorn.log").open("w")
    gunicorn = subprocess.Popen(
        [str(bindir / "gunicorn"), "--bind", f"127.0.0.1:{port}", "console.wsgi"],
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        wait_for_port(port, timeout_s=30, process=gunicorn)
        base = f"http://127.0.0.1:{port}"
        login = httpx.get(f"{base}/login/")
        assert login.status_code == 200, login.text[:2000]
        assert 'name="password"' in login.text
        stylesheet = re.search(r'href="(/static/css/console\.[0-9a-f]+\.css)"', login.text)
        assert stylesheet, "the login page links no versioned stylesheet"
        css = httpx.get(base + stylesheet.group(1))
        assert css.status_code == 200
        assert css.headers["content-type"].startswith("text/css")
        source = (ROOT / "console/static/css/console.css").read_bytes()
        assert css.content[:400] == source[:400], "the console's own stylesheet"
        assert httpx.get(f"{base}/api/docs/").status_code == 200

        auth = {"Authorization": f"Bearer {token}"}
        put = httpx.put(
            f"{base}/api/v1/tools/wheel_refund",
            headers=auth,
            json={"effect_class": "idempotent", "input_schema": {"type": "object"}},
        )
        assert put.status_code == 201, put.text
        assert httpx.get(f"{base}/api/v1/tools/wheel_refund", headers=auth).json()["version"] == 1
        # The installed client against the installed server, from the same folder.
        script = (
            "import sys\n"
            "from effectgate_client import EffectgateClient\n"
            "client = EffectgateClient(sys.argv[1], sys.argv[2])\n"
            "run = client.create_run(principal='user:wheel')\n"
            "print(client.get_tool('wheel_refund')['version'], run['id'][:4])\n"
        )
        answer = run([str(bindir / "python"), "-c", script, base, token], cwd=work, env=env)
        assert answer.split() == ["1", "run_"], answer
    finally:
        gunicorn.send_signal(signal.SIGTERM)
        gunicorn.wait(timeout=30)
        log.close()
    assert "Traceback" not in (work / "gunicorn.log").read_text()

    # effectgate runserver, too (Django's server, static files through WhiteNoise).
    port = free_port()
    server = subprocess.Popen(
        [str(bindir / "effectgate"), "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for_port(port, timeout_s=30, process=server)
        answer = httpx.get(f"http://127.0.0.1:{port}/api/v1/tools", headers=auth)
        assert answer.status_code == 200, answer.text
        assert [tool["name"] for tool in answer.json()["results"]] == ["wheel_refund"]
        assert httpx.get(f"http://127.0.0.1:{port}/login/").status_code == 200
    finally:
        server.send_signal(signal.SIGINT)
        output, _ = server.communicate(timeout=30)
    assert "Traceback" not in output, output
