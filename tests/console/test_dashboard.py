"""The dashboard's figures, its visibility rules, its charts and its live partial."""

from datetime import UTC, datetime, timedelta

import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from guardian.shortcuts import assign_perm

from operations import selectors, services
from operations.models import Operation, Tool
from tests.approvals.conftest import person
from tests.conftest import contract
from tests.support.db import ON_POSTGRESQL

from .conftest import client_for

NOON = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
START = datetime(2026, 2, 25, 0, 0, tzinfo=UTC)  # 14 days ending on NOON's day


def test_states_count_open_operations_and_recent_ends_of_visible_tools(world, viewer, superuser):
    states = selectors.dashboard_states(user=viewer, since=START)
    assert states["ready"] == 3
    assert states["outcome_unknown"] == 0  # the unknown one is a "wipe"
    everything = selectors.dashboard_states(user=superuser, since=START)
    assert everything["outcome_unknown"] == 1
    html = client_for(viewer).get("/dashboard/").content.decode()
    assert "3 open now" in html


def _approval_tool(api):
    api.tool("payout", contract("irreversible", approval={"mode": "always"}))
    approver = person()
    assign_perm("operations.decide_tool", approver, Tool.objects.get(pk="payout"))
    return approver


def test_pending_approvals_by_age(api):
    approver = _approval_tool(api)
    run = api.run()
    for minutes in (5, 30, 300):
        with time_machine.travel(NOON - timedelta(minutes=minutes), tick=False):
            api.register(run, "payout")
    ages = dict(selectors.dashboard_pending_ages(user=approver, now=NOON))
    assert ages == {
        "under 15 min": 1,
        "15-60 min": 1,
        "1-4 h": 0,
        "4-24 h": 1,
        "over 1 day": 0,
    }
    assert sum(dict(selectors.dashboard_pending_ages(user=person(), now=NOON)).values()) == 0


def test_approval_latency_percentiles(api):
    approver = _approval_tool(api)
    run = api.run()
    for minutes in (1, 2, 3, 4, 100):
        with time_machine.travel(NOON - timedelta(hours=2), tick=False):
            op = api.register(run, "payout")
        with time_machine.travel(NOON - timedelta(hours=2) + timedelta(minutes=minutes)):
            services.approval_decide(
                request_id=op["approval"]["id"], user=approver, approve=True, comment=""
            )
    [day, week] = selectors.dashboard_approval_latency(
        user=approver,
        now=NOON,
        windows=[("day", timedelta(days=1)), ("week", timedelta(days=7))],
    )
    assert day["count"] == 5
    assert round(day["p50"].total_seconds() / 60) == 3
    assert round(day["p95"].total_seconds() / 60) == 100
    assert week["count"] == 5
    nobody = selectors.dashboard_approval_latency(
        user=person(), now=NOON, windows=[("day", timedelta(days=1))]
    )
    assert nobody[0]["count"] == 0
    assert nobody[0]["p50"] is None


def test_latency_takes_the_nearest_rank_and_one_query_on_postgresql(api):
    approver = _approval_tool(api)
    run = api.run()
    for minutes in (4, 1, 3, 2):
        with time_machine.travel(NOON - timedelta(hours=30), tick=False):
            op = api.register(run, "payout")
        with time_machine.travel(NOON - timedelta(hours=30) + timedelta(minutes=minutes)):
            services.approval_decide(
                request_id=op["approval"]["id"], user=approver, approve=True, comment=""
            )
    windows = [("day", timedelta(days=1)), ("week", timedelta(days=7))]
    with CaptureQueriesContext(connection) as queries:
        [day, week] = selectors.dashboard_approval_latency(user=approver, now=NOON, windows=windows)
    assert (day["count"], day["p50"], day["p95"]) == (0, None, None)
    # Four values: the median is the second (rank 2 of 4), p95 the fourth.
    assert week["count"] == 4
    assert round(week["p50"].total_seconds()) == 120
    assert round(week["p95"].total_seconds()) == 240
    decided = [q for q in queries.captured_queries if "approvals_approvalrequest" in q["sql"]]
    if ON_POSTGRESQL:  # elsewhere a count and a read per rank and window
        assert len(decided) == 1


def _unknown_at(api, run, moment):
    with time_machine.travel(moment, tick=False):
        op = api.register(run, "refund")
        api.claim(op["id"])
        api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout"})
    return op


def test_unknown_rate_and_backlog_per_day(api, superuser):
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    run = api.run()
    day = timedelta(days=1)
    first = _unknown_at(api, run, NOON - 3 * day)
    with time_machine.travel(NOON - 3 * day + timedelta(hours=1), tick=False):
        ok = api.register(run, "refund")
        api.claim(ok["id"])
        api.outcome(ok["id"], 1, {"kind": "succeeded"})
    _unknown_at(api, run, NOON - day)
    with time_machine.travel(NOON - day + timedelta(hours=2), tick=False):
        services.operation_resolve(
            operation=Operation.objects.get(pk=first["id"]),
            user=superuser,
            result="committed",
            downstream_id="re_1",
        )

    rate = {
        row["day"]: row
        for row in selectors.dashboard_unknown_rate(user=superuser, start=START, days=14)
    }
    three_days_ago = (NOON - 3 * day).date()
    assert (rate[three_days_ago]["outcomes"], rate[three_days_ago]["unknown"]) == (2, 1)
    assert rate[(NOON - day).date()]["unknown"] == 1

    backlog = {
        row["day"]: row
        for row in selectors.dashboard_backlog(user=superuser, start=START, days=14, now=NOON)
    }
    assert backlog[(NOON - 4 * day).date()]["count"] == 0
    assert backlog[(NOON - 3 * day).date()]["count"] == 1
    assert backlog[(NOON - 3 * day).date()]["oldest_age"] == timedelta(hours=12)
    assert backlog[(NOON - 2 * day).date()]["oldest_age"] == timedelta(hours=36)
    # The first was resolved the day the second appeared: one left, 12 hours old.
    assert backlog[(NOON - day).date()]["count"] == 1
    assert backlog[(NOON - day).date()]["oldest_age"] == timedelta(hours=12)
    # Today is measured at "now" (noon).
    assert backlog[NOON.date()]["oldest_age"] == timedelta(hours=24)


def test_backlog_remembers_operations_that_entered_before_the_window(api, superuser):
    api.tool("refund", contract("irreversible", approval={"mode": "never"}))
    run = api.run()
    old = _unknown_at(api, run, START - timedelta(days=2))
    with time_machine.travel(START + timedelta(days=1, hours=6), tick=False):
        services.operation_resolve(
            operation=Operation.objects.get(pk=old["id"]),
            user=superuser,
            result="committed",
            downstream_id="re_1",
        )
    backlog = selectors.dashboard_backlog(user=superuser, start=START, days=14, now=NOON)
    assert backlog[0]["count"] == 1
    assert backlog[0]["oldest_age"] == timedelta(days=3)
    assert backlog[1]["count"] == 0


def test_the_dashboard_hides_tools_the_person_may_not_see(world, viewer):
    response = client_for(viewer).get("/dashboard/")
    backlog = response.context["backlog"]
    assert all(row["count"] == 0 for row in backlog)
    counts = {row["status"]: row["count"] for row in response.context["open_states"]}
    assert counts["outcome_unknown"] == 0


def test_each_chart_is_for_the_eye_and_its_table_for_assistive_technology(world, viewer):
    html = client_for(viewer).get("/dashboard/").content.decode()
    charts = html.split('<svg class="chart"')[1:]
    assert len(charts) == 4  # ages, latency, rate, backlog
    for chart in charts:
        assert chart.startswith(' viewBox="0 0 440 170" aria-hidden="true" focusable="false">')
        # Right after the chart, its figures, in a table hidden from the eye.
        after = chart.split("</svg>", 1)[1].lstrip()
        assert after.startswith('<div class="visually-hidden">\n  <table>\n    <caption>')
    assert 'role="img"' not in html
    # Operations by state are one table on screen, its bars hidden from assistive technology.
    assert html.count('<svg class="share-bar"') == 12
    assert "style=" not in html
    assert "<script" not in html.split("</head>", 1)[1]


def test_the_latency_chart_draws_p50_and_p95_side_by_side_and_labelled(api):
    approver = _approval_tool(api)
    run = api.run()
    for minutes in (1, 1, 1, 1, 300):
        with time_machine.travel(NOON - timedelta(hours=6), tick=False):
            op = api.register(run, "payout")
        with time_machine.travel(NOON - timedelta(hours=6) + timedelta(minutes=minutes)):
            services.approval_decide(
                request_id=op["approval"]["id"], user=approver, approve=True, comment=""
            )
    with time_machine.travel(NOON, tick=False):
        response = client_for(approver).get("/dashboard/")
    chart = response.context["latency_chart"]
    [p50, p95] = chart.bars[:2]
    assert (p50["tone"], p95["tone"]) == ("info", "attention")
    # One minute against an axis of hours: still a visible bar, with its value.
    assert p50["height"] >= 3
    assert p95["height"] > p50["height"]
    html = response.content.decode()
    assert ">1 min</text>" in html
    assert ">p50</text>" in html
    assert ">p95</text>" in html


def test_the_dashboard_polls_and_answers_htmx_with_its_panels_only(viewer):
    client = client_for(viewer)
    page = client.get("/dashboard/").content.decode()
    assert 'hx-trigger="every 30s, refresh"' in page
    partial = client.get("/dashboard/", {"partial": "1"}, HTTP_HX_REQUEST="true")
    body = partial.content.decode()
    assert body.lstrip().startswith('<div id="dashboard-panels"')
    assert "<html" not in body


def test_the_dashboard_costs_the_same_number_of_queries_with_more_data(api, world, viewer):
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            client_for(viewer).get("/dashboard/")
        return len(queries.captured_queries)

    before = count()
    run = api.run()
    for _ in range(5):
        op = api.register(run, "refund")
        api.claim(op["id"])
        api.outcome(op["id"], 1, {"kind": "unknown", "code": "timeout"})
    assert count() == before
