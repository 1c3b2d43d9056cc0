"""The reconciliation pages' words (console/evidence.py) and their template helpers,
without a database: codes in words, answers as cards, which answer settled which
attempt, hashes that wrap in groups, event data as rows."""

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from django.template import Context, Template

from console.evidence import (
    CODE_WORDS,
    actor_words,
    answer_card,
    attempt_resolutions,
    code_in_words,
)

AT = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@dataclass
class Ev:
    kind: str
    data: dict[str, Any] = field(default_factory=dict)
    actor: str = "system:probe"
    from_status: str = "outcome_unknown"
    to_status: str = "outcome_unknown"
    at: datetime = AT


def render(source: str, **context) -> str:
    return Template("{% load console_tags json_tags evidence_tags %}" + source).render(
        Context(context)
    )


# ---- codes in words --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "detail", "words"),
    [
        ("connection_reset", "", "The connection was reset before an answer came"),
        ("timeout", "read timeout", "No answer within the time limit (read timeout)"),
        ("timeout_unknown", "", "No answer within the time limit"),
        ("rate_limited", "429", "The provider asked to slow down (rate limited) (429)"),
        # Effectgate's own detail is a whole sentence: it is the words.
        (
            "lease_expired",
            "The lease of attempt 2 expired with no outcome.",
            "The lease of attempt 2 expired with no outcome.",
        ),
        ("lease_expired", "", "The runner reported no outcome before its lease ran out"),
        # A code nobody listed is shown as it is.
        ("card_declined", "402 from the provider", "card_declined: 402 from the provider"),
        ("card_declined", "", "card_declined"),
        ("", "a detail without a code", "a detail without a code"),
        ("", "", ""),
    ],
)
def test_a_code_reads_as_words(code, detail, words):
    assert code_in_words(code, detail) == words


def test_a_long_detail_is_clipped_only_where_asked():
    detail = "x" * 300
    assert code_in_words("timeout", detail) == f"No answer within the time limit ({detail})"
    clipped = code_in_words("timeout", detail, detail_limit=80)
    assert clipped == "No answer within the time limit (" + "x" * 79 + "…)"


def test_every_listed_code_is_a_code_an_outcome_may_carry():
    import re

    from operations.machine import OUTCOME_CODE_PATTERN

    assert all(re.fullmatch(OUTCOME_CODE_PATTERN, code) for code in CODE_WORDS)
    assert all(words and words[0].isupper() for words in CODE_WORDS.values())


def test_an_unknown_code_and_its_detail_are_escaped_on_the_page():
    html = render(
        "{{ code|code_words:detail|reveal }}",
        code="weird",
        detail='<img src=x onerror="alert(1)">\u202e',
    )
    assert html.startswith("weird: &lt;img src=x onerror=&quot;alert(1)&quot;&gt;")
    assert "U+202E" in html
    assert "<img" not in html


@pytest.mark.parametrize(
    ("actor", "words"),
    [
        ("user:sam", "sam"),
        ("runner:billing", "runner billing"),
        ("system:probe", "an automatic lookup"),
        ("system:inbound", "the provider's event"),
        ("system:sweep", "Effectgate (sweep)"),
    ],
)
def test_actors_in_words(actor, words):
    assert actor_words(actor) == words


# ---- answers as cards ------------------------------------------------------------------


def _facts(card) -> dict[str, str]:
    return {fact.label: fact.text for fact in card.facts}


def test_a_persons_committed_answer_is_a_card_not_json():
    card = answer_card(
        Ev(
            "reconciled",
            {
                "result": "committed",
                "downstream_id": "re_9002",
                "evidence": {"note": "Found in the provider dashboard"},
                "source": "person",
            },
            actor="user:sam",
            to_status="succeeded",
        )
    )
    assert (card.title, card.tone, card.who, card.source) == (
        "It happened",
        "succeeded",
        "sam",
        "a person",
    )
    assert card.became == "succeeded"
    assert _facts(card) == {
        "Downstream reference": "re_9002",
        "Evidence note": "Found in the provider dashboard",
    }


def test_a_failed_lookup_shows_what_it_asked_and_what_came_back():
    card = answer_card(
        Ev("probe", {"result": "failed", "error": "HTTP 404", "source": "probe", "probes": 2}),
        lookup_request="GET https://runner.test/lookup/ik_1",
    )
    assert (card.title, card.who, card.became) == ("No usable answer", "an automatic lookup", "")
    assert _facts(card) == {
        "Request": "GET https://runner.test/lookup/ik_1",
        "Answer": "HTTP 404",
        "Lookups": "2 so far",
    }
    assert card.facts[0].mono


def test_a_lookups_evidence_is_one_row_per_value_and_bounded():
    evidence = {"provider_status": "pending", "amount": 500, "nested": {"a": [1, True]}}
    evidence.update({f"k{i}": i for i in range(30)})  # 34 values in all
    card = answer_card(
        Ev("probe", {"result": "still_unknown", "source": "probe", "evidence": evidence}),
    )
    facts = _facts(card)
    assert facts["Evidence /provider_status"] == "pending"
    assert facts["Evidence /amount"] == "500"
    assert facts["Evidence /nested/a/1"] == "true"
    assert "Request" not in facts  # the page gave no request
    assert len([f for f in card.facts if f.label.startswith("Evidence /")]) == 20
    assert facts["Evidence"] == "14 more values in the event trace below"


def test_a_confirmed_did_not_happen_names_both_people():
    card = answer_card(
        Ev(
            "reconciled",
            {
                "result": "not_found",
                "source": "person",
                "evidence": {"note": "absent", "confirmation": "checked too"},
                "declared_by": "pia",
                "confirmed_by": "quinn",
            },
            actor="user:quinn",
            to_status="awaiting_approval",
        )
    )
    assert card.title == "It did not happen"
    assert _facts(card) == {
        "Evidence note": "absent",
        "Confirmation note": "checked too",
        "Declared by": "pia",
        "Confirmed by": "quinn",
    }


def test_a_late_success_is_an_answer_from_the_runner():
    card = answer_card(
        Ev("late_success", {"attempt": 1, "downstream_id": "re_1"}, actor="runner:r")
    )
    assert (card.title, card.source, card.who) == (
        "It happened",
        "a late outcome of attempt 1",
        "runner r",
    )


def test_the_answer_that_left_outcome_unknown_settles_its_attempt():
    events = [
        Ev("claimed", {"attempt": 1}, from_status="ready", to_status="executing"),
        Ev("outcome", {"attempt": 1, "kind": "unknown"}, from_status="executing"),
        Ev("probe", {"result": "still_unknown", "source": "probe"}),
        Ev(
            "reconciled",
            {"result": "not_found", "source": "person"},
            actor="user:sam",
            to_status="ready",
        ),
        Ev("claimed", {"attempt": 2}, from_status="ready", to_status="executing"),
        Ev("lease_expired", {"attempt": 2}, from_status="executing"),
        Ev(
            "reconciled",
            {"result": "committed", "source": "runner"},
            actor="runner:r",
            to_status="succeeded",
        ),
    ]
    resolved = attempt_resolutions(events)
    assert {n: (card.title, card.who) for n, card in resolved.items()} == {
        1: ("It did not happen", "sam"),
        2: ("It happened", "runner r"),
    }


def test_an_attempt_still_unknown_has_no_answer():
    events = [Ev("outcome", {"attempt": 1}, from_status="executing")]
    assert attempt_resolutions(events) == {}


# ---- template helpers --------------------------------------------------------------------


def test_a_hash_wraps_in_groups_of_sixteen_and_is_escaped():
    digest = "0123456789abcdef" * 4
    assert render("{{ h|hash_breaks }}", h=digest) == "<wbr>".join(["0123456789abcdef"] * 4)
    assert render("{{ h|hash_breaks }}", h="<b>&") == "&lt;b&gt;&amp;"


def test_event_data_is_a_gist_and_rows_never_raw_json():
    data = {"result": "committed", "evidence": {"note": "<i>found</i>"}, "n": 2}
    html = render(
        "{{ d|data_gist|reveal }}|{% for p, t in d|data_fields %}{{ p }}={{ t|reveal }};"
        "{% endfor %}",
        d=data,
    )
    gist, rows = html.split("|")
    assert gist == "result: committed · evidence/note: &lt;i&gt;found&lt;/i&gt; · n: 2"
    assert rows == "/result=committed;/evidence/note=&lt;i&gt;found&lt;/i&gt;;/n=2;"


def test_a_long_gist_is_clipped():
    out = render("{{ d|data_gist }}", d={"note": "y" * 200})
    assert len(out) == 80
    assert out.endswith("…")


@pytest.mark.parametrize(("count", "text"), [(0, "0"), (7, "7"), (99, "99"), (100, "99+")])
def test_counts_read_up_to_the_cap_say_so(count, text):
    assert render("{{ n|count_text }}", n=count) == text


@pytest.mark.parametrize(
    ("outcome", "words"),
    [
        (
            {"kind": "unknown", "code": "connection_reset"},
            "The connection was reset before an answer came",
        ),
        ({"kind": "failed", "detail": "no code"}, "no code"),
        ({"kind": "succeeded"}, ""),
        (None, ""),
    ],
)
def test_a_posted_outcome_reads_as_words_whatever_it_omits(outcome, words):
    assert render("{{ o|outcome_words }}", o=outcome) == words
