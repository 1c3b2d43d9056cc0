"""Money at stake on the dashboard: per state, tool and currency, from each contract's
money field, added in the database; what counts and what does not."""

import re
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from guardian.shortcuts import assign_perm

from operations import selectors, services
from operations.models import Tool, ToolVersion
from tests.approvals.conftest import person
from tests.conftest import contract
from tests.support.db import skip_unless_postgresql
from tests.support.world import Direct

from .conftest import client_for


def money(pointer: str, currency: str, *, minor_units: bool = True, summary: str = "") -> dict:
    display = {
        "fields": {pointer: {"format": "money", "currency": currency, "minor_units": minor_units}}
    }
    if summary:
        display["summary"] = summary
    return display


# Any JSON value is admitted at /amount: what the dashboard counts is its business.
ANYTHING = {
    "type": "object",
    "required": ["payment_id"],
    "properties": {"payment_id": {"type": "string"}, "amount": {}},
    "additionalProperties": False,
}


@pytest.fixture
def direct(api):
    return Direct(api)


def _at_stake(user):
    return selectors.dashboard_money_at_stake(user=user)


def _register(direct, run, tool, amount, **arguments):
    return direct.register(run, tool, {"payment_id": "pay_1", "amount_cents": amount, **arguments})


def test_each_state_adds_its_own_operations_per_currency_in_its_units(direct, superuser):
    direct.tool("refund", contract("irreversible", display=money("/amount_cents", "EUR")))
    direct.tool(
        "ask_refund",
        contract(
            "irreversible", approval={"mode": "always"}, display=money("/amount_cents", "EUR")
        ),
    )
    direct.tool(
        "voucher", contract("compensable", display=money("/amount_cents", "JPY"))
    )  # yen have no minor unit: 3000 "minor units" are ¥3,000
    run = direct.run()
    _register(direct, run, "ask_refund", 75000)
    _register(direct, run, "ask_refund", 1)
    _register(direct, run, "refund", 1250)  # ready
    executing = _register(direct, run, "refund", 50)
    unknown = _register(direct, run, "refund", 999)
    done = _register(direct, run, "refund", 10)
    undo = _register(direct, run, "voucher", 3000)
    direct.claim(executing["id"])
    for op in (unknown, done, undo):
        direct.claim(op["id"])
    direct.outcome(unknown["id"], 1, {"kind": "unknown", "code": "timeout"})
    direct.outcome(undo["id"], 1, {"kind": "unknown", "code": "timeout"})
    direct.outcome(done["id"], 1, {"kind": "succeeded"})

    found = _at_stake(superuser)
    assert found.amounts == {
        ("awaiting_approval", "ask_refund", "EUR"): Decimal("750.01"),
        ("ready", "refund", "EUR"): Decimal("13.00"),  # ready 12.50 and executing 0.50
        ("outcome_unknown", "refund", "EUR"): Decimal("9.99"),
        ("compensating", "voucher", "JPY"): Decimal("3000"),
    }  # the succeeded one is settled: not at stake
    assert found.operations[("awaiting_approval", "ask_refund", "EUR")] == 2
    assert found.operations[("ready", "refund", "EUR")] == 2
    assert found.not_counted == {}
    assert found.without_field == {}
    assert all(isinstance(amount, Decimal) for amount in found.amounts.values())


def test_currencies_are_never_added_together_and_minor_units_follow_the_currency(direct, superuser):
    direct.tool("eur", contract("irreversible", display=money("/amount_cents", "EUR")))
    direct.tool("eur_too", contract("irreversible", display=money("/amount_cents", "EUR")))
    direct.tool("usd", contract("irreversible", display=money("/amount_cents", "USD")))
    direct.tool("kwd", contract("irreversible", display=money("/amount_cents", "KWD")))
    direct.tool(
        "chf_units",
        contract("irreversible", display=money("/amount_cents", "CHF", minor_units=False)),
    )
    run = direct.run()
    for tool, amount in [("eur", 101), ("eur_too", 299), ("usd", 5), ("kwd", 12345),
                         ("chf_units", 40)]:  # fmt: skip
        _register(direct, run, tool, amount)
    found = _at_stake(superuser)
    assert found.amounts == {
        ("ready", "eur", "EUR"): Decimal("1.01"),
        ("ready", "eur_too", "EUR"): Decimal("2.99"),
        ("ready", "usd", "USD"): Decimal("0.05"),
        ("ready", "kwd", "KWD"): Decimal("12.345"),  # three digits
        ("ready", "chf_units", "CHF"): Decimal("40"),  # already in francs
    }


def test_an_amount_whose_schema_says_its_currency_counts_without_a_display(direct, superuser):
    """``x-currency`` in the schema (docs/api.md, Display) makes money for the dashboard
    as it does for the queue and the approval page."""
    schema = {
        "type": "object",
        "required": ["payment_id", "amount_cents"],
        "properties": {
            "payment_id": {"type": "string"},
            "amount_cents": {"type": "integer", "x-currency": "GBP", "x-minor-units": True},
        },
    }
    direct.tool("gbp", contract("irreversible", input_schema=schema))
    _register(direct, direct.run(), "gbp", 1999)
    found = _at_stake(superuser)
    assert found.amounts == {("ready", "gbp", "GBP"): Decimal("19.99")}
    assert found.without_field == {}


def test_a_new_contract_version_may_change_the_currency_and_both_stay_apart(direct, superuser):
    direct.tool("payout", contract("irreversible", display=money("/amount_cents", "EUR")))
    run = direct.run()
    _register(direct, run, "payout", 100)
    direct.tool("payout", contract("irreversible", display=money("/amount_cents", "GBP")))
    # A changed display waits for a person (what approvers read changed).
    services.tool_version_activate(
        version=ToolVersion.objects.get(tool="payout", number=2), user=superuser
    )
    _register(direct, run, "payout", 200)
    assert _at_stake(superuser).amounts == {
        ("ready", "payout", "EUR"): Decimal("1.00"),
        ("ready", "payout", "GBP"): Decimal("2.00"),
    }


def test_tools_without_a_money_field_are_counted_apart_not_guessed(direct, superuser):
    direct.tool("voucher", contract("irreversible"))  # amount_cents, but no display
    direct.tool("labelled", contract("irreversible", display={"summary": "Pay {/amount_cents}"}))
    run = direct.run()
    _register(direct, run, "voucher", 700)
    _register(direct, run, "voucher", 800)
    _register(direct, run, "labelled", 900)
    found = _at_stake(superuser)
    assert found.amounts == {}
    assert found.without_field == {"voucher": 2, "labelled": 1}


def test_the_summary_names_the_amount_and_a_second_money_field_is_not_added(direct, superuser):
    display = {
        "summary": "Refund {/amount_cents} (fee {/fee})",
        "fields": {
            "/fee": {"format": "money", "currency": "EUR", "minor_units": True},
            "/amount_cents": {"format": "money", "currency": "EUR", "minor_units": True},
        },
    }
    schema = {
        "type": "object",
        "required": ["payment_id", "amount_cents"],
        "properties": {
            "payment_id": {"type": "string"},
            "amount_cents": {"type": "integer"},
            "fee": {"type": "integer"},
        },
    }
    direct.tool("refund", contract("irreversible", input_schema=schema, display=display))
    _register(direct, direct.run(), "refund", 1000, fee=30)
    assert _at_stake(superuser).amounts == {("ready", "refund", "EUR"): Decimal("10.00")}


HOSTILE = [
    ("-500", False),  # a negative amount would hide another's
    (-500, False),
    (1e40, False),  # 41 digits: over the display's 30
    ("1" * 31, False),
    ("1e5", False),
    ("12\n", False),
    (" 12", False),
    ("12,50", False),
    ("NaN", False),
    ("", False),
    (True, False),
    ({"value": 5}, False),
    ([5], False),
    (None, False),
    # Plain amounts count, strings too (the page shows them as money), exactly: no
    # float holds 30 digits, nor adds 0.1 and 0.2 to 0.3.
    ("12.50", True),
    ("1" + "0" * 28 + "1", True),
    ("1" + "0" * 28 + "1", True),
    (0.1, True),
    (0.2, True),
]


def test_hostile_amounts_are_not_added_and_are_counted_apart(direct, superuser):
    direct.tool(
        "loose",
        contract(
            "irreversible",
            input_schema=ANYTHING,
            display=money("/amount", "EUR", summary="Pay {/amount}"),
        ),
    )
    run = direct.run()
    for value, _ in HOSTILE:
        direct.register(run, "loose", {"payment_id": "pay_1", "amount": value})
    direct.register(run, "loose", {"payment_id": "pay_1"})  # no amount at all
    found = _at_stake(superuser)
    counted = sum(1 for _, counts in HOSTILE if counts)
    assert found.operations == {("ready", "loose", "EUR"): counted}
    # 12.50 + 2 x (10^29 + 1) + 0.1 + 0.2 cents, in euros.
    assert found.amounts == {("ready", "loose", "EUR"): Decimal("2000000000000000000000000000.148")}
    assert found.not_counted == {"loose": len(HOSTILE) - counted + 1}


def test_a_person_sees_only_the_money_of_tools_they_may_see(direct):
    direct.tool("refund", contract("irreversible", display=money("/amount_cents", "EUR")))
    direct.tool("wipe", contract("irreversible", display=money("/amount_cents", "EUR")))
    run = direct.run()
    _register(direct, run, "refund", 100)
    _register(direct, run, "wipe", 5000)
    viewer = person()
    assign_perm("operations.decide_tool", viewer, Tool.objects.get(pk="refund"))
    assert _at_stake(viewer).amounts == {("ready", "refund", "EUR"): Decimal("1.00")}
    assert _at_stake(person()).amounts == {}


def _money_query(user) -> str:
    with CaptureQueriesContext(connection) as queries:
        _at_stake(user)
    [sql] = [q["sql"] for q in queries.captured_queries if '"operations_operation"' in q["sql"]]
    return sql


def test_the_money_costs_the_same_queries_however_many_operations(direct, superuser):
    direct.tool("refund", contract("irreversible", display=money("/amount_cents", "EUR")))
    run = direct.run()
    _register(direct, run, "refund", 100)
    with CaptureQueriesContext(connection) as few:
        _at_stake(superuser)
    for amount in range(1, 31):
        _register(direct, run, "refund", amount)
    with CaptureQueriesContext(connection) as many:
        found = _at_stake(superuser)
    assert len(many.captured_queries) == len(few.captured_queries) <= 3
    assert found.operations[("ready", "refund", "EUR")] == 31


@skip_unless_postgresql("the sum and its plan are PostgreSQL's; SQLite adds in Python")
def test_on_postgresql_the_database_adds_the_amounts_through_the_status_indexes(direct, superuser):
    direct.tool("refund", contract("irreversible", display=money("/amount_cents", "EUR")))
    run = direct.run()
    for amount in range(1, 21):
        _register(direct, run, "refund", amount)
    sql = _money_query(superuser)
    # One row per version and state comes back, not one per operation.
    assert "SUM(" in sql
    assert "GROUP BY" in sql
    assert "::numeric" in sql
    with connection.cursor() as cursor:
        # A handful of rows: the planner would rather scan them; it must be able not to.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Seq Scan on operations_operation" not in plan, plan
    assert "op_status" in plan, plan


def _cells(html: str, header: str) -> list[str]:
    """The text of the row headed ``header`` in the page, tags dropped."""
    row = html.split(f'<th scope="row">{header}', 1)[1].split("</tr>", 1)[0]
    cells = [cell.split(">", 1)[1] for cell in row.split("<td")[1:]]
    return [" ".join(re.sub(r"<[^>]+>", " ", cell).split()) for cell in cells]


def test_the_page_shows_money_per_state_and_per_tool_never_adding_currencies(direct):
    direct.tool("refund", contract("irreversible", display=money("/amount_cents", "EUR")))
    direct.tool("points", contract("irreversible", display=money("/amount_cents", "JPY")))
    direct.tool("voucher", contract("irreversible"))
    direct.tool("wipe", contract("irreversible", display=money("/amount_cents", "EUR")))
    run = direct.run()
    _register(direct, run, "refund", 1250)
    _register(direct, run, "refund", 99_900)
    _register(direct, run, "points", 3000)
    _register(direct, run, "voucher", 700)
    _register(direct, run, "wipe", 1_000_000)
    viewer = person()
    for name in ("refund", "points", "voucher"):
        assign_perm("operations.decide_tool", viewer, Tool.objects.get(pk=name))

    html = client_for(viewer).get("/dashboard/").content.decode()
    assert "Tools without a money field are not counted." in html
    # Per state, a column per currency: euros and yen side by side, never one sum.
    assert _cells(html, "Ready or running") == ["€1,011.50 2 operations", "¥3,000 1 operation"]
    assert _cells(html, "Awaiting approval") == ["—", "—"]
    assert '<th scope="col" class="num">EUR</th><th scope="col" class="num">JPY</th>' in html
    # Per tool, a column per state.
    refund = _cells(html, '<a href="/operations/?tool=refund">refund</a>')
    assert refund == ["—", "€1,011.50 2 operations", "—", "—"]
    assert "Not counted, no money field:" in html
    assert '<a href="/tools/voucher/">voucher</a> (1 operation)' in html
    # The tool this person may not see is nowhere, nor its amount.
    assert "wipe" not in html
    assert "10,000.00" not in html
    # The live partial carries the same money.
    partial = client_for(viewer).get("/dashboard/", {"partial": "1"}, HTTP_HX_REQUEST="true")
    assert "€1,011.50" in partial.content.decode()


def test_without_any_money_field_the_page_says_so(direct, superuser):
    direct.tool("voucher", contract("irreversible"))
    _register(direct, direct.run(), "voucher", 700)
    html = client_for(superuser).get("/dashboard/").content.decode()
    assert "No money at stake in a tool with a money field." in html
    assert "By tool" not in html


def test_hostile_amounts_are_named_on_the_page_not_added(direct, superuser):
    direct.tool(
        "loose", contract("irreversible", input_schema=ANYTHING, display=money("/amount", "EUR"))
    )
    run = direct.run()
    direct.register(run, "loose", {"payment_id": "pay_1", "amount": "-5000"})
    direct.register(run, "loose", {"payment_id": "pay_1", "amount": "<b>9</b>"})
    direct.register(run, "loose", {"payment_id": "pay_1", "amount": 100})
    html = client_for(superuser).get("/dashboard/").content.decode()
    assert _cells(html, "Ready or running") == ["€1.00 1 operation"]
    assert "Not counted, the amount is not a plain amount" in html
    assert "loose (2 operations)" in html
    assert "<b>9</b>" not in html
