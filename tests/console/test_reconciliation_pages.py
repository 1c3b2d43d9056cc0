"""The reconciliation queue, its saved queues, and the operation page's evidence panel."""

from datetime import timedelta

import time_machine
from django.test import Client
from django.utils import timezone
from guardian.shortcuts import assign_perm

from operations.models import Operation, Tool
from operations.services import sweep
from tests.approvals.conftest import person
from tests.conftest import contract


def _client_for(tool: str, perm="operations.reconcile_tool"):
    user = person()
    assign_perm(perm, user, Tool.objects.get(pk=tool))
    client = Client()
    client.force_login(user)
    return client


def _unknown(api):
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    op = api.register(api.run(), "refund")
    api.claim(op["id"])
    api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout_unknown", "detail": "504"})
    return op


def test_queue_lists_unknown_operations_oldest_first_with_counts(api):
    first, second = _unknown(api), _unknown(api)
    client = _client_for("refund")
    html = client.get("/reconciliation/").content.decode()
    assert html.index(first["id"]) < html.index(second["id"])
    assert 'Unknown and compensating <span class="count">2</span>' in html
    outsider = Client()
    outsider.force_login(person())
    assert first["id"] not in outsider.get("/reconciliation/").content.decode()


def test_saved_queues(api):
    old = _unknown(api)
    with time_machine.travel(timezone.now() + timedelta(minutes=16), tick=False):
        fresh = _unknown(api)
        expired = api.register(api.run(), "refund")
        api.claim(expired["id"], lease_s=1)
        with time_machine.travel(timezone.now() + timedelta(seconds=5), tick=False):
            sweep()
            client = _client_for("refund")
            stale = client.get("/reconciliation/", {"queue": "unknown_15m"}).content.decode()
            lease = client.get("/reconciliation/", {"queue": "lease_expired"}).content.decode()
    assert old["id"] in stale
    assert fresh["id"] not in stale
    assert expired["id"] in lease
    assert old["id"] not in lease
    assert 'class="stale"' in stale


def test_operation_page_shows_the_evidence_panel(api):
    op = _unknown(api)
    client = _client_for("refund")
    html = client.get(f"/operations/{op['id']}/").content.decode()
    assert op["idempotency_key"] in html.replace("<wbr>", "")  # it wraps between groups
    assert "timeout_unknown" in html
    assert "504" in html
    assert "Resolve: did it happen?" in html
    decider = _client_for("refund", "operations.decide_tool")
    page = decider.get(f"/operations/{op['id']}/").content.decode()
    assert op["id"] in page
    assert "Resolve: did it happen?" not in page  # deciding is not reconciling


def test_resolving_in_the_console_reaches_the_runner(api):
    op = _unknown(api)
    client = _client_for("refund")
    response = client.post(
        f"/operations/{op['id']}/resolve",
        {"result": "committed", "downstream_id": "re_42", "note": "found in provider dashboard"},
    )
    assert response.status_code == 302
    body = api.operation(op["id"])
    assert (body["status"], body["downstream_id"]) == ("succeeded", "re_42")


def test_four_eyes_in_the_console(api):
    op = _unknown(api)
    first, second = _client_for("refund"), _client_for("refund")
    first.post(f"/operations/{op['id']}/resolve", {"result": "not_found", "note": "absent"})
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"
    page = first.get(f"/operations/{op['id']}/").content.decode()
    assert "A second person must confirm it." in page
    resolution = Operation.objects.get(pk=op["id"]).resolutions.get()
    second.post(f"/operations/{op['id']}/resolutions/{resolution.id}", {"decision": "confirm"})
    assert Operation.objects.get(pk=op["id"]).status == "awaiting_approval"


def test_a_refused_resolution_is_a_message(api):
    op = _unknown(api)
    client = _client_for("refund")
    response = client.post(f"/operations/{op['id']}/resolve", {"result": "committed"}, follow=True)
    assert "Give the downstream reference or an evidence note." in response.content.decode()
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"


def _nav(html: str) -> str:
    return html[html.index('<nav class="topnav"') : html.index("</nav>")]


def test_support_lands_on_the_queue_and_the_navigation_counts_what_waits(api):
    """Someone who may reconcile but decide nothing starts at the queue; the navigation
    counts what waits for an answer and the proposals waiting for this person's
    confirmation (not their own)."""
    op = _unknown(api)
    _unknown(api)
    first, second = _client_for("refund"), _client_for("refund")
    landing = second.get("/")
    assert landing.status_code == 302
    assert landing["Location"] == "/reconciliation/"
    nav = _nav(second.get("/reconciliation/").content.decode())
    assert 'Reconciliation <span class="nav-count" title="waiting for an answer">2' in nav
    assert "to confirm" not in nav

    first.post(f"/operations/{op['id']}/resolve", {"result": "not_found", "note": "absent"})
    assert "1 to confirm" in _nav(second.get("/reconciliation/").content.decode())
    assert "to confirm" not in _nav(first.get("/reconciliation/").content.decode())


def test_an_approver_lands_on_the_inbox_with_its_count(api):
    api.tool("refund", contract("irreversible", approval={"mode": "always"}))
    api.register(api.run(), "refund")
    client = _client_for("refund", perm="operations.decide_tool")
    response = client.get("/")
    assert response.status_code == 200
    assert 'Inbox <span class="nav-count" title="waiting for your decision">1' in _nav(
        response.content.decode()
    )


def test_a_proposal_waits_for_a_second_person_visibly_and_they_are_told(
    api, mailoutbox, django_capture_on_commit_callbacks
):
    """Four eyes made visible: the queue says the operation waits for a second person
    (and whose proposal it is), and the people who may confirm it get a mail, not the
    proposer."""
    op = _unknown(api)
    proposer = person(username="pia", email="pia@example.com")
    confirmer = person(username="quinn", email="quinn@example.com")
    for user in (proposer, confirmer):
        assign_perm("operations.reconcile_tool", user, Tool.objects.get(pk="refund"))
    first, second = Client(), Client()
    first.force_login(proposer)
    second.force_login(confirmer)
    with django_capture_on_commit_callbacks(execute=True):
        first.post(f"/operations/{op['id']}/resolve", {"result": "not_found", "note": "absent"})
    mine = first.get("/reconciliation/").content.decode()
    assert "waits for a second person: your proposal" in mine
    queue = second.get("/reconciliation/").content.decode()
    assert "waits for a second person" in queue
    assert "your proposal" not in queue
    [mail] = mailoutbox
    assert mail.to == ["quinn@example.com"]
    assert "pia says" in mail.body
    assert f"/operations/{op['id']}/" in mail.body
