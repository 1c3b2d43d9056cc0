"""The circuit breaker per tool, on a clock the test controls."""

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals.errors import PermissionRefused
from operations import services
from operations.models import Event, Tool
from tests.approvals.conftest import person
from tests.conftest import contract

BREAKER = {"failure_codes": ["upstream_5xx", "timeout_unknown"], "threshold": 3, "cooldown_s": 60}


@pytest.fixture
def tool(api):
    body = contract("idempotent", breaker=BREAKER)
    body["retry"]["max_attempts"] = 10
    api.tool("pay", body)
    return api.run()


def _fail(api, run, code="upstream_5xx"):
    op = api.register(run, "pay")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "failed", "code": code})
    return op


def _state():
    tool = Tool.objects.get(pk="pay")
    return tool.breaker_state, tool.breaker_failures


def test_open_refuse_half_open_close(api, tool):
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        _fail(api, tool)
        _fail(api, tool)
        assert _state() == ("closed", 2)
        _fail(api, tool)
        assert _state()[0] == "open"

        waiting = api.register(tool, "pay")
        refusal = api.claim(waiting["id"], expect=409)
        assert refusal["code"] == "retry_later"
        assert refusal["breaker"] == "open"
        assert 59_000 < refusal["retry_after_ms"] <= 60_001

        clock.move_to(start + timedelta(seconds=61))
        probe = api.claim(waiting["id"])  # the one probe let through
        assert _state()[0] == "half_open"
        other = api.register(tool, "pay")
        refusal = api.claim(other["id"], expect=409)
        assert (refusal["code"], refusal["breaker"]) == ("retry_later", "half_open")

        api.outcome(waiting["id"], probe["attempt"], {"kind": "succeeded"})
        assert _state() == ("closed", 0)
        api.claim(other["id"])
    kinds = list(
        Event.objects.filter(stream="tool:pay", kind__startswith="breaker").values_list(
            "kind", flat=True
        )
    )
    assert kinds == ["breaker_opened", "breaker_half_open", "breaker_closed"]


def test_a_failed_probe_reopens_for_another_cool_down(api, tool):
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        for _ in range(3):
            _fail(api, tool)
        clock.move_to(start + timedelta(seconds=61))
        probe = api.register(tool, "pay")
        api.claim(probe["id"])
        api.outcome(probe["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
        assert _state()[0] == "open"
        assert Tool.objects.get(pk="pay").breaker_opened_at == start + timedelta(seconds=61)
        again = api.register(tool, "pay")
        assert api.claim(again["id"], expect=409)["code"] == "retry_later"


def test_a_success_resets_the_count_of_consecutive_failures(api, tool):
    _fail(api, tool)
    _fail(api, tool)
    ok = api.register(tool, "pay")
    api.claim(ok["id"])
    api.outcome(ok["id"], 1, {"kind": "succeeded"})
    _fail(api, tool)
    assert _state() == ("closed", 1)


def test_codes_the_contract_does_not_name_do_not_count(api, tool):
    for _ in range(5):
        _fail(api, tool, code="invalid_arguments")
    assert _state() == ("closed", 0)


def test_a_person_opens_and_closes_the_breaker(api, tool):
    operator = person()
    with pytest.raises(PermissionRefused):
        services.tool_breaker_set(tool=Tool.objects.get(pk="pay"), open_it=True, user=operator)
    assign_perm("operations.activate_tool", operator, Tool.objects.get(pk="pay"))
    services.tool_breaker_set(tool=Tool.objects.get(pk="pay"), open_it=True, user=operator)
    op = api.register(tool, "pay")
    assert api.claim(op["id"], expect=409)["code"] == "retry_later"
    services.tool_breaker_set(tool=Tool.objects.get(pk="pay"), open_it=False, user=operator)
    api.claim(op["id"])
    forced = Event.objects.filter(stream="tool:pay", kind__startswith="breaker_forced")
    assert [e.actor for e in forced] == [f"user:{operator.username}"] * 2


def test_tools_without_a_breaker_never_refuse(api):
    api.tool("plain")
    run = api.run()
    for _ in range(10):
        op = api.register(run, "plain")
        api.claim(op["id"])
        api.outcome(op["id"], 1, {"kind": "failed", "code": "upstream_5xx"})
    assert Tool.objects.get(pk="plain").breaker_state == "closed"


def test_the_tool_page_shows_the_breaker_and_a_person_operates_it(api, tool):
    from django.test import Client

    for _ in range(3):
        _fail(api, tool)
    operator = person()
    assign_perm("operations.activate_tool", operator, Tool.objects.get(pk="pay"))
    client = Client()
    client.force_login(operator)
    html = client.get("/tools/pay/").content.decode()
    assert "Circuit breaker" in html
    assert "3 consecutive failures" in html
    assert "Close the breaker" in html
    client.post("/tools/pay/breaker", {"state": "closed"})
    assert _state() == ("closed", 0)
    assert "breaker_forced_closed" in client.get("/tools/pay/").content.decode()
