"""The operations list (filters, keyset pagination) and the header search."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console import pagination

from .conftest import client_for


def test_every_console_page_has_the_header_search(viewer):
    html = client_for(viewer).get("/operations/").content.decode()
    assert 'role="search"' in html
    assert 'action="/search/"' in html


def test_the_list_shows_only_operations_of_visible_tools(world, viewer):
    html = client_for(viewer).get("/operations/").content.decode()
    for op in world.visible:
        assert op["id"] in html
    assert world.hidden[0]["id"] not in html


def test_filters_by_status_tool_and_run(world, superuser):
    client = client_for(superuser)
    unknown = client.get("/operations/", {"status": "outcome_unknown"}).content.decode()
    assert world.hidden[0]["id"] in unknown
    assert world.visible[0]["id"] not in unknown
    by_tool = client.get("/operations/", {"tool": "refund"}).content.decode()
    assert world.visible[0]["id"] in by_tool
    assert world.hidden[0]["id"] not in by_tool
    by_run = client.get("/operations/", {"run": world.hidden_run}).content.decode()
    assert world.hidden[0]["id"] in by_run
    assert world.visible[0]["id"] not in by_run


def test_keyset_pages_walk_the_list_without_offset_or_count(world, viewer, monkeypatch):
    monkeypatch.setattr(pagination, "PAGE_SIZE", 2)
    client = client_for(viewer)
    newest_first = [op["id"] for op in reversed(world.visible)]
    with CaptureQueriesContext(connection) as queries:
        first = client.get("/operations/")
    statements = [query["sql"].upper() for query in queries.captured_queries]
    assert not any("OFFSET" in sql for sql in statements)
    assert not any("COUNT(" in sql and "OPERATIONS_OPERATION" in sql for sql in statements)
    page = first.context["page"]
    assert [op.id for op in page.items] == newest_first[:2]
    assert page.newer is None
    assert page.older == newest_first[1]

    second = client.get("/operations/", {"before": page.older}).context["page"]
    assert [op.id for op in second.items] == newest_first[2:]
    assert second.older is None
    assert second.newer == newest_first[2]

    back = client.get("/operations/", {"after": second.newer}).context["page"]
    assert [op.id for op in back.items] == newest_first[:2]
    assert back.first


@pytest.mark.parametrize("field", ["id", "operation_key", "idempotency_key", "call_id"])
def test_search_by_an_exact_value_opens_the_operation(world, viewer, field):
    op = world.visible[1]
    response = client_for(viewer).get("/search/", {"q": op[field]})
    assert response.status_code == 302
    assert response["Location"] == f"/operations/{op['id']}/"


def test_search_by_downstream_reference(world, viewer):
    op = world.visible[0]
    world.api.claim(op["id"])
    world.api.outcome(op["id"], 1, {"kind": "succeeded", "downstream_id": "re_found"})
    response = client_for(viewer).get("/search/", {"q": " re_found "})
    assert response["Location"] == f"/operations/{op['id']}/"


def test_search_with_several_matches_lists_them(world, viewer, other_api):
    # Operation keys are unique per runner: another runner may use the same one.
    world.api.put(f"/api/v1/tools/refund/invokers/{other_api.runner.name}", None)
    twin = other_api.register(
        other_api.run(), "refund", operation_key=world.visible[0]["operation_key"]
    )
    response = client_for(viewer).get("/search/", {"q": twin["operation_key"]})
    assert response.status_code == 200
    html = response.content.decode()
    assert twin["id"] in html
    assert world.visible[0]["id"] in html
    assert "2 operations match" in html


def test_search_never_finds_an_operation_of_a_hidden_tool(world, viewer):
    hidden = world.hidden[0]
    for value in (hidden["id"], hidden["idempotency_key"], "call-hidden"):
        response = client_for(viewer).get("/search/", {"q": value})
        assert response.status_code == 200
        assert response.context["results"] == []
        assert f'href="/operations/{hidden["id"]}/"' not in response.content.decode()
        assert "No operation you may see matches." in response.content.decode()


def test_search_by_run_id_opens_a_visible_run(world, viewer):
    response = client_for(viewer).get("/search/", {"q": world.visible_run})
    assert response["Location"] == f"/runs/{world.visible_run}/"
    hidden = client_for(viewer).get("/search/", {"q": world.hidden_run})
    assert hidden.status_code == 200


def test_search_without_a_query_shows_the_form(viewer):
    response = client_for(viewer).get("/search/")
    assert response.status_code == 200
    assert response.context["results"] == []


def test_a_detail_page_highlights_its_list_in_the_navigation(world, viewer):
    html = client_for(viewer).get(f"/operations/{world.visible[0]['id']}/").content.decode()
    assert '<a href="/operations/" aria-current="page">Operations</a>' in html
    run_page = client_for(viewer).get(f"/runs/{world.visible_run}/").content.decode()
    assert '<a href="/runs/" aria-current="page">Runs</a>' in run_page
