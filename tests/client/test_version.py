"""The client's version follows the API's: its major number is the API version of the
OpenAPI document the server serves (``info.version``), the ``v1`` of ``/api/v1`` the
client calls. A breaking change of the API is a new major version of both."""

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from django.test import Client

import effectgate_client
from effectgate_client.client import API_PREFIX

ROOT = Path(__file__).resolve().parents[2]


def _distribution_version() -> str:
    with (ROOT / "client" / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)["project"]["version"]


def test_the_package_and_its_distribution_say_the_same_version():
    assert effectgate_client.__version__ == _distribution_version()
    # What pip installed from client/pyproject.toml (make reinstalls when it changes).
    assert importlib.metadata.version("effectgate-client") == effectgate_client.__version__


@pytest.mark.django_db
def test_the_major_version_is_the_api_version_the_server_serves():
    response = Client().get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    api_version = response.json()["info"]["version"]
    assert api_version == "1"
    semantic = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", effectgate_client.__version__)
    assert semantic, effectgate_client.__version__
    assert semantic[1] == api_version
    assert f"/api/v{api_version}" == API_PREFIX
    assert all(path.startswith(API_PREFIX + "/") for path in response.json()["paths"])
