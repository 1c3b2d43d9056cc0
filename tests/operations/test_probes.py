"""Automatic probes against a real lookup server on loopback."""

import ipaddress
from datetime import timedelta

import pytest
import time_machine
from django.core.management import call_command
from django.utils import timezone

from operations.dispatch.probes import probe_due
from operations.hosts import HostPolicy
from operations.models import Event, Operation, Tool, ToolVersion
from tests.conftest import contract


def _unknown(api, template, max_probes=10):
    api.tool(
        "refund",
        contract(
            "irreversible",
            approval={"mode": "never"},
            reconcile={"mode": "lookup", "url": template, "max_probes": max_probes},
        ),
    )
    op = api.register(api.run(), "refund")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    return op


def test_the_first_probe_waits_a_grace_period(api, lookup_server, settings):
    settings.RECONCILE_FIRST_PROBE_DELAY_S = 15
    op = _unknown(api, lookup_server.url_template)
    lookup_server.answer(op["idempotency_key"], {"result": "not_found"})
    assert probe_due().probed == 0  # the runner's request may still be in flight
    with time_machine.travel(timezone.now() + timedelta(seconds=16), tick=False):
        assert probe_due().probed == 1
    assert Operation.objects.get(pk=op["id"]).status == "awaiting_approval"


def test_first_probe_after_the_grace_and_committed_resolves(api, lookup_server):
    op = _unknown(api, lookup_server.url_template)
    lookup_server.answer(
        op["idempotency_key"],
        {"result": "committed", "downstream_id": "re_5", "evidence": {"ledger": "row 9"}},
    )
    report = probe_due()
    assert (report.probed, report.resolved, report.failed) == (1, 1, 0)
    stored = Operation.objects.get(pk=op["id"])
    assert stored.status == "succeeded"
    assert stored.downstream_id == "re_5"
    event = Event.objects.get(stream=op["id"], kind="reconciled")
    assert event.data["source"] == "probe"
    assert event.data["evidence"] == {"ledger": "row 9"}
    assert event.actor == "system:probe"
    assert lookup_server.requests == [f"/lookup/{op['idempotency_key']}"]


def test_not_found_answer_sends_irreversible_back_for_approval(api, lookup_server):
    op = _unknown(api, lookup_server.url_template)
    lookup_server.answer(op["idempotency_key"], {"result": "not_found"})
    probe_due()
    assert Operation.objects.get(pk=op["id"]).status == "awaiting_approval"


def test_still_unknown_backs_off_then_exhausts(api, lookup_server):
    op = _unknown(api, lookup_server.url_template, max_probes=2)
    lookup_server.answer(op["idempotency_key"], {"result": "still_unknown"})
    assert probe_due().probed == 1
    assert probe_due().probed == 0  # not due again yet: 30 s backoff
    stored = Operation.objects.get(pk=op["id"])
    assert stored.next_probe_at > timezone.now() + timedelta(seconds=25)
    with time_machine.travel(stored.next_probe_at + timedelta(seconds=1), tick=False):
        assert probe_due().probed == 1
    stored.refresh_from_db()
    assert (stored.status, stored.probes, stored.next_probe_at) == ("outcome_unknown", 2, None)


@pytest.mark.parametrize(
    ("status", "body", "delay", "error"),
    [
        (200, b"<html>oops</html>", 0, "not JSON"),
        # What no column, jsonb or RFC 8785 takes, and what has two meanings: refused
        # as a request body would be. (Before, recording such an answer failed and the
        # same answer was fetched again at every sweep, or it was stored with a number
        # that PostgreSQL gives back as one RFC 8785 cannot write, or it resolved.)
        (200, b'{"result": "committed", "downstream_id": "re_\\u0000"}', 0, "U+0000"),
        (200, b'{"result": "committed", "evidence": {"s": "\\ud800"}}', 0, "surrogates"),
        (200, b'{"result": "committed", "evidence": {"x": NaN}}', 0, "NaN"),
        (200, b'{"result": "not_found", "result": "committed"}', 0, "appears twice"),
        (200, b'{"result": "committed", "evidence": {"n": 1e300}}', 0, "2^53"),
        (200, b'{"result": "committed", "evidence": {"n": 1' + b"0" * 5000 + b"}}", 0, "2^53"),
        (200, b'{"result": "maybe"}', 0, '"result"'),
        (200, b"[1, 2]", 0, '"result"'),
        (500, b'{"result": "committed"}', 0, "HTTP 500"),
        (302, b"", 0, "HTTP 302"),
        (200, b'{"result": "committed"}', 2, "timed out"),
    ],
)
def test_garbage_errors_and_timeouts_are_failed_probes_that_resolve_nothing(
    api, lookup_server, status, body, delay, error
):
    op = _unknown(api, lookup_server.url_template)
    lookup_server.answer(op["idempotency_key"], body, status=status, delay=delay)
    report = probe_due()
    assert (report.probed, report.failed, report.resolved) == (1, 1, 0)
    stored = Operation.objects.get(pk=op["id"])
    assert stored.status == "outcome_unknown"
    assert stored.probes == 1
    event = Event.objects.filter(stream=op["id"], kind="probe").last()
    assert event.data["result"] == "failed"
    assert error in event.data["error"]


def _put_lookup(api, url):
    return api.put(
        "/api/v1/tools/refund",
        contract("irreversible", reconcile={"mode": "lookup", "url": url}),
    )


@pytest.mark.parametrize(
    ("allowed", "url"),
    [
        ([], "http://payments.internal/refunds/{idempotency_key}"),  # the default: none
        ([], "http://127.0.0.1:8080/{idempotency_key}"),
        (["10.0.0.0/8"], "http://127.0.0.1:8080/{idempotency_key}"),
        (["lookup.example.com"], "http://localhost/{idempotency_key}"),
        (["lookup.example.com"], "https://93.184.215.14/{idempotency_key}"),  # public
        (["127.0.0.1"], "http://169.254.169.254/{operation_id}"),  # link-local
        (["::1"], "http://[::2]/{idempotency_key}"),
    ],
)
def test_a_lookup_host_the_allow_list_can_never_admit_is_refused_at_registration(
    api, settings, allowed, url
):
    settings.RECONCILE_ALLOWED_HOSTS = allowed
    response = _put_lookup(api, url)
    assert response.status_code == 422, response.json()
    assert response.json()["code"] == "url_not_allowed"
    assert "RECONCILE_ALLOWED_HOSTS" in response.json()["detail"]
    assert not Tool.objects.filter(pk="refund").exists()


@pytest.mark.parametrize(
    ("allowed", "url"),
    [
        # A listed name is accepted without resolving it: it may resolve only where
        # the workers run, or only later.
        (["payments.internal"], "http://payments.internal/refunds/{idempotency_key}"),
        (["PAYMENTS.internal."], "https://payments.INTERNAL:8443/{idempotency_key}"),
        # A name that is not listed may resolve into a listed range: known at lookup time.
        (["10.0.0.0/8"], "http://lookups.corp.example/{idempotency_key}"),
        (["10.0.0.0/8"], "http://10.1.2.3/{idempotency_key}"),
        (["169.254.169.0/24"], "http://169.254.169.254/{operation_id}"),
        (["::1"], "http://[::1]:8080/{idempotency_key}"),
    ],
)
def test_a_lookup_host_the_allow_list_may_admit_is_accepted(api, settings, allowed, url):
    settings.RECONCILE_ALLOWED_HOSTS = allowed
    response = _put_lookup(api, url)
    assert response.status_code == 201, response.json()
    assert response.json()["reconcile"]["url"] == url


def test_an_unchanged_contract_is_refused_once_its_lookup_host_is_no_longer_allowed(api, settings):
    settings.RECONCILE_ALLOWED_HOSTS = ["payments.internal"]
    url = "http://payments.internal/refunds/{idempotency_key}"
    assert _put_lookup(api, url).status_code == 201
    settings.RECONCILE_ALLOWED_HOSTS = []
    assert _put_lookup(api, url).json()["code"] == "url_not_allowed"
    assert ToolVersion.objects.filter(tool_id="refund").count() == 1


def test_hosts_not_on_the_allow_list_are_never_called(api, lookup_server, settings):
    # Registered while the host was allowed (registration refuses it otherwise), and
    # looked up after the list changed: the lookup checks again.
    op = _unknown(api, lookup_server.url_template)
    settings.RECONCILE_ALLOWED_HOSTS = ["10.0.0.0/8"]
    lookup_server.answer(op["idempotency_key"], {"result": "committed"})
    assert probe_due().failed == 1
    assert lookup_server.requests == []
    event = Event.objects.filter(stream=op["id"], kind="probe").last()
    assert "not allowed" in event.data["error"]
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"


def test_a_name_that_resolves_to_loopback_is_refused_unless_listed(api, lookup_server, settings):
    # Registration admits a name that may resolve into a listed range; the lookup finds
    # that localhost resolves to loopback, outside 10.0.0.0/8.
    settings.RECONCILE_ALLOWED_HOSTS = ["lookup.example.com", "10.0.0.0/8"]
    op = _unknown(api, f"http://localhost:{lookup_server.port}/lookup/{{idempotency_key}}")
    lookup_server.answer(op["idempotency_key"], {"result": "committed"})
    assert probe_due().failed == 1
    assert lookup_server.requests == []
    settings.RECONCILE_ALLOWED_HOSTS = ["localhost"]
    Operation.objects.filter(pk=op["id"]).update(next_probe_at=timezone.now())
    assert probe_due().resolved == 1


def test_manual_mode_operations_are_not_probed(api, lookup_server):
    api.tool("manual", contract("irreversible", approval={"mode": "never"}))
    op = api.register(api.run(), "manual")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown"})
    assert probe_due().probed == 0


def test_reconcile_command_runs_the_due_probes(api, lookup_server, capsys):
    op = _unknown(api, lookup_server.url_template)
    lookup_server.answer(op["idempotency_key"], {"result": "committed"})
    call_command("reconcile")
    assert "probed: 1, resolved: 1, failed: 0" in capsys.readouterr().out
    assert Operation.objects.get(pk=op["id"]).status == "succeeded"


def test_host_policy():
    policy = HostPolicy.parse(["runner.internal", "10.1.0.0/16"], allow_public=False)
    ip = ipaddress.ip_address
    assert policy.address_allowed("runner.internal", ip("192.168.1.5"))
    assert not policy.address_allowed("runner.internal", ip("169.254.169.254"))
    assert policy.address_allowed("anything", ip("10.1.2.3"))
    assert not policy.address_allowed("anything", ip("10.2.0.1"))
    assert not policy.address_allowed("anything", ip("93.184.216.34"))
    public = HostPolicy.parse([], allow_public=True)
    assert public.address_allowed("x", ip("93.184.216.34"))
    for internal in (
        "127.0.0.1",
        "10.0.0.1",
        "192.168.0.1",
        "169.254.169.254",
        "::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "0.0.0.0",
        "100.64.0.1",
    ):
        assert not public.address_allowed("x", ip(internal)), internal
