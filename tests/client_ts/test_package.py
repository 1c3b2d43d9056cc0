"""Packaging: `npm pack` makes a tarball with the built package and its types, and the
quick start of docs/client-typescript.md (with the package's own demo provider,
``@effectgate/client/demo``) runs from it in an empty project.

Installing takes the tarball's dependencies from npm's cache when it has them
(``--prefer-offline``): `make test` filled it with `npm ci`.
"""

from __future__ import annotations

import json
import re

import pytest

from operations.models import Operation
from tests.client_ts.support import BIN, PACKAGE, installed, package_json, run
from tests.conftest import make_runner
from tests.docs.blocks import DOCS, fenced_blocks

pytestmark = pytest.mark.slow


def _quick_start() -> str:
    path = DOCS / "client-typescript.md"
    text = path.read_text("utf-8")
    section = text.split("## Quick start", 1)[1]
    block = next(block for block in fenced_blocks(section, path) if block.kind == "ts")
    return block.text


@pytest.fixture(scope="module")
def tarball(tmp_path_factory):
    installed()
    folder = tmp_path_factory.mktemp("pack")
    done = run(["npm", "pack", "--json", "--pack-destination", str(folder)])
    assert done.returncode == 0
    # The JSON follows whatever the prepack build printed.
    [packed] = json.loads(done.stdout[done.stdout.index("[") :])
    return folder / packed["filename"], {entry["path"] for entry in packed["files"]}


def test_the_tarball_holds_the_built_package_and_its_types(tarball):
    path, files = tarball
    assert path.name == f"effectgate-client-{package_json()['version']}.tgz"
    assert {"package.json", "dist/index.js", "dist/index.d.ts", "dist/schema.d.ts"} <= files
    # Every entry point whose source exists is built, with its declarations.
    for name, target in package_json()["exports"].items():
        if not isinstance(target, dict):
            continue
        stem = target["import"].removeprefix("./dist/").removesuffix(".js")
        if (PACKAGE / "src" / f"{stem}.ts").exists():
            assert {f"dist/{stem}.js", f"dist/{stem}.d.ts"} <= files, name
    assert not [file for file in files if file.startswith(("test/", "node_modules/"))]


@pytest.mark.django_db(transaction=True)
def test_the_quick_start_runs_from_the_tarball_in_an_empty_project(tarball, live_server, tmp_path):
    path, _files = tarball
    project = tmp_path / "agent"
    project.mkdir()
    (project / "package.json").write_text(
        json.dumps({"name": "agent", "private": True, "type": "module"})
    )
    install = ["npm", "install", "--prefer-offline", "--no-audit", "--no-fund"]
    assert run([*install, str(path), "@types/node@^20"], cwd=project).returncode == 0
    installed_package = json.loads(
        (project / "node_modules" / "@effectgate" / "client" / "package.json").read_text()
    )
    assert installed_package["version"] == package_json()["version"]

    api = make_runner()
    # The quick start starts its own provider: only the server and the token are filled in.
    source = _quick_start().replace("http://127.0.0.1:8000", live_server.url)
    (project / "refund.ts").write_text(source.replace("egr_...", api.token))
    # The installed declarations type the quick start under strict settings (its contract
    # literal, nested JSON schema and all, included).
    typecheck = [
        str(BIN / "tsc"),
        "--noEmit",
        "--strict",
        "--module",
        "nodenext",
        "--moduleResolution",
        "nodenext",
        "--target",
        "es2022",
        "--types",
        "node",
        "refund.ts",
    ]
    assert run(typecheck, cwd=project).returncode == 0
    first = run([str(BIN / "tsx"), "refund.ts"], cwd=project)
    again = run([str(BIN / "tsx"), "refund.ts"], cwd=project)

    assert first.returncode == 0
    assert again.returncode == 0
    envelope = json.loads(first.stdout)
    assert envelope["status"] == "succeeded"
    assert re.fullmatch(r"op_\w+", envelope["logical_operation_id"])
    assert envelope["result"]["id"] == "re_0000001"
    # Run again, it answers the same, and the refund was sent once: one attempt, the
    # first run's (the second run's fresh provider was never called).
    assert json.loads(again.stdout) == envelope
    op = Operation.objects.get(id=envelope["logical_operation_id"], runner=api.runner)
    assert (op.status, op.downstream_id) == ("succeeded", "re_0000001")
    assert [attempt.status for attempt in op.attempt_set.all()] == ["succeeded"]
