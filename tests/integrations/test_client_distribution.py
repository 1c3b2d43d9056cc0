"""The client stands alone: its wheel, built from client/pyproject.toml, installs into a
clean virtual environment and works there from a folder outside the checkout, with
httpx and rfc8785 and no Django."""

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

PROBE = """
import importlib.metadata as metadata, json, sys
import effectgate_client
from effectgate_client import EffectgateClient, Runner, Succeeded
from effectgate_client.integrations._common import derived_key
client = EffectgateClient("http://127.0.0.1:9", "egt_not_a_token")
runner = Runner(client)
client.close()
print(json.dumps({
    "file": effectgate_client.__file__,
    "version": [metadata.version("effectgate-client"), effectgate_client.__version__],
    "key": derived_key("mcp", "s", "t", {"amount_cents": 500.0}),
    "django": sorted(m for m in sys.modules if m.split(".")[0] == "django"),
    "requires": metadata.requires("effectgate-client"),
    "scripts": [e.name for e in metadata.entry_points(group="console_scripts")
                if e.value.startswith("effectgate_client")],
}))
"""


def test_the_client_wheel_installs_and_runs_without_the_server(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), "./client"],
        cwd=ROOT,
        check=True,
    )
    [wheel] = wheels.glob("effectgate_client-*.whl")
    # The version follows the API's (tests/client/test_version.py).
    assert wheel.name.startswith("effectgate_client-1."), wheel.name
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], check=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    done = subprocess.run(
        [python, "-c", PROBE], cwd=outside, check=True, capture_output=True, text=True
    )
    found = json.loads(done.stdout)
    assert found["file"].startswith(str(env_dir)), found["file"]
    assert found["django"] == []
    assert found["version"] == ["1.0.0", "1.0.0"]
    required = [r for r in found["requires"] if "extra ==" not in r]
    assert [r.split(">")[0].split("<")[0].strip() for r in required] == ["httpx", "rfc8785"]
    # Derived keys need the canonical JSON, installed with the client itself.
    assert found["key"].startswith("eg:")
    extras = {
        r.split("extra ==")[1].strip().strip("'\"") for r in found["requires"] if "extra" in r
    }
    assert extras == {"mcp", "openai-agents", "langgraph", "verify"}
    assert found["scripts"] == ["effectgate-mcp", "effectgate-verify"]
    # The server's packages are not in the client's wheel.
    listing = subprocess.run(
        [python, "-m", "pip", "show", "-f", "effectgate-client"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "effectgate_client/integrations/langgraph.py" in listing
    assert "operations/" not in listing
    assert "console/" not in listing
