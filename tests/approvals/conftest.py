import itertools

import pytest
from django.contrib.auth import get_user_model
from guardian.shortcuts import assign_perm

from operations.models import Tool

_n = itertools.count(1)


def person(*, decide_on: str | None = None, **fields):
    user = get_user_model().objects.create_user(
        username=fields.pop("username", f"person{next(_n)}"), password="pw-for-tests-1", **fields
    )
    if decide_on:
        assign_perm("operations.decide_tool", user, Tool.objects.get(pk=decide_on))
    return user


@pytest.fixture
def make_person(db):
    return person
