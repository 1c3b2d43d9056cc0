"""console.charts: budget bars, axis maxima, durations and chart geometry (no database)."""

from datetime import timedelta
from decimal import Decimal

import pytest

from console.charts import (
    bar,
    bar_chart,
    duration_text,
    hbar_chart,
    line_chart,
    money_text,
    nice_max,
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


def test_horizontal_bars_grow_with_their_values():
    chart = hbar_chart([("ready", 2), ("executing", 0), ("succeeded", 118)])
    assert chart.height == 3 * 20 + 4
    assert chart.bars[1]["width"] == 0
    assert chart.bars[2]["width"] > chart.bars[0]["width"]
