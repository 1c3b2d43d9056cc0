"""A runner sees only its own runs, operations and approvals."""

from tests.conftest import contract


def test_runner_b_gets_404_for_runner_a_objects(api, other_api):
    api.tool("t", contract("irreversible", approval={"mode": "always"}))
    run = api.run()
    op = api.register(run, "t")
    approval = op["approval"]["id"]
    for path in (
        f"/api/v1/runs/{run}",
        f"/api/v1/operations/{op['id']}",
        f"/api/v1/operations/{op['id']}/events",
        f"/api/v1/operations/{op['id']}/tool-result",
        f"/api/v1/approvals/{approval}",
    ):
        response = other_api.get(path)
        assert response.status_code == 404, path
        assert response.json()["code"] == "not_found"
    for path in (
        f"/api/v1/runs/{run}/cancel",
        f"/api/v1/operations/{op['id']}/attempts",
        f"/api/v1/operations/{op['id']}/reconciliations",
    ):
        assert other_api.post(path, {"result": "committed"}).status_code == 404, path
    assert other_api.register(run, "t", expect=404)["code"] == "not_found"
    listed = other_api.get("/api/v1/operations").json()
    assert listed["results"] == []
    assert api.get(f"/api/v1/runs/{run}").status_code == 200


def test_operation_keys_are_per_runner(api, other_api):
    api.tool("t")
    api.put(f"/api/v1/tools/t/invokers/{other_api.runner.name}", None)
    a = api.register(api.run(), "t", operation_key="same")
    b = other_api.register(other_api.run(), "t", operation_key="same")
    assert a["id"] != b["id"]


def test_list_filters_and_cursor_pagination(api):
    api.tool("t")
    run = api.run()
    ids = [api.register(run, "t")["id"] for _ in range(5)]
    first = api.get("/api/v1/operations", {"run": run, "limit": 2}).json()
    assert len(first["results"]) == 2
    second = api.get(first["next"]).json()
    third = api.get(second["next"]).json()
    seen = [o["id"] for page in (first, second, third) for o in page["results"]]
    assert sorted(seen) == sorted(ids)
    assert third["next"] is None
    assert api.get("/api/v1/operations", {"status": "executing"}).json()["results"] == []
