"""A contract's provider console link (``reconcile.console_url``): refused unless it is
a plain https link with the two placeholders only, filled in percent-encoded, and a new
or changed link waits for a person (docs/api.md, Reconciliation)."""

import pytest

from operations.contracts import console_link, normalize_contract, weakenings
from operations.contracts.validation import CONSOLE_URL_MAX_LENGTH
from operations.errors import InvalidContract
from operations.models import ToolVersion
from tests.conftest import contract

PAY = "https://pay.example.com/refunds?idempotency_key={idempotency_key}"


def _with_link(url: str, mode: str = "manual") -> dict:
    reconcile = {"mode": mode, "console_url": url}
    if mode == "lookup":
        reconcile["url"] = "https://runner.test/lookup/{idempotency_key}"
    return contract("irreversible", reconcile=reconcile)


@pytest.mark.parametrize(
    "url",
    [
        PAY,
        "https://pay.example.com/payments/{downstream_id}",
        "https://pay.example.com:8443/search?key={idempotency_key}&ref={downstream_id}",
        "https://pay.example.com/#/refunds/{idempotency_key}",
        "https://xn--py-8ka.example.com/refunds",
        "https://pay.example.com/dashboard",
    ],
)
def test_a_plain_https_link_is_kept_as_given(url):
    assert normalize_contract(_with_link(url))["reconcile"]["console_url"] == url
    assert normalize_contract(_with_link(url, "lookup"))["reconcile"]["console_url"] == url


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("javascript:alert(document.cookie)//{idempotency_key}", "https URL with a host"),
        ("JavaScript:alert(1)", "https URL with a host"),
        ("data:text/html,<script>alert(1)</script>", "https URL with a host"),
        ("http://pay.example.com/refunds/{idempotency_key}", "https URL with a host"),
        ("//pay.example.com/refunds/{idempotency_key}", "https URL with a host"),
        ("https:///refunds/{idempotency_key}", "https URL with a host"),
        ("https://pay.example.com/{operation_id}", "Only the placeholders"),
        ("https://pay.example.com/{secret}", "Only the placeholders"),
        ("https://pay.example.com/{idempotency_key:>100000}", "Only the placeholders"),
        ("https://pay.example.com/{idempotency_key!r}", "Only the placeholders"),
        ("https://pay.example.com/{{idempotency_key}}", "Only the placeholders"),
        ("https://{downstream_id}.example.com/", "path and query only"),
        ("https://pay.example.com@evil.test/{idempotency_key}", "no user name or password"),
        ("https://user:pw@pay.example.com/{idempotency_key}", "no user name or password"),
        ("https://p\u0430y.example.com/{idempotency_key}", "ASCII"),  # a Cyrillic a
        ("https://pay.example.com/\u202e{idempotency_key}", "ASCII"),
        ("https://pay.example.com/a b", "no spaces"),
        ("https://pay.example.com/\x00", "no spaces or control characters"),
        ("https://pay.example.com:99999/", "Not a URL"),
        # The host shown must be the host opened: a browser decodes %2e, reads a
        # backslash as a slash, and opens a number as an address.
        ("https://pay.example.com%2eevil.test/{idempotency_key}", "plain name"),
        ("https://evil.test\\pay.example.com/{idempotency_key}", "plain name"),
        ("https://0x7f000001/{idempotency_key}", "plain name"),
        ("https://127.0.0.1/{idempotency_key}", "plain name"),
    ],
)
def test_hostile_or_broken_links_are_refused_with_a_reason(url, words):
    with pytest.raises(InvalidContract) as caught:
        normalize_contract(_with_link(url))
    [error] = caught.value.extra["errors"]
    assert error["path"] == "/reconcile/console_url"
    assert words in error["message"]


@pytest.mark.parametrize("url", ["", "https://pay.example.com/" + "a" * CONSOLE_URL_MAX_LENGTH])
def test_an_empty_or_very_long_link_does_not_match_the_schema(url):
    with pytest.raises(InvalidContract) as caught:
        normalize_contract(_with_link(url))
    assert [e["path"] for e in caught.value.extra["errors"]] == ["/reconcile/console_url"]


def test_a_bad_link_is_422_invalid_contract_and_nothing_is_stored(api):
    response = api.put("/api/v1/tools/refund", _with_link("javascript:alert(1)"))
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "invalid_contract"
    assert body["errors"] == [
        {"path": "/reconcile/console_url", "message": "Must be an https URL with a host."}
    ]
    assert not ToolVersion.objects.filter(tool_id="refund").exists()


def test_a_contract_without_a_link_normalizes_as_before():
    """No default is filled in: a contract stored before the field existed keeps its
    normalized form, so registering it again is the same version."""
    assert "console_url" not in normalize_contract(contract("irreversible"))["reconcile"]


def test_a_new_or_changed_link_waits_for_a_person_and_dropping_it_does_not():
    without = normalize_contract(contract("irreversible"))
    linked = normalize_contract(_with_link(PAY))
    elsewhere = normalize_contract(_with_link("https://pay.example.org/{idempotency_key}"))
    reason = "another provider console link (reconcile.console_url)"
    assert weakenings(without, linked) == [reason]
    assert weakenings(linked, elsewhere) == [reason]
    assert weakenings(linked, linked) == []
    assert weakenings(linked, without) == []


def test_the_link_fills_its_placeholders_percent_encoded():
    link = console_link(
        normalize_contract(
            _with_link("https://pay.example.com/r/{downstream_id}?k={idempotency_key}")
        ),
        idempotency_key='ik_a/b?c=d&e#f "<script>',
        downstream_id="re 1/../admin",
    )
    assert link is not None
    assert link.host == "pay.example.com"
    assert link.url == (
        "https://pay.example.com/r/re%201%2F..%2Fadmin?k=ik_a%2Fb%3Fc%3Dd%26e%23f%20%22%3Cscript%3E"
    )


def test_the_host_named_is_the_one_the_browser_opens():
    link = console_link(
        normalize_contract(_with_link("https://Pay.Example.com:8443/{idempotency_key}")),
        idempotency_key="ik_1",
        downstream_id="",
    )
    assert link is not None
    assert (link.host, link.url) == ("pay.example.com:8443", "https://Pay.Example.com:8443/ik_1")


def test_a_link_that_needs_the_downstream_reference_waits_for_it():
    linked = normalize_contract(_with_link("https://pay.example.com/p/{downstream_id}"))
    link = console_link(linked, idempotency_key="ik_1", downstream_id="")
    assert link is not None
    assert (link.host, link.url) == ("pay.example.com", None)


def test_no_template_or_a_stored_bad_one_gives_no_link():
    assert console_link(contract(), idempotency_key="ik_1", downstream_id="") is None
    stored = normalize_contract(_with_link(PAY))
    stored["reconcile"]["console_url"] = "javascript:alert(1)//{idempotency_key}"
    assert console_link(stored, idempotency_key="ik_1", downstream_id="") is None
