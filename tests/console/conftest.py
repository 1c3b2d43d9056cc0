"""A small world for the console's pages: two tools, one visible to the person."""

from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from guardian.shortcuts import assign_perm

from operations.models import Tool
from tests.approvals.conftest import person
from tests.conftest import Api, contract
from tests.support.world import Direct


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@dataclass
class World:
    api: Api
    visible_run: str = ""
    hidden_run: str = ""
    visible: list[dict[str, Any]] = field(default_factory=list)  # operations of "refund"
    hidden: list[dict[str, Any]] = field(default_factory=list)  # operations of "wipe"


@pytest.fixture
def world(api) -> World:
    """``refund`` (the viewer decides on it) and ``wipe`` (nobody but superusers), made
    through the services: the tests are about the pages (tests/support/world.py)."""
    direct = Direct(api)
    direct.tool("refund", contract("irreversible", approval={"mode": "never"}))
    direct.tool("wipe", contract("irreversible", approval={"mode": "never"}))
    result = World(api=api, visible_run=direct.run("user:alice"), hidden_run=direct.run("user:bob"))
    for index in range(3):
        result.visible.append(
            direct.register(
                result.visible_run,
                "refund",
                {"payment_id": f"pay_{index}", "amount_cents": 100 + index},
                call_id=f"call-visible-{index}",
            )
        )
    op = direct.register(result.hidden_run, "wipe", call_id="call-hidden")
    direct.claim(op["id"])
    direct.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout"})
    result.hidden.append(op)
    return result


@pytest.fixture
def viewer(world):
    user = person(username="viewer")
    assign_perm("operations.decide_tool", user, Tool.objects.get(pk="refund"))
    return user


@pytest.fixture
def superuser(db):
    return get_user_model().objects.create_superuser("root", password="pw-for-tests-1")
