"""The policy pages (docs/policies.md, "Writing policies in the console"): only people
who manage policies reach them; each button shows exactly when its service would act;
the author's activate button is disabled with the reason; the editor answers with
Cedar's messages; refusals become messages."""

import pytest
from django.urls import reverse
from guardian.shortcuts import assign_perm

from console.views import simulation as simulation_views
from operations.models import Event, Policy, PolicyVersion, Tool
from operations.policies.simulation import Simulation
from operations.services import policies, simulation
from tests.approvals.conftest import person
from tests.console.conftest import client_for
from tests.operations.test_policies import NO_HUGE, steward

NO_HUGE_V2 = NO_HUGE.replace("500000", "400000").replace("5000.00", "4000.00")


@pytest.fixture(autouse=True)
def _fresh_policies():
    policies.forget()
    yield
    policies.forget()


@pytest.fixture
def ann(db):
    return steward("ann")


@pytest.fixture
def bob(db):
    return steward("bob")


@pytest.fixture
def draft(ann):
    return policies.policy_write(user=ann, text=NO_HUGE)


def page(client, name, *args):
    return client.get(reverse(name, args=args))


def test_every_page_and_action_is_403_without_manage_policies(db, draft):
    outsider = client_for(person(username="eve"))
    for name, args in [
        ("console:policies", ()),
        ("console:policy", ("no-huge",)),
        ("console:policy-editor", ()),
    ]:
        assert page(outsider, name, *args).status_code == 403
    for name, args in [
        ("console:policy-validate", ()),
        ("console:policy-save", ()),
        ("console:policy-shadow", ("no-huge",)),
        ("console:policy-activate", ("no-huge",)),
        ("console:policy-retire", ("no-huge",)),
    ]:
        response = outsider.post(reverse(name, args=args), {"text": NO_HUGE, "version": "1"})
        assert response.status_code == 403
    assert Policy.objects.get().state == "draft"
    assert PolicyVersion.objects.count() == 1
    # No link to what they may not open.
    assert 'href="/policies/"' not in page(outsider, "console:inbox").content.decode()


def test_the_nav_links_the_list_which_shows_each_policy(ann, draft):
    client = client_for(ann)
    assert 'href="/policies/"' in page(client, "console:inbox").content.decode()
    body = page(client, "console:policies").content.decode()
    assert 'href="/policies/no-huge/"' in body
    for shown in ("draft", "forbid", "Nobody refunds more than 5000.00", "v1"):
        assert shown in body


def test_the_author_sees_shadow_and_a_disabled_activate_with_the_reason(ann, draft):
    body = page(client_for(ann), "console:policy", "no-huge").content.decode()
    assert "Shadow v1" in body
    assert "disabled" in body.split("Activate v1")[0].rsplit("<button", 1)[1]
    assert "You wrote version 1 of no-huge; another person who manages policies" in body
    assert "Retire policy" in body


def test_a_second_person_sees_the_diff_and_an_enabled_activate(ann, bob, draft):
    body = page(client_for(bob), "console:policy", "no-huge").content.decode()
    assert "disabled" not in body.split("Activate v1")[0].rsplit("<button", 1)[1]
    assert "You wrote" not in body
    policies.policy_activate(user=bob, policy_id="no-huge")
    policies.policy_write(user=ann, text=NO_HUGE_V2)
    body = page(client_for(bob), "console:policy", "no-huge").content.decode()
    assert '<span class="diff-del"><span class="visually-hidden">removed: </span>-' in body
    assert "+@message(&quot;Nobody refunds more than 4000.00&quot;)" in body
    assert "Activate v2" in body
    assert "Shadow v2" in body


def test_an_active_newest_version_shows_no_shadow_nor_activate_and_a_retired_no_retire(
    ann, bob, draft
):
    policies.policy_activate(user=bob, policy_id="no-huge")
    body = page(client_for(ann), "console:policy", "no-huge").content.decode()
    assert "Shadow v1" not in body
    assert "Activate v1" not in body
    assert "Retire policy" in body
    policies.policy_retire(user=ann, policy_id="no-huge")
    body = page(client_for(ann), "console:policy", "no-huge").content.decode()
    assert "Retire policy" not in body
    assert "Activate v1" in body  # a retired text is in force again only with four eyes
    assert "Shadow v1" in body


def test_a_shadowed_newest_version_shows_no_shadow_button(ann, draft):
    policies.policy_shadow(user=ann, policy_id="no-huge")
    body = page(client_for(ann), "console:policy", "no-huge").content.decode()
    assert "Shadow v1" not in body
    assert "Activate v1" in body


def test_the_authors_activation_is_refused_with_a_message_and_changes_nothing(ann, draft):
    client = client_for(ann)
    response = client.post(
        reverse("console:policy-activate", args=["no-huge"]), {"version": "1"}, follow=True
    )
    assert "Not activated. You wrote version 1 of no-huge" in response.content.decode()
    assert Policy.objects.get().state == "draft"


def test_activate_acts_on_the_version_the_person_saw(ann, bob, draft):
    policies.policy_write(user=steward("cid"), text=NO_HUGE_V2)
    client_for(bob).post(reverse("console:policy-activate", args=["no-huge"]), {"version": "1"})
    assert Policy.objects.get().active_version.number == 1


def test_shadow_activate_and_retire_through_the_pages(ann, bob, draft):
    client_for(ann).post(reverse("console:policy-shadow", args=["no-huge"]), {"version": "1"})
    assert Policy.objects.get().state == "shadow"
    response = client_for(bob).post(
        reverse("console:policy-activate", args=["no-huge"]), {"version": "1"}, follow=True
    )
    assert "Version 1 of no-huge is in force." in response.content.decode()
    assert Policy.objects.get().state == "active"
    client_for(ann).post(reverse("console:policy-retire", args=["no-huge"]), {"reason": "done"})
    assert Policy.objects.get().state == "retired"
    kinds = list(
        Event.objects.filter(stream="policy:no-huge").order_by("seq").values_list("kind", flat=True)
    )
    assert kinds == ["policy_written", "policy_shadowed", "policy_activated", "policy_retired"]
    body = page(client_for(ann), "console:policy", "no-huge").content.decode()
    assert "policy_retired" in body


def test_the_editor_validates_with_cedars_message_and_says_what_a_valid_text_does(ann, api):
    api.tool("refund")
    client = client_for(ann)
    wrong = NO_HUGE.replace("context.arguments has amount_cents && ", "").replace(
        "amount_cents >", "amount_cent >"
    )
    response = client.post(
        reverse("console:policy-validate"), {"text": wrong}, HTTP_HX_REQUEST="true"
    )
    body = response.content.decode()
    assert "<html" not in body
    assert "Cedar refuses the policy" in body
    assert "for tool refund: attribute `arguments.amount_cent`" in body
    response = client.post(
        reverse("console:policy-validate"), {"text": NO_HUGE}, HTTP_HX_REQUEST="true"
    )
    assert "valid: forbid, applies to every tool" in response.content.decode()
    # Without JavaScript: the whole editor with the answer and the text kept.
    response = client.post(reverse("console:policy-validate"), {"text": NO_HUGE})
    assert "<html" in response.content.decode()
    assert "valid: forbid" in response.content.decode()
    assert not Policy.objects.exists()


def test_the_editor_saves_a_draft_or_a_shadow_and_refuses_a_wrong_text(ann, api):
    api.tool("refund")
    client = client_for(ann)
    response = client.post(
        reverse("console:policy-save"), {"text": "forbid(principal, action, resource);"}
    )
    assert response.status_code == 422
    assert "A policy needs an @id" in response.content.decode()
    assert not Policy.objects.exists()
    response = client.post(reverse("console:policy-save"), {"text": NO_HUGE, "mode": "draft"})
    assert response.status_code == 302
    assert response["Location"] == reverse("console:policy", args=["no-huge"])
    assert Policy.objects.get().state == "draft"
    response = client.post(reverse("console:policy-save"), {"text": NO_HUGE}, follow=True)
    assert "Unchanged: version 1 of no-huge has this text (draft)." in response.content.decode()
    response = client.post(
        reverse("console:policy-save"), {"text": NO_HUGE_V2, "mode": "shadow"}, follow=True
    )
    assert "Saved version 2 of no-huge (in shadow)." in response.content.decode()
    policy = Policy.objects.get()
    assert (policy.state, policy.shadow_version.number) == ("shadow", 2)


def test_the_editor_starts_from_the_newest_text_of_a_policy(ann, draft):
    body = client_for(ann).get(reverse("console:policy-editor") + "?policy=no-huge")
    assert "@id(&quot;no-huge&quot;)" in body.content.decode()
    assert client_for(ann).get(reverse("console:policy-editor") + "?policy=none").status_code == 404


def test_the_shadow_slot_renders_nothing_without_its_data(ann, draft):
    body = page(client_for(ann), "console:policy", "no-huge").content.decode()
    assert 'id="shadow-figures"' not in body


def test_a_policy_that_asks_offers_a_standing_grant_for_its_tools(ann, api, draft):
    from tests.operations.test_policies import BIG_REFUNDS

    api.tool("refund")
    scoped = BIG_REFUNDS.replace('@id("big-refunds")', '@id("scoped")').replace(
        "resource)", 'resource == Tool::"refund")'
    )
    policies.policy_write(user=ann, text=scoped)
    body = page(client_for(ann), "console:policy", "scoped").content.decode()
    assert "/standing-grants/?tool=refund#issue" in body
    policies.policy_write(user=ann, text=BIG_REFUNDS)
    body = page(client_for(ann), "console:policy", "big-refunds").content.decode()
    assert 'standing-grants/#issue">Issue a standing grant<' in body
    # A forbid asks for nobody: no standing grant to offer.
    forbid = page(client_for(ann), "console:policy", "no-huge")
    assert forbid.status_code == 200
    assert "Issue a standing grant" not in forbid.content.decode()


# ---------------------------------------------------------------------------------------
# Simulation before activating (docs/policies.md#simulation)


def _seed_refunds(api) -> list[str]:
    """Three registrations of ``refund``: two the no-huge forbid would have refused."""
    api.tool("refund")
    run = api.run()
    return [
        api.register(run, "refund", {"payment_id": f"p{amount}", "amount_cents": amount})["id"]
        for amount in (600000, 5, 700000)
    ]


def simulate(client, policy_id, query=""):
    return client.get(reverse("console:policy-simulate", args=[policy_id]) + query)


def test_the_policy_page_links_the_simulation_of_its_newest_version(ann, draft):
    policies.policy_write(user=ann, text=NO_HUGE_V2)
    body = page(client_for(ann), "console:policy", "no-huge").content.decode()
    assert '<a href="/policies/no-huge/simulate?version=2" class="button">Simulate</a>' in body


def test_the_simulation_page_is_403_without_manage_policies(db, api, draft, bob):
    _seed_refunds(api)
    outsider = person(username="eve")
    assign_perm("operations.decide_tool", outsider, Tool.objects.get(pk="refund"))
    assert simulate(client_for(outsider), "no-huge").status_code == 403
    assert simulate(client_for(bob), "none").status_code == 404


def test_the_simulation_page_shows_the_counts_and_links_visible_examples(ann, api, draft):
    huge, _small, huger = _seed_refunds(api)
    response = simulate(client_for(ann), "no-huge", "?days=3")
    assert response.status_code == 200
    body = response.content.decode()
    assert "3 operations replayed." in body
    for name, count in [
        ("newly_asking", 0),
        ("newly_forbidden", 2),
        ("no_longer_asking", 0),
        ("no_longer_forbidden", 0),
    ]:
        label = name.replace("_", " ")
        row = f'<tr id="count-{name}"><th scope="row">{label}</th><td class="num">{count}</td>'
        assert row in body
    assert 'value="3"' in body
    assert "The owners of the runner and of the tool are today&#x27;s." in body
    assert "simulation-truncated" not in body
    # Ann manages policies but may not see refund's operations: the ids, no links.
    assert huge in body
    assert huger in body
    assert f'href="/operations/{huge}/"' not in body
    assert "(you may not see it)" in body
    # Once she may decide on refund, the examples link to the operations.
    assign_perm("operations.decide_tool", ann, Tool.objects.get(pk="refund"))
    body = simulate(client_for(ann), "no-huge").content.decode()
    assert f'href="/operations/{huge}/"' in body
    assert f'href="/operations/{huger}/"' in body
    assert "(you may not see it)" not in body
    # Simulating wrote nothing.
    assert Policy.objects.get().state == "draft"
    assert not Event.objects.filter(stream="policy:no-huge", kind__contains="activ").exists()


def test_the_simulation_page_says_a_refusal_and_the_truncation(ann, api, draft, monkeypatch):
    _seed_refunds(api)
    client = client_for(ann)
    response = simulate(client, "no-huge", "?days=0")
    assert response.status_code == 422
    assert "A simulation replays 1 to 366 days." in response.content.decode()
    assert simulate(client, "no-huge", "?days=367").status_code == 400
    missing = simulate(client, "no-huge", "?version=9")
    assert "Policy no-huge has no version 9." in missing.content.decode()
    # A window holding more than the limit: only its newest are replayed, and it says so.
    monkeypatch.setattr(simulation, "MAX_OPERATIONS", 2)
    body = simulate(client, "no-huge").content.decode()
    assert "2 operations replayed." in body
    assert 'id="simulation-truncated"' in body


def test_the_simulation_page_escapes_what_it_shows(ann, api, monkeypatch):
    policies.policy_write(user=ann, text=NO_HUGE)
    result = Simulation(operations=1)
    result.changes["newly_asking"].count = 1
    result.changes["newly_asking"].examples.append(
        {
            "operation": "op_<b>x</b>",
            "tool": "<script>alert(1)</script>",
            "registered_at": "2026-11-01T12:00:00+00:00",
            "before": "none",
            "after": "require",
            "policies": ["<i>p</i>"],
        }
    )
    monkeypatch.setattr(simulation_views, "policy_simulate", lambda **kwargs: result)
    body = simulate(client_for(ann), "no-huge").content.decode()
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert "op_&lt;b&gt;x&lt;/b&gt;" in body
    assert "&lt;i&gt;p&lt;/i&gt;" in body
