"""Charts and bars for the console, computed here and drawn by templates as inline SVG.

Pure functions (no ORM, no request): they turn figures into geometry in a fixed
viewBox, and the templates write ``<rect>``/``<polyline>`` elements with these numbers
as attributes. No inline style attribute is needed (the console runs under a CSP
without 'unsafe-inline'); colours come from console.css classes, so charts follow the
light or dark scheme. A chart is drawn for the eye only (``aria-hidden``): its figures
are in a table beside it that only assistive technology reads, so neither repeats the
other on screen. Bars carry their values as text, and a value above zero is never
drawn thinner than ``MIN_BAR``.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

WARN_AT = 0.8  # a budget bar turns "warn" at 80 % used


@dataclass(frozen=True)
class Bar:
    """One horizontal budget bar: ``used`` of ``limit`` (``None``: no limit)."""

    label: str
    used_text: str
    limit_text: str | None
    percent: float | None  # 0..100 for the bar width, None without a limit
    tone: str  # "ok", "warn" or "over"

    @property
    def description(self) -> str:
        if self.limit_text is None:
            return f"{self.label}: {self.used_text}, no limit"
        return f"{self.label}: {self.used_text} of {self.limit_text} ({self.percent:.0f}%)"


def bar(label: str, used: float, limit: float | None, used_text: str, limit_text: str) -> Bar:
    if limit is None:
        return Bar(label, used_text, None, None, "ok")
    # Rounded so that 0.04 of 0.05 is the 80 % it reads as, not 79.99... %.
    ratio = round(used / limit, 6) if limit > 0 else 1.0
    tone = "over" if ratio >= 1 else "warn" if ratio >= WARN_AT else "ok"
    return Bar(label, used_text, limit_text, round(min(ratio, 1.0) * 100, 1), tone)


def duration_text(value: timedelta | float | None) -> str:
    """``95`` -> ``1 min 35 s``; ``timedelta(hours=30)`` -> ``1 d 6 h``."""
    if value is None:
        return "—"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {sec} s" if sec and minutes < 10 else f"{minutes} min"
    hours, minute = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minute} min" if minute else f"{hours} h"
    days, hour = divmod(hours, 24)
    return f"{days} d {hour} h" if hour else f"{days} d"


def money_text(value: Decimal | float | None) -> str:
    if value is None:
        return "—"
    return f"{Decimal(str(value)).normalize():f}"


# --- charts ----------------------------------------------------------------------------

WIDTH = 440  # viewBox units, near the width a dashboard card gives the SVG
HEIGHT = 170
PAD_LEFT = 46
PAD_RIGHT = 12
PAD_TOP = 10
PAD_BOTTOM = 34  # room for two lines of axis labels
LEGEND = 22  # room above the plot for a legend
VALUE_GAP = 4  # between a bar's top and its value
MIN_BAR = 3  # the least height of a bar above zero: a small value stays visible
# "Round" axis maxima for durations, in seconds: each halves into a readable tick.
DURATION_STEPS = [
    60, 120, 300, 600, 1200, 1800, 3600, 2 * 3600, 4 * 3600, 6 * 3600, 12 * 3600,
    86_400, 2 * 86_400, 4 * 86_400, 7 * 86_400, 14 * 86_400, 28 * 86_400,
]  # fmt: skip


def nice_max(value: float, unit: str = "") -> float:
    """A round axis maximum at or above ``value``: 1, 2 or 5 times a power of ten, or
    for durations (``unit="s"``) a round number of minutes, hours or days."""
    if value <= 0:
        return 1 if unit != "s" else 60
    if unit == "s":
        return next((step for step in DURATION_STEPS if step >= value), value)
    magnitude = 1.0
    while magnitude * 10 <= value:
        magnitude *= 10
    while magnitude > value:
        magnitude /= 10
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def short_duration(seconds: float) -> str:
    """An axis label: ``90`` -> ``1.5 min``, ``7200`` -> ``2 h``."""
    if seconds < 60:
        return f"{seconds:g} s"
    if seconds < 3600:
        return f"{seconds / 60:.3g} min"
    if seconds < 86_400:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86_400:.3g} d"


def _tick_text(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:g}%"
    if unit == "s":
        return short_duration(value)
    return f"{value:g}"


@dataclass
class Chart:
    """Geometry of one chart in a ``WIDTH`` by ``HEIGHT`` viewBox."""

    width: int = WIDTH
    height: int = HEIGHT
    ticks: list[dict[str, Any]] = field(default_factory=list)  # y gridlines with labels
    bars: list[dict[str, Any]] = field(default_factory=list)
    points: str = ""  # polyline points for a line chart
    dots: list[dict[str, Any]] = field(default_factory=list)
    labels: list[dict[str, Any]] = field(default_factory=list)  # x axis labels
    legend: list[dict[str, Any]] = field(default_factory=list)  # series: swatch and name
    top: float = PAD_TOP
    baseline: float = HEIGHT - PAD_BOTTOM
    left: float = PAD_LEFT
    right: float = WIDTH - PAD_RIGHT

    @property
    def tick_x(self) -> float:
        return self.left - 6

    @property
    def label_y(self) -> float:
        return self.baseline + 14


def _y_axis(chart: Chart, top: float, unit: str) -> None:
    plot = chart.baseline - chart.top
    # Counts get no gridline at a fraction (2.5 operations).
    halves = unit or (top / 2).is_integer()
    for fraction in (0, 0.5, 1) if halves else (0, 1):
        chart.ticks.append(
            {
                "y": round(chart.baseline - plot * fraction, 1),
                "text": _tick_text(top * fraction, unit),
            }
        )


def _label(x: float, text: str, anchor: str = "middle") -> dict[str, Any]:
    """An x axis label; a long one on two lines (split at the first space)."""
    first, _, second = text.partition(" ") if len(text) > 9 else (text, "", "")
    return {"x": x, "lines": [first, second] if second else [first], "anchor": anchor}


def _value_text(value: float, unit: str) -> str:
    return _tick_text(value, unit) if unit else f"{value:g}"


def _bar(
    chart: Chart,
    *,
    x: float,
    width: float,
    value: float | None,
    top: float,
    unit: str,
    tone: str,
    label: str,
) -> dict[str, Any]:
    """One vertical bar from the baseline, with its value written above it (``none``
    for a missing one); a value above zero is at least ``MIN_BAR`` high."""
    plot_height = chart.baseline - chart.top
    height = plot_height * (value / top) if value and top else 0
    if value and value > 0:
        height = max(height, MIN_BAR)
    bar = {
        "x": round(x, 1),
        "y": round(chart.baseline - height, 1),
        "width": round(width, 1),
        "height": round(height, 1),
        "tone": tone,
        "label": label,
        "value": "none" if value is None else _value_text(value, unit),
        "value_x": round(x + width / 2, 1),
        "value_y": round(chart.baseline - height - VALUE_GAP, 1),
    }
    chart.bars.append(bar)
    return bar


def bar_chart(
    items: Sequence[tuple[str, float]], *, unit: str = "", tones: list[str] | None = None
) -> Chart:
    """Vertical bars, one per ``(label, value)``; ``tones`` name a CSS class per bar."""
    chart = Chart(top=PAD_TOP + 14)  # room for the tallest bar's value
    top = nice_max(max((value for _, value in items), default=0), unit)
    _y_axis(chart, top, unit)
    plot_width = chart.right - chart.left
    slot = plot_width / max(len(items), 1)
    width = min(slot * 0.6, 48)
    for index, (label, value) in enumerate(items):
        x = chart.left + slot * index + (slot - width) / 2
        tone = (tones[index] if tones else "") or ""
        _bar(chart, x=x, width=width, value=value, top=top, unit=unit, tone=tone, label=label)
        chart.labels.append(_label(round(x + width / 2, 1), label))
    return chart


def grouped_bar_chart(
    groups: Sequence[tuple[str, Sequence[float | None]]],
    *,
    series: Sequence[tuple[str, str]],
    unit: str = "",
) -> Chart:
    """Bars side by side per group, one per series: ``groups`` are ``(label, values)``
    with a value per series (None: none to show), ``series`` ``(name, tone)``. Each bar
    is named under it and its value written above it, and a legend above the plot names
    the colours: the series read apart without telling colours apart."""
    chart = Chart(top=PAD_TOP + LEGEND)
    values = [value for _, row in groups for value in row if value is not None]
    top = nice_max(max(values, default=0), unit)
    _y_axis(chart, top, unit)
    slot = (chart.right - chart.left) / max(len(groups), 1)
    gap = 8
    width = min((slot * 0.8 - gap * (len(series) - 1)) / max(len(series), 1), 48)
    span = width * len(series) + gap * (len(series) - 1)
    for index, (label, row) in enumerate(groups):
        start = chart.left + slot * index + (slot - span) / 2
        for number, ((name, tone), value) in enumerate(zip(series, row, strict=True)):
            x = start + number * (width + gap)
            bar = _bar(
                chart,
                x=x,
                width=width,
                value=value,
                top=top,
                unit=unit,
                tone=tone,
                label=f"{name}, {label}",
            )
            chart.labels.append({"x": bar["value_x"], "lines": [name], "anchor": "middle"})
        chart.labels.append(
            {"x": round(start + span / 2, 1), "lines": ["", label], "anchor": "middle"}
        )
    x = chart.left
    for name, tone in series:
        chart.legend.append({"x": x, "text_x": x + 14, "y": PAD_TOP, "name": name, "tone": tone})
        x += 14 + 9 * len(name) + 16
    return chart


def line_chart(
    items: list[tuple[str, float | None]], *, unit: str = "", label_every: int = 1
) -> Chart:
    """A line through ``(label, value)`` points; ``None`` values are left out. Every
    ``label_every``-th point is labelled, counted back from the last one."""
    chart = Chart()
    top = nice_max(max((value for _, value in items if value is not None), default=0), unit)
    _y_axis(chart, top, unit)
    plot_width = chart.right - chart.left
    plot_height = chart.baseline - chart.top
    step = plot_width / max(len(items) - 1, 1)
    points = []
    last = len(items) - 1
    for index, (label, value) in enumerate(items):
        x = round(chart.left + step * index, 1)
        if value is not None:
            y = round(chart.baseline - plot_height * (value / top), 1)
            points.append(f"{x},{y}")
            chart.dots.append({"x": x, "y": y, "label": label, "value": _value_text(value, unit)})
        if (last - index) % label_every == 0:
            anchor = "end" if index == last else "start" if index == 0 else "middle"
            chart.labels.append(_label(x, label, anchor))
    chart.points = " ".join(points)
    return chart


def shares(values: Sequence[float]) -> list[float]:
    """Each value's bar length in percent of the largest (0 to 100), for bars drawn in
    a table beside the figures; a value above zero gets at least 1 %."""
    largest = max(values, default=0)
    if largest <= 0:
        return [0.0 for _ in values]
    return [max(round(100 * value / largest, 1), 1.0) if value > 0 else 0.0 for value in values]
