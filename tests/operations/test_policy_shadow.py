"""Shadow mode (issue 25, item 5; docs/policies.md#shadow-mode): a policy watched in
shadow enforces nothing, and what it would have done is tallied per hour with examples,
an event per divergence (capped), and a Prometheus counter."""

import pytest
from prometheus_client import REGISTRY

from operations import selectors, services
from operations.machine import EventKind
from operations.models import Event, Operation, PolicyShadowTally
from operations.selectors.policies import shadow_summary
from operations.services import policies, shadow
from tests.operations.test_policies import BIG_REFUNDS, NO_HUGE, in_force, steward

NO_BIG = NO_HUGE.replace('"no-huge"', '"no-big"').replace("500000", "10000")
BIG_REFUNDS_V2 = BIG_REFUNDS.replace("10000 }", "50000 }")
HUGE = {"payment_id": "p", "amount_cents": 600000}


@pytest.fixture(autouse=True)
def _fresh_policies():
    policies.forget()
    yield
    policies.forget()


def watched(text: str) -> str:
    return services.policies.policy_write(user=steward(), text=text, shadow=True).policy_id


def counted(policy: str, would: str) -> float:
    value = REGISTRY.get_sample_value(
        "effectgate_policy_shadow_total", {"policy": policy, "would": would}
    )
    return value or 0.0


def register(api, run, arguments, capture, **extra):
    with capture(execute=True):
        return api.register(run, "refund", arguments, **extra)


def test_a_shadow_forbid_lets_the_registration_through_and_records_what_it_would_do(
    api, django_capture_on_commit_callbacks
):
    api.tool("refund")
    watched(NO_HUGE)
    before = counted("no-huge", "forbid")
    run = api.run()
    body = register(api, run, HUGE, django_capture_on_commit_callbacks)
    assert body["status"] in ("ready", "executing")
    assert Operation.objects.filter(pk=body["id"]).exists()

    tally = PolicyShadowTally.objects.get(policy_id="no-huge")
    assert (tally.version, tally.would, tally.count, tally.diverged) == (1, "forbid", 1, 1)
    (example,) = tally.examples
    assert (example["operation"], example["tool"], example["in_force"]) == (
        body["id"],
        "refund",
        "none",
    )
    assert "amount_cents" not in str(tally.examples)
    event = Event.objects.get(stream="policy:no-huge", kind=EventKind.POLICY_SHADOW_DIVERGED)
    assert (event.data["operation"], event.data["would"], event.data["version"]) == (
        body["id"],
        "forbid",
        1,
    )
    assert counted("no-huge", "forbid") == before + 1

    # Below the bound it neither matches nor writes anything.
    register(api, run, {"payment_id": "p", "amount_cents": 5}, django_capture_on_commit_callbacks)
    assert PolicyShadowTally.objects.get(policy_id="no-huge").count == 1
    assert counted("no-huge", "forbid") == before + 1


def test_divergence_events_are_capped_per_hour_and_the_rest_counted_in_the_tally(
    api, django_capture_on_commit_callbacks, monkeypatch
):
    monkeypatch.setattr(shadow, "EVENTS_PER_HOUR", 2)
    monkeypatch.setattr(shadow, "EXAMPLES", 3)
    api.tool("refund")
    watched(NO_HUGE)
    run = api.run()
    ids = [register(api, run, HUGE, django_capture_on_commit_callbacks)["id"] for _ in range(5)]
    tally = PolicyShadowTally.objects.get(policy_id="no-huge")
    assert (tally.count, tally.diverged) == (5, 5)
    # The newest examples, newest first, no more than kept.
    assert [example["operation"] for example in tally.examples] == ids[::-1][:3]
    events = Event.objects.filter(stream="policy:no-huge", kind=EventKind.POLICY_SHADOW_DIVERGED)
    assert [event.data["operation"] for event in events.order_by("seq")] == ids[:2]


def test_a_shadow_policy_that_agrees_with_the_policies_in_force_does_not_diverge(
    api, django_capture_on_commit_callbacks
):
    api.tool("refund")
    in_force(BIG_REFUNDS)
    watched(NO_BIG.replace("forbid(", '@approval("required")\npermit('))
    run = api.run()
    body = register(
        api, run, {"payment_id": "p", "amount_cents": 20000}, django_capture_on_commit_callbacks
    )
    assert body["status"] == "awaiting_approval"
    tally = PolicyShadowTally.objects.get(policy_id="no-big")
    assert (tally.would, tally.count, tally.diverged) == ("require", 1, 0)
    assert tally.examples[0]["in_force"] == "require"
    assert not Event.objects.filter(kind=EventKind.POLICY_SHADOW_DIVERGED).exists()


def test_a_new_version_of_an_active_policy_in_shadow_says_it_would_no_longer_ask(
    api, django_capture_on_commit_callbacks
):
    api.tool("refund")
    in_force(BIG_REFUNDS)
    watched(BIG_REFUNDS_V2)
    run = api.run()
    asked = register(
        api, run, {"payment_id": "p", "amount_cents": 20000}, django_capture_on_commit_callbacks
    )
    # The active version is still enforced.
    assert asked["status"] == "awaiting_approval"
    register(
        api, run, {"payment_id": "p", "amount_cents": 90000}, django_capture_on_commit_callbacks
    )
    rows = {
        row.would: (row.version, row.count, row.diverged)
        for row in PolicyShadowTally.objects.filter(policy_id="big-refunds")
    }
    assert rows == {"none": (2, 1, 1), "require": (2, 1, 0)}
    (event,) = Event.objects.filter(kind=EventKind.POLICY_SHADOW_DIVERGED)
    assert (event.data["operation"], event.data["would"]) == (asked["id"], "none")


def test_a_registration_the_policies_in_force_refuse_is_observed_without_an_operation(api):
    api.tool("refund")
    in_force(NO_HUGE)
    watched(NO_BIG)
    api.register(api.run(), "refund", HUGE, expect=403)
    tally = PolicyShadowTally.objects.get(policy_id="no-big")
    assert (tally.would, tally.count, tally.diverged) == ("forbid", 1, 0)
    assert tally.examples[0]["operation"] == ""


def test_without_a_policy_in_shadow_nothing_is_tallied(api, django_capture_on_commit_callbacks):
    api.tool("refund")
    in_force(NO_HUGE)
    register(
        api, api.run(), {"payment_id": "p", "amount_cents": 5}, django_capture_on_commit_callbacks
    )
    assert not PolicyShadowTally.objects.exists()


def test_the_summary_counts_each_effect_and_shows_the_newest_examples(
    api, django_capture_on_commit_callbacks
):
    api.tool("refund")
    watched(NO_HUGE)
    watched(BIG_REFUNDS)
    run = api.run()
    for amount in (600000, 600000, 20000):
        register(
            api,
            run,
            {"payment_id": "p", "amount_cents": amount},
            django_capture_on_commit_callbacks,
        )
    reader = steward()
    summary = shadow_summary(user=reader, policy_id="big-refunds")
    assert summary["counts"] == {"forbid": 0, "require": 3, "permit": 0, "none": 0}
    assert summary["total_diverged"] == 3
    assert len(summary["examples"]) == 3
    forbids = selectors.policies.shadow_summary(user=reader, policy_id="no-huge")
    assert (forbids["counts"]["forbid"], forbids["versions"]) == (2, [1])


def test_the_policy_page_fragment_says_what_it_would_have_done(
    api, django_capture_on_commit_callbacks
):
    from django.template.loader import render_to_string

    api.tool("refund")
    watched(BIG_REFUNDS)
    run = api.run()
    body = register(
        api, run, {"payment_id": "p", "amount_cents": 20000}, django_capture_on_commit_callbacks
    )
    summary = shadow_summary(user=steward(), policy_id="big-refunds")
    html = render_to_string("console/policies/_shadow.html", {"shadow_figures": summary})
    assert "would have asked 1 approval\n    and forbidden 0" in html
    assert f"/operations/{body['id']}/" in html
    empty = shadow_summary(user=steward(), policy_id="no-huge")
    assert "In shadow" not in render_to_string(
        "console/policies/_shadow.html", {"shadow_figures": empty}
    )
    assert "Nothing watched in shadow" in render_to_string(
        "console/policies/_shadow.html",
        {"shadow_figures": empty, "policy": {"shadow_version_id": 3}},
    )
