"""Reconciliation with evidence (issue 29): the queue names who and how much and says
why in words; its counts are the navigation's; the operation page shows what was sent,
every lookup's request and answer, answers as cards and the provider's console link; one
answer form at a time, and a refused answer keeps what was chosen and typed."""

import re
from datetime import timedelta

from django.test import Client
from django.utils import timezone
from guardian.shortcuts import assign_perm

from operations import services
from operations.models import Operation, Tool
from tests.approvals.conftest import person
from tests.conftest import contract

PAY_LINK = "https://pay.example.com/refunds?key={idempotency_key}"
MONEY = {"label": "Amount", "format": "money", "currency": "EUR", "minor_units": True}


def _client(*tools: str, username: str | None = None) -> Client:
    user = person(username=username) if username else person()
    for tool in tools or ("refund",):
        assign_perm("operations.reconcile_tool", user, Tool.objects.get(pk=tool))
    client = Client()
    client.force_login(user)
    return client


def _unknown(api, tool="refund", code="timeout", detail="read timeout", principal="user:alice"):
    op = api.register(api.run(principal), tool, {"payment_id": "pay_9002", "amount_cents": 8000})
    api.claim(op["id"])
    body = {"kind": "unknown", "code": code}
    if detail:
        body["detail"] = detail
    api.outcome(op["id"], 1, body)
    return op


def _refund(api, **reconcile):
    api.tool(
        "refund",
        contract(
            "irreversible",
            approval={"mode": "never"},
            reconcile={"mode": "manual", **reconcile},
            display={
                "summary": "Refund {/amount_cents} to {/payment_id}",
                "fields": {"/amount_cents": MONEY},
            },
        ),
    )


def _page(client: Client, op) -> str:
    return client.get(f"/operations/{op['id']}/").content.decode()


def _plain(html: str) -> str:
    """The page's text as a browser finds it: a <wbr> is no character."""
    return html.replace("<wbr>", "")


def _section(html: str, heading_id: str) -> str:
    """The section labelled by ``heading_id``, the sections inside it included."""
    start = html.index(f'<section aria-labelledby="{heading_id}"')
    depth = 0
    for tag in re.finditer(r"<(/?)section\b", html[start:]):
        depth += -1 if tag[1] else 1
        if depth == 0:
            return html[start : start + tag.start()]
    raise AssertionError(f"section {heading_id} is not closed")


# ---- the queue ------------------------------------------------------------------------------


def test_the_queue_names_the_principal_the_amount_and_why_in_words(api):
    _refund(api)
    op = _unknown(api, principal="user:cus_2024")
    other = _unknown(api, code="connection_reset", detail="")
    strange = _unknown(api, code="card_declined", detail='<b onclick="x()">402</b>')
    html = _client().get("/reconciliation/").content.decode()
    row = html[html.index(f'data-key="{op["id"]}"') :]
    row = row[: row.index("</tr>")]
    assert "user:cus_2024" in row
    assert "€80.00" in row
    assert "No answer within the time limit (read timeout)" in row
    assert 'title="code timeout"' in row
    assert "The connection was reset before an answer came" in html
    assert f'data-key="{other["id"]}"' in html
    # A code nobody listed is shown as it is, its detail escaped.
    assert "card_declined: &lt;b onclick=&quot;x()&quot;&gt;402&lt;/b&gt;" in html
    assert '<b onclick="x()">' not in html
    assert f'data-key="{strange["id"]}"' in html


def test_without_a_display_the_amount_says_what_it_counts(api):
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    _unknown(api)
    html = _client().get("/reconciliation/").content.decode()
    assert "8,000 cents" in html


def _nav(html: str) -> str:
    return html[html.index('<nav class="topnav"') : html.index("</nav>")]


def test_the_navigation_and_the_queues_tab_count_the_same_operations(api):
    """Unknown and compensating operations, snoozed ones left out, in both places."""
    _refund(api)
    api.tool("voucher", contract("compensable", approval={"mode": "never"}))
    _unknown(api)
    _unknown(api, tool="voucher")
    _unknown(api, tool="voucher")
    snoozed = _unknown(api)
    client = _client("refund", "voucher")
    client.post(
        f"/operations/{snoozed['id']}/resolve",
        {
            "result": "still_unknown",
            "snooze_until": (timezone.now() + timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M"),
        },
    )
    assert Operation.objects.get(pk=snoozed["id"]).snoozed_until is not None
    html = client.get("/reconciliation/").content.decode()
    assert 'Reconciliation <span class="nav-count" title="waiting for an answer">3' in _nav(html)
    assert 'Unknown and compensating <span class="count">3</span>' in html


def test_to_confirm_opens_the_queue_of_proposals_waiting_for_this_person(api):
    _refund(api)
    proposed = _unknown(api)
    _unknown(api)
    first, second = _client(username="pia"), _client(username="quinn")
    first.post(f"/operations/{proposed['id']}/resolve", {"result": "not_found", "note": "absent"})
    page = second.get("/reconciliation/").content.decode()
    assert '<a href="/reconciliation/?queue=to_confirm" class="nav-confirm">1 to confirm' in page
    assert 'Waiting for your confirmation <span class="count">1</span>' in page
    queue = second.get("/reconciliation/", {"queue": "to_confirm"}).content.decode()
    assert f'data-key="{proposed["id"]}"' in queue
    assert queue.count("data-key=") == 1
    # The proposer's own proposal is not theirs to confirm.
    mine = first.get("/reconciliation/", {"queue": "to_confirm"}).content.decode()
    assert "data-key=" not in mine
    assert 'Waiting for your confirmation <span class="count">0</span>' in mine


# ---- the operation page -------------------------------------------------------------------


def test_an_unknown_outcome_shows_what_was_sent_and_links_the_providers_console(api):
    _refund(api, console_url=PAY_LINK)
    op = _unknown(api)
    html = _page(_client(), op)
    panel = _plain(_section(html, "resolve"))
    assert "What was sent" in panel
    assert op["idempotency_key"] in panel
    assert "/amount_cents" in panel
    assert "8000" in panel
    assert "pay_9002" in panel
    assert "No answer within the time limit (read timeout)" in panel
    link = re.search(
        r'<a class="external" href="([^"]+)" target="_blank" rel="noopener noreferrer">'
        r"Open in pay\.example\.com",
        panel,
    )
    assert link is not None
    assert link[1] == f"https://pay.example.com/refunds?key={op['idempotency_key']}"
    assert "Look this idempotency key up at the provider: <a" in panel


def test_the_link_quotes_the_downstream_reference_and_waits_for_one(api):
    _refund(api, console_url="https://pay.example.com/r/{downstream_id}")
    op = _unknown(api)
    client = _client()
    assert "linked by the downstream reference (none yet)" in _page(client, op)
    client.post(
        f"/operations/{op['id']}/resolve",
        {"result": "committed", "downstream_id": 're 1/"><script>', "note": "seen"},
    )
    html = _page(client, op)
    assert 'href="https://pay.example.com/r/re%201%2F%22%3E%3Cscript%3E"' in html
    assert "<script>" not in html.split("<body", 1)[1]


def test_every_lookup_shows_its_request_and_its_answer(api, settings):
    settings.RECONCILE_ALLOWED_HOSTS = ["10.0.0.0/8"]
    _refund(api)
    api.tool(
        "lookup_refund",
        contract(
            "irreversible",
            approval={"mode": "never"},
            reconcile={"mode": "lookup", "url": "http://10.0.0.5/lookup/{idempotency_key}"},
        ),
    )
    op = _unknown(api, tool="lookup_refund")
    stored = Operation.objects.get(pk=op["id"])
    probe = services.Actor.system("probe")
    services.operation_probe_failed(operation=stored, error="HTTP 404", actor=probe)
    services.operation_reconcile(
        operation=stored,
        result="still_unknown",
        actor=probe,
        evidence={"provider_status": "pending"},
        source="probe",
    )
    html = _section(_page(_client("lookup_refund"), op), "probes")
    request = f"GET http://10.0.0.5/lookup/{op['idempotency_key']}"
    assert html.count(request) == 2
    assert "No usable answer" in html
    assert "HTTP 404" in html
    assert "Still unknown" in html
    assert "<dt>Evidence /provider_status</dt><dd>pending</dd>" in html


def test_a_resolved_answer_is_a_card_and_the_attempt_row_follows_it(api):
    _refund(api)
    op = _unknown(api)
    client = _client(username="sam")
    client.post(
        f"/operations/{op['id']}/resolve",
        {"result": "committed", "downstream_id": "re_9002", "note": "Found in the dashboard"},
    )
    html = _page(client, op)
    answers = _section(html, "probes")
    assert "It happened" in answers
    assert '<dt>Downstream reference</dt><dd class="mono">re_9002</dd>' in answers
    assert "<dt>Evidence note</dt><dd>Found in the dashboard</dd>" in answers
    assert "{&quot;note&quot;" not in html
    attempts = _section(html, "attempts")
    assert re.search(
        r'badge-unknown">unknown</span> → <span class="badge badge-succeeded">it happened</span>'
        r' <span class="small">by sam',
        attempts,
    )
    # The operation is settled: no answer form any more.
    assert "Record answer" not in html


def test_the_event_trace_folds_each_events_data_into_rows(api):
    _refund(api)
    op = _unknown(api)
    trace = _section(_page(_client(), op), "trace")
    assert "<details><summary>" in trace
    assert '<dt class="mono">/code</dt><dd>timeout</dd>' in trace
    assert "{&quot;" not in trace


def test_the_intent_hash_wraps_between_groups(api):
    _refund(api)
    op = _unknown(api)
    html = _page(_client(), op)
    digest = op["intent_hash"]
    groups = "<wbr>".join(digest[i : i + 16] for i in range(0, len(digest), 16))
    assert f'<dt>Intent hash</dt><dd class="mono">{groups}</dd>' in html


def test_the_second_person_sees_confirm_first_and_one_answer_form_folded(api):
    _refund(api)
    op = _unknown(api)
    first, second = _client(username="pia"), _client(username="quinn")
    first.post(f"/operations/{op['id']}/resolve", {"result": "not_found", "note": "absent"})
    panel = _section(_page(second, op), "resolve")
    assert panel.count("<form ") == 2
    assert "Confirm: it did not happen" in panel
    folded = panel[panel.index('<details class="other-answer">') :]
    assert "Record answer" in folded
    assert panel.index("Confirm: it did not happen") < panel.index('<details class="other-answer">')
    # A second "did not happen" would be refused: it is not offered.
    assert 'value="not_found"' not in panel
    own = _section(_page(first, op), "resolve")
    assert "This is your proposal" in own
    assert "Confirm: it did not happen" not in own
    assert own.count("<form ") == 1
    assert '<details class="other-answer">' in own


def test_a_refused_answer_keeps_the_choice_and_the_typed_evidence(api):
    _refund(api)
    op = _unknown(api)
    client = _client()
    response = client.post(
        f"/operations/{op['id']}/resolve",
        {"result": "not_found", "downstream_id": "re_77", "note": "  "},
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert "Say how you know the effect did not happen." in html
    assert 'value="not_found" checked' in html
    assert 'value="committed" required checked' not in html
    assert (
        'name="downstream_id" id="id_downstream_id" maxlength="255" class="mono" value="re_77"'
        in html
    )
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"

    unchosen = client.post(f"/operations/{op['id']}/resolve", {"note": "typed evidence"})
    assert unchosen.status_code == 400
    page = unchosen.content.decode()
    assert 'role="alert" id="resolve-error">This field is required.' in page
    assert ">typed evidence</textarea>" in page


def test_a_dispute_without_a_reason_keeps_the_note_form(api):
    _refund(api)
    op = _unknown(api)
    first, second = _client(username="pia"), _client(username="quinn")
    first.post(f"/operations/{op['id']}/resolve", {"result": "not_found", "note": "absent"})
    resolution = Operation.objects.get(pk=op["id"]).resolutions.get()
    response = second.post(
        f"/operations/{op['id']}/resolutions/{resolution.id}", {"decision": "dispute", "note": ""}
    )
    assert response.status_code == 400
    assert 'id="confirm-error">Say why you dispute it.' in response.content.decode()
    # Read again: the resolution object above was read before the refused dispute.
    assert Operation.objects.get(pk=op["id"]).resolutions.get().status == "pending"
    assert Operation.objects.get(pk=op["id"]).status == "outcome_unknown"


def test_an_answer_refused_because_someone_answered_first_is_said_at_the_top(api):
    _refund(api)
    op = _unknown(api)
    first, second = _client(username="pia"), _client(username="quinn")
    first.post(f"/operations/{op['id']}/resolve", {"result": "committed", "note": "found it"})
    response = second.post(
        f"/operations/{op['id']}/resolve", {"result": "not_found", "note": "not there"}
    )
    assert response.status_code == 400
    html = response.content.decode()
    messages = html[
        html.index('id="messages"') : html.index("</div>\n", html.index('id="messages"'))
    ]
    assert "is succeeded, not outcome_unknown" in messages
    assert 'role="alert"' in messages
    assert "Record answer" not in html  # nothing left to answer
    assert Operation.objects.get(pk=op["id"]).status == "succeeded"


def test_after_an_answer_the_next_unknown_outcome_opens(api):
    """As after an approval: support goes on to the oldest other unknown outcome it can
    answer, not back to the top of the queue; with none left, the page stays."""
    _refund(api)
    first, second = _unknown(api), _unknown(api)
    client = _client(username="tess")
    answer = client.post(
        f"/operations/{first['id']}/resolve",
        {"result": "committed", "downstream_id": "re_1"},
    )
    assert answer.status_code == 302
    assert answer["Location"] == f"/operations/{second['id']}/"
    assert (
        "The next unknown outcome in the queue is open"
        in client.get(answer["Location"]).content.decode()
    )
    last = client.post(
        f"/operations/{second['id']}/resolve",
        {"result": "committed", "downstream_id": "re_2"},
    )
    assert last["Location"] == f"/operations/{second['id']}/"
    assert Operation.objects.get(pk=first["id"]).status == "succeeded"
    assert Operation.objects.get(pk=second["id"]).status == "succeeded"
