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
    """``refund`` (the viewer decides on it) and ``wipe`` (nobody but superusers)."""
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    api.tool("wipe", contract("irreversible", approval={"mode": "never"}))
    result = World(api=api, visible_run=api.run("user:alice"), hidden_run=api.run("user:bob"))
    for index in range(3):
        result.visible.append(
            api.register(
                result.visible_run,
                "refund",
                {"payment_id": f"pay_{index}", "amount_cents": 100 + index},
                call_id=f"call-visible-{index}",
            )
        )
    op = api.register(result.hidden_run, "wipe", call_id="call-hidden")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout"})
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
