"""console.charts: budget bars, axis maxima, durations and chart geometry (no database)."""

from datetime import timedelta
from decimal import Decimal

import pytest

from console.charts import (
    MIN_BAR,
    bar,
    bar_chart,
    duration_text,
    grouped_bar_chart,
    line_chart,
    money_text,
    nice_max,
    shares,
    short_duration,
)


def test_bars_say_how_much_is_used_and_change_tone_near_the_limit():
    assert bar("Calls", 3, 10, "3", "10").tone == "ok"
    assert bar("Calls", 8, 10, "8", "10").tone == "warn"
    assert bar("Spend", 0.04, 0.05, "0.04", "0.05").tone == "warn"
    over = bar("Calls", 12, 10, "12", "10")
    assert (over.tone, over.percent) == ("over", 100.0)
    unlimited = bar("Calls", 3, None, "3", "None")
    assert unlimited.percent is None
    assert unlimited.description == "Calls: 3, no limit"
    assert bar("Spend", 0, 0, "0", "0").tone == "over"


@pytest.mark.parametrize(
    ("value", "unit", "expected"),
    [(0, "", 1), (3, "", 5), (7, "", 10), (118, "", 200), (0.4, "", 0.5), (45, "%", 50),
     (100, "s", 120), (3 * 3600 + 1, "s", 4 * 3600), (0, "s", 60)],
)  # fmt: skip
def test_axis_maxima_are_round(value, unit, expected):
    assert nice_max(value, unit) == expected


def test_durations_read_as_people_say_them():
    assert duration_text(None) == "—"
    assert duration_text(42) == "42 s"
    assert duration_text(95) == "1 min 35 s"
    assert duration_text(timedelta(minutes=25)) == "25 min"
    assert duration_text(timedelta(hours=4)) == "4 h"
    assert duration_text(timedelta(days=1, hours=6)) == "1 d 6 h"
    assert short_duration(7200) == "2 h"
    assert short_duration(90) == "1.5 min"
    assert money_text(Decimal("0.040000")) == "0.04"
    assert money_text(None) == "—"


def test_bar_chart_geometry_stays_inside_the_plot():
    chart = bar_chart([("a", 1), ("b", 4), ("c", 0)])
    heights = [b["height"] for b in chart.bars]
    assert heights[1] > heights[0] > heights[2] == 0
    for b in chart.bars:
        assert chart.left <= b["x"]
        assert b["x"] + b["width"] <= chart.right
        assert b["y"] + b["height"] == pytest.approx(chart.baseline)
    # Counts get no gridline at 2.5.
    assert [t["text"] for t in chart.ticks] == ["0", "5"]


def test_line_chart_skips_missing_values_and_labels_from_the_end():
    chart = line_chart([(f"d{i}", None if i == 2 else i) for i in range(7)], label_every=3)
    assert len(chart.dots) == 6
    assert [label["lines"][0] for label in chart.labels] == ["d0", "d3", "d6"]
    assert chart.labels[-1]["anchor"] == "end"
    assert chart.points.count(",") == 6


def test_a_small_value_keeps_a_visible_bar_and_every_bar_says_its_value():
    chart = bar_chart([("a", 1), ("b", 1000), ("c", 0)])
    assert chart.bars[0]["height"] == MIN_BAR
    assert chart.bars[2]["height"] == 0
    assert [b["value"] for b in chart.bars] == ["1", "1000", "0"]
    for b in chart.bars:
        assert b["value_y"] < b["y"]  # written above its bar
        assert b["value_y"] > 0


def test_grouped_bars_draw_two_series_side_by_side_with_a_legend():
    # p50 of 5 s and p95 of 2 h in the first window: the p50 bar would round to nothing.
    chart = grouped_bar_chart(
        [("24 h", [5, 7200]), ("7 d", [60, 3600]), ("14 d", [None, None])],
        series=[("p50", "info"), ("p95", "attention")],
        unit="s",
    )
    assert [b["tone"] for b in chart.bars] == ["info", "attention"] * 3
    p50, p95 = chart.bars[0], chart.bars[1]
    assert p50["height"] == MIN_BAR
    assert p95["height"] == pytest.approx(chart.baseline - chart.top)
    assert (p50["value"], p95["value"]) == ("5 s", "2 h")
    assert p50["x"] + p50["width"] < p95["x"]  # side by side, not on top of each other
    assert [b["value"] for b in chart.bars[4:]] == ["none", "none"]
    assert [b["height"] for b in chart.bars[4:]] == [0, 0]
    assert [item["name"] for item in chart.legend] == ["p50", "p95"]
    assert chart.legend[0]["y"] < chart.top  # above the plot
    # Every bar is named under it, and each window under its pair.
    assert [label["lines"] for label in chart.labels[:3]] == [["p50"], ["p95"], ["", "24 h"]]
    for b in chart.bars:
        assert chart.left <= b["x"]
        assert b["x"] + b["width"] <= chart.right
        assert b["value_y"] > chart.legend[0]["y"]


def test_shares_are_lengths_against_the_largest_and_never_vanish():
    assert shares([0, 1, 500, 1000]) == [0.0, 1.0, 50.0, 100.0]
    assert shares([0, 0]) == [0.0, 0.0]
    assert shares([]) == []
