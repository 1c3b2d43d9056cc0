"""The TypeScript client's folder, and running node and npm in it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "clients" / "typescript"
BIN = PACKAGE / "node_modules" / ".bin"


def installed() -> None:
    """Fail, saying what to run, when node or the package's npm dependencies are missing
    (``make test`` installs them: ``npm ci`` in clients/typescript)."""
    assert shutil.which("node"), "node is not installed (make test installs nodejs)"
    assert (BIN / "tsx").exists(), (
        "clients/typescript has no node_modules: run make test or npm ci there"
    )


def run(
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path = PACKAGE,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """A command in ``cwd`` with the package's tools on PATH; its output is printed."""
    full_env = {
        **{key: value for key, value in os.environ.items() if key != "OPENAI_API_KEY"},
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "NO_COLOR": "1",
        **(env or {}),
    }
    done = subprocess.run(
        command, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
    )
    print(
        f"\n$ {' '.join(command)} (exit {done.returncode})\n{(done.stdout + done.stderr)[-6000:]}"
    )
    return done


def package_json() -> dict[str, Any]:
    return json.loads((PACKAGE / "package.json").read_text("utf-8"))


def source_workspace(folder: Path) -> None:
    """Make ``folder`` a place where TypeScript examples run with tsx as in a project that
    installed ``@effectgate/client``: the package's own node_modules (its dependencies
    and the frameworks of the guards), and the import name mapped to its sources (tsx
    reads ``paths``), so an example runs on this checkout without a build."""
    installed()
    (folder / "package.json").write_text(json.dumps({"type": "module", "private": True}))
    (folder / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "module": "NodeNext",
                    "moduleResolution": "NodeNext",
                    "target": "ES2022",
                    "strict": True,
                    "paths": {
                        "@effectgate/client": [str(PACKAGE / "src" / "index.ts")],
                        "@effectgate/client/*": [str(PACKAGE / "src" / "*.ts")],
                    },
                }
            }
        )
    )
    link = folder / "node_modules"
    if not link.exists():
        link.symlink_to(PACKAGE / "node_modules", target_is_directory=True)
