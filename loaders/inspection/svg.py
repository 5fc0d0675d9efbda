"""Hand-written inline SVG bar charts for the HTML report (no plotting library, no assets).

:func:`bar_chart` draws categories on the x axis with one or more series: ``bar`` series
side by side (sharing a category's slot among those with a value there), ``line`` series
as dots joined by a line over the bars (an expected distribution against a measured one),
``points`` series as dots only (configured values of unrelated categories). Every bar and
marker carries ``data-series``,
``data-label`` and ``data-value`` attributes and a ``<title>`` tooltip, so a test can
read the plotted numbers back from the page.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

__all__ = ["Series", "bar_chart", "nice_ticks"]

_MIN_PLOT_HEIGHT = 160


@dataclass
class Series:
    """One series of a chart.

    Attributes:
        name: legend entry.
        values: one value per category (None leaves a gap).
        color: CSS colour.
        style: ``bar``, ``line`` (dots joined by a line: a distribution) or ``points`` (dots only).
    """

    name: str
    values: list[float | None]
    color: str
    style: str = "bar"


def nice_ticks(maximum: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``maximum``."""
    if maximum <= 0:
        return [0.0, 1.0]
    raw = maximum / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    return [i * step for i in range(int(math.ceil(maximum / step - 1e-9)) + 1)]


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:,.2f}"


def _text_width(text: str, size: float) -> float:
    """About how wide ``text`` is at font ``size`` (sans-serif digits and letters average 0.6 em)."""
    return 0.6 * size * len(text)


def bar_chart(title: str, labels: list[str], series: list[Series], *, x_label: str = "", y_label: str = "",
              width: int = 640, height: int = 300) -> str:
    """An ``<svg>`` element: grouped bars and marker lines over shared categories.

    The left margin fits the widest tick label beside the rotated y label; x labels are
    thinned so that none overlaps the next; the legend wraps onto more rows when one is not
    enough (the chart grows taller to keep its plot area); a category's bars share its slot
    among the bar series that have a value there.
    """
    tick_size, label_size, title_size = 12, 12, 15
    values = [v for s in series for v in s.values if v is not None]
    ticks = nice_ticks(max(values, default=0.0))
    y_max = ticks[-1]
    left = int(22 + 6 + max(_text_width(_fmt(t), tick_size) for t in ticks) + 8)
    right = 16
    legend_rows: list[list[tuple[Series, float]]] = [[]]
    x = float(left)
    for s in series:  # legend rows under the title
        item = 16 + _text_width(s.name, label_size) + 18
        if legend_rows[-1] and x + item > width - right:
            legend_rows.append([])
            x = float(left)
        legend_rows[-1].append((s, x))
        x += item
    top = 30 + 18 * len(legend_rows) + 8
    bottom = 58
    height = max(height, top + bottom + _MIN_PLOT_HEIGHT)  # a tall legend makes the chart taller, never the plot flat
    plot_w, plot_h = width - left - right, height - top - bottom
    n = max(len(labels), 1)
    slot = plot_w / n
    bars = [s for s in series if s.style == "bar"]

    def y(value: float) -> float:
        return top + plot_h - plot_h * value / y_max

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
           f'<text x="{left}" y="20" class="chart-title" font-size="{title_size}" font-weight="bold">'
           f'{html.escape(title)}</text>']
    for tick in ticks:
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 8}" y="{y(tick) + 4:.1f}" font-size="{tick_size}" text-anchor="end" '
                   f'class="tick">{_fmt(tick)}</text>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="#333"/>'
               f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#333"/>')
    label_px = max((_text_width(label, tick_size) for label in labels), default=1) + 10
    every = max(1, math.ceil(label_px / slot))
    for i, label in enumerate(labels):
        if i % every == 0:
            out.append(f'<text x="{left + slot * (i + 0.5):.1f}" y="{top + plot_h + 18}" font-size="{tick_size}" '
                       f'text-anchor="middle" class="tick">{html.escape(label)}</text>')
    for i, label in enumerate(labels):
        present = [s for s in bars if i < len(s.values) and s.values[i] is not None]
        bar_w = slot * 0.8 / max(len(present), 1)
        for b, s in enumerate(present):
            value = s.values[i]
            bx = left + slot * i + slot * 0.1 + bar_w * b
            tip = f"{s.name} {label}: {_fmt(value)}"
            out.append(f'<rect class="bar" x="{bx:.1f}" y="{y(value):.1f}" width="{max(bar_w - 1, 0.5):.1f}" '
                       f'height="{top + plot_h - y(value):.1f}" fill="{s.color}" data-series="{html.escape(s.name)}" '
                       f'data-label="{html.escape(label)}" data-value="{value}"><title>{html.escape(tip)}</title>'
                       f'</rect>')
    for s in (s for s in series if s.style != "bar"):
        points = [(left + slot * (i + 0.5), y(v), labels[i], v) for i, v in enumerate(s.values) if v is not None]
        if len(points) > 1 and s.style == "line":
            path = " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in points)
            out.append(f'<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="1.5"/>')
        for px, py, label, value in points:
            tip = f"{s.name} {label}: {_fmt(value)}"
            radius = 3 if s.style == "line" else 5
            out.append(f'<circle class="marker" cx="{px:.1f}" cy="{py:.1f}" r="{radius}" fill="{s.color}" '
                       f'data-series="{html.escape(s.name)}" data-label="{html.escape(label)}" data-value="{value}">'
                       f'<title>{html.escape(tip)}</title></circle>')
    for row, items in enumerate(legend_rows):
        for s, lx in items:
            ly = 30 + 18 * row
            out.append(f'<rect x="{lx:.1f}" y="{ly}" width="12" height="12" fill="{s.color}"/>'
                       f'<text x="{lx + 16:.1f}" y="{ly + 11}" font-size="{label_size}" class="legend">'
                       f'{html.escape(s.name)}</text>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 10}" font-size="{label_size}" text-anchor="middle" '
               f'class="axis-label">{html.escape(x_label)}</text>')
    out.append(f'<text x="16" y="{top + plot_h / 2:.1f}" font-size="{label_size}" text-anchor="middle" '
               f'class="axis-label" transform="rotate(-90 16 {top + plot_h / 2:.1f})">{html.escape(y_label)}</text>')
    out.append("</svg>")
    return "\n".join(out)
