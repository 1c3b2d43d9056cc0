"""Search that finds: substrings of keys, argument values, principals and ids, filters
by principal and date, and saved views."""

from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.utils import timezone

from operations import search
from operations.models import Operation, SavedView
from tests.approvals.conftest import person
from tests.support.db import skip_unless_postgresql
from tests.support.world import Direct

from .conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def ops(world):
    direct = Direct(world.api)  # the tests are about the search, not about registering
    run = direct.run("user:Newcomer")
    found = {
        "order": direct.register(
            run, "refund", {"payment_id": "pay_x", "amount_cents": 1}, operation_key="order-551"
        ),
        "argument": direct.register(
            run, "refund", {"payment_id": "pay_nc_unknown", "amount_cents": 2}, call_id="c-1"
        ),
        "literal": direct.register(
            run, "refund", {"payment_id": "100%_off", "amount_cents": 3}, operation_key="k%_1"
        ),
    }
    return world, found


def _listed(client, query, **params):
    response = client.get("/operations/", {"q": query, **params})
    assert response.status_code == 200
    return {op.id for op in response.context["page"].items}


@pytest.mark.parametrize(
    ("query", "which"),
    [
        ("der-55", "order"),  # a part of an operation key
        ("ORDER-551", "order"),  # case does not matter
        ("pay_nc", "argument"),  # an argument value
        ("nc_unk", "argument"),
    ],
)
def test_a_part_of_a_key_or_an_argument_finds_the_operation(ops, viewer, query, which):
    _, found = ops
    assert _listed(client_for(viewer), query) == {found[which]["id"]}


def test_principal_and_a_part_of_an_id_find_every_operation_that_holds_them(ops, viewer):
    _, found = ops
    client = client_for(viewer)
    assert _listed(client, "user:newcomer") == {op["id"] for op in found.values()}
    some = found["argument"]["id"]
    assert some in _listed(client, some[3:15])


def test_like_wildcards_are_literal(ops, viewer):
    _, found = ops
    # "%" and "_" match only themselves: "%_o" would otherwise match almost anything.
    assert _listed(client_for(viewer), "%_o") == {found["literal"]["id"]}


def test_search_never_finds_an_operation_of_a_hidden_tool(ops, viewer):
    world, _ = ops
    hidden = world.hidden[0]
    assert _listed(client_for(viewer), hidden["id"][3:15]) == set()
    page = client_for(viewer).get("/search/", {"q": hidden["operation_key"][:8]})
    assert hidden["id"] not in page.content.decode()


def test_the_header_search_lists_substring_matches_with_where_they_matched(ops, viewer):
    _, found = ops
    response = client_for(viewer).get("/search/", {"q": "newcomer"})
    html = response.content.decode()
    assert response.status_code == 200
    for op in found.values():
        assert op["id"] in html
    assert ">principal<" in html
    one = client_for(viewer).get("/search/", {"q": "pay_nc_unk"})
    assert one.status_code == 302  # one match opens it
    assert one.url == f"/operations/{found['argument']['id']}/"


def test_short_text_matches_only_exactly(ops, viewer, world):
    api = world.api
    short = api.register(world.visible_run, "refund", operation_key="ab")
    assert _listed(client_for(viewer), "ab") == {short["id"]}


def test_filters_by_principal_and_day_registered(ops, viewer):
    world, found = ops
    client = client_for(viewer)
    newcomer = {op["id"] for op in found.values()}
    assert {
        op.id for op in client.get("/operations/", {"principal": "newcomer"}).context["page"].items
    } == newcomer
    with time_machine.travel(timezone.now() - timedelta(days=3)):
        old = world.api.register(world.visible_run, "refund", operation_key="three-days-ago")
    today = timezone.now().date()
    recent = client.get("/operations/", {"since": today.isoformat()}).context["page"].items
    assert old["id"] not in {op.id for op in recent}
    assert newcomer <= {op.id for op in recent}
    earlier = (
        client.get("/operations/", {"until": (today - timedelta(days=2)).isoformat()})
        .context["page"]
        .items
    )
    assert {op.id for op in earlier} == {old["id"]}
    bad = client.get("/operations/", {"since": "yesterday"}, follow=True).content.decode()
    assert "is not a date" in bad


def test_a_person_saves_opens_and_deletes_a_view(ops, viewer):
    client = client_for(viewer)
    query = "q=newcomer&status=ready&cursor=op_zzz"
    response = client.post(
        "/views/save", {"list_name": "operations", "name": "  Newcomer   ready ", "query": query}
    )
    view = SavedView.objects.get(user=viewer)
    assert view.name == "Newcomer ready"
    assert view.query == "q=newcomer&status=ready"  # no page cursor kept
    assert response.url == "/operations/?q=newcomer&status=ready"
    html = client.get("/operations/").content.decode()
    assert "Newcomer ready" in html
    assert 'href="?q=newcomer&amp;status=ready"' in html
    # Nobody else sees it, nor deletes it.
    other = client_for(person(username="other"))
    assert "Newcomer ready" not in other.get("/operations/").content.decode()
    other.post(f"/views/{view.id}/delete", {"list_name": "operations"})
    assert SavedView.objects.filter(pk=view.pk).exists()
    # Saving again under the same name replaces it; a blank name is refused.
    client.post(
        "/views/save", {"list_name": "operations", "name": "Newcomer ready", "query": "q=x"}
    )
    assert SavedView.objects.get(user=viewer).query == "q=x"
    refused = client.post(
        "/views/save", {"list_name": "operations", "name": " ", "query": "q=x"}, follow=True
    )
    assert "Give the view a name." in refused.content.decode()
    client.post(f"/views/{view.id}/delete", {"list_name": "operations"})
    assert not SavedView.objects.exists()


def test_the_queue_keeps_saved_views_too(ops, viewer, superuser):
    client = client_for(superuser)
    client.post(
        "/views/save",
        {"list_name": "reconciliation", "name": "Old unknowns", "query": "min_age_m=15&tool=wipe"},
    )
    html = client.get("/reconciliation/").content.decode()
    assert "Old unknowns" in html
    assert 'href="?min_age_m=15&amp;tool=wipe"' in html


@skip_unless_postgresql(
    "the trigram index exists only on PostgreSQL (SQLite, the local mode, scans)",
)
def test_on_postgresql_the_trigram_index_answers_the_search(ops, viewer):
    queryset = search.substring_filter(Operation.objects.all(), "der-55")
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        # A handful of rows: the planner would rather scan them; it must be able not to.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "op_search_trgm" in plan, plan


def test_a_view_too_long_to_save_is_refused(ops, viewer):
    client = client_for(viewer)
    response = client.post(
        "/views/save",
        {"list_name": "operations", "name": "long", "query": "q=" + "é" * 600},
        follow=True,
    )
    assert "too long to save" in response.content.decode()
    assert not SavedView.objects.exists()
