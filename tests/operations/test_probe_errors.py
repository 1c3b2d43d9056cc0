"""Lookup URL templates take plain placeholders only; one bad probe never stops a batch."""

import copy
import logging
from types import SimpleNamespace

import pytest

from operations.contracts import normalize_contract
from operations.dispatch import probes
from operations.dispatch.probes import probe_due
from operations.errors import InvalidContract
from operations.models import Event, Operation, Tool, ToolVersion
from tests.conftest import contract


def _lookup(url: str) -> dict:
    return contract("irreversible", reconcile={"mode": "lookup", "url": url})


@pytest.mark.parametrize(
    "url",
    [
        "https://runner.test/lookup/{idempotency_key}",
        "https://runner.test/ops/{operation_id}?key={idempotency_key}",
        "http://10.0.0.5:8080/lookup/{idempotency_key}",
        "https://runner.test/lookup",
    ],
)
def test_plain_placeholders_are_accepted(url):
    assert normalize_contract(_lookup(url))["reconcile"]["url"] == url


@pytest.mark.parametrize(
    "url",
    [
        "https://runner.test/{idempotency_key:>100000}",
        "https://runner.test/{idempotency_key:x}",
        "https://runner.test/{idempotency_key!r}",
        "https://runner.test/{idempotency_key.__class__}",
        "https://runner.test/{idempotency_key[0]}",
        "https://runner.test/{}",
        "https://runner.test/{0}",
        "https://runner.test/{secret}",
        "https://runner.test/{{idempotency_key}}",
        "https://runner.test/{idempotency_key",
        "https://runner.test/idempotency_key}",
        "https://{operation_id}.runner.test/lookup",
        "https://runner.test:{operation_id}/lookup",
        "{idempotency_key}",
        "ftp://runner.test/{idempotency_key}",
        "file:///etc/passwd",
        "https:///{idempotency_key}",
        "https://runner.test/a b/{idempotency_key}",
        "https://runner.test/\x00/{idempotency_key}",
        "https://runner.test/" + "a" * 2100 + "/{idempotency_key}",
    ],
)
def test_format_specs_odd_placeholders_and_bad_urls_are_refused(url):
    with pytest.raises(InvalidContract) as caught:
        normalize_contract(_lookup(url))
    assert {error["path"] for error in caught.value.extra["errors"]} == {"/reconcile/url"}


def test_a_format_spec_in_a_lookup_url_is_422_and_nothing_is_stored(api):
    response = api.put("/api/v1/tools/refund", _lookup("https://r.test/{idempotency_key:>100000}"))
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_contract"
    assert response.json()["errors"][0]["path"] == "/reconcile/url"
    assert not Tool.objects.filter(pk="refund").exists()


def _unknown(api, tool: str, url: str) -> dict:
    api.tool(
        tool,
        contract(
            "irreversible", approval={"mode": "never"}, reconcile={"mode": "lookup", "url": url}
        ),
    )
    op = api.register(api.run(), tool)
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown"})
    return op


def _store_template(tool: str, url: str) -> None:
    """Put ``url`` into the stored contract as a version saved before validation was
    tightened would hold it."""
    version = ToolVersion.objects.get(tool_id=tool)
    stored = copy.deepcopy(version.contract)
    stored["reconcile"]["url"] = url
    ToolVersion.objects.filter(pk=version.pk).update(contract=stored)


@pytest.mark.parametrize(
    "template",
    [
        "http://127.0.0.1:{port}/lookup/{{idempotency_key:>70000}}",  # httpx: URL too long
        "http://127.0.0.1:{port}/lookup/{{operation_id:x}}",  # ValueError while formatting
        "http://127.0.0.1:{port}/lookup/{{secret}}",  # KeyError while formatting
    ],
)
def test_a_stored_bad_template_is_a_failed_probe_and_the_batch_goes_on(
    api, lookup_server, caplog, template
):
    good_template = lookup_server.url_template
    bad = _unknown(api, "bad", good_template)
    _store_template("bad", template.format(port=lookup_server.port))
    good = _unknown(api, "good", good_template)
    Operation.objects.filter(pk=bad["id"]).update(
        next_probe_at=Operation.objects.get(pk=good["id"]).next_probe_at
    )
    lookup_server.answer(good["idempotency_key"], {"result": "committed"})
    with caplog.at_level(logging.ERROR, logger="operations.dispatch.probes"):
        report = probe_due()
    assert (report.probed, report.failed, report.resolved) == (2, 1, 1)
    assert Operation.objects.get(pk=good["id"]).status == "succeeded"
    stored = Operation.objects.get(pk=bad["id"])
    assert (stored.status, stored.probes) == ("outcome_unknown", 1)
    event = Event.objects.filter(stream=bad["id"], kind="probe").last()
    assert event.data["result"] == "failed"
    assert "could not be made" in event.data["error"]
    assert len(event.data["error"]) <= 500
    assert bad["id"] in caplog.text


def test_an_unexpected_error_while_parsing_is_a_failed_probe(api, lookup_server, monkeypatch):
    first = _unknown(api, "one", lookup_server.url_template)
    second = _unknown(api, "two", lookup_server.url_template)
    for op in (first, second):
        lookup_server.answer(op["idempotency_key"], {"result": "committed"})
    calls = []

    def parse_once_badly(response, body):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in the parser")
        return real_parse(response, body)

    real_parse = probes._parse
    monkeypatch.setattr(probes, "_parse", parse_once_badly)
    report = probe_due()
    assert (report.probed, report.failed, report.resolved) == (2, 1, 1)
    statuses = sorted(Operation.objects.values_list("status", flat=True))
    assert statuses == ["outcome_unknown", "succeeded"]


def test_lookup_url_fills_plain_placeholders_and_never_runs_a_format_spec():
    op = SimpleNamespace(idempotency_key="k/1 ?", id="op_1")
    template = "https://r.test/{operation_id}?key={idempotency_key}"
    assert probes.lookup_url(template, op) == "https://r.test/op_1?key=k%2F1%20%3F"
    # A version stored before templates were checked: refused before any expansion
    # (str.format would first build a 100 MB string).
    with pytest.raises(ValueError, match="placeholders"):
        probes.lookup_url("https://r.test/{idempotency_key:>100000000}", op)
