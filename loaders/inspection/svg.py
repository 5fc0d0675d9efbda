"""Hand-written inline SVG bar charts for the HTML report (no plotting library, no assets).

:func:`bar_chart` draws categories on the x axis with one or more series: ``bar`` series
side by side, ``line`` series as dots joined by a line over the bars (an expected
distribution against a measured one), ``points`` series as dots only (configured values
of unrelated categories). Every bar and marker carries ``data-series``,
``data-label`` and ``data-value`` attributes and a ``<title>`` tooltip, so a test can
read the plotted numbers back from the page.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

__all__ = ["Series", "bar_chart", "nice_ticks"]


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


def bar_chart(title: str, labels: list[str], series: list[Series], *, x_label: str = "", y_label: str = "",
              width: int = 600, height: int = 260) -> str:
    """An ``<svg>`` element: grouped bars and marker lines over shared categories."""
    left, right, top, bottom = 64, 16, 52, 48
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for s in series for v in s.values if v is not None]
    ticks = nice_ticks(max(values, default=0.0))
    y_max = ticks[-1]
    n = max(len(labels), 1)
    slot = plot_w / n
    bars = [s for s in series if s.style == "bar"]
    bar_w = slot * 0.8 / max(len(bars), 1)

    def y(value: float) -> float:
        return top + plot_h - plot_h * value / y_max

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
           f'<text x="{left}" y="18" class="chart-title" font-size="14" font-weight="bold">{html.escape(title)}</text>']
    for tick in ticks:
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" font-size="11" text-anchor="end">{_fmt(tick)}</text>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" stroke="#333"/>'
               f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" stroke="#333"/>')
    label_px = 6 * max((len(label) for label in labels), default=1) + 8  # about 6 px a character at 10 px
    every = max(1, math.ceil(len(labels) * label_px / plot_w))
    for i, label in enumerate(labels):
        if i % every == 0:
            out.append(f'<text x="{left + slot * (i + 0.5):.1f}" y="{top + plot_h + 14}" font-size="10" '
                       f'text-anchor="middle">{html.escape(label)}</text>')
    for b, s in enumerate(bars):
        for i, value in enumerate(s.values):
            if value is None:
                continue
            x = left + slot * i + slot * 0.1 + bar_w * b
            tip = f"{s.name} {labels[i]}: {_fmt(value)}"
            out.append(f'<rect class="bar" x="{x:.1f}" y="{y(value):.1f}" width="{max(bar_w - 1, 0.5):.1f}" '
                       f'height="{top + plot_h - y(value):.1f}" fill="{s.color}" data-series="{html.escape(s.name)}" '
                       f'data-label="{html.escape(labels[i])}" data-value="{value}"><title>{html.escape(tip)}</title>'
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
    lx = left
    for s in series:  # legend: one row under the title
        out.append(f'<rect x="{lx}" y="26" width="10" height="10" fill="{s.color}"/>'
                   f'<text x="{lx + 14}" y="35" font-size="11">{html.escape(s.name)}</text>')
        lx += 30 + 6.5 * len(s.name)
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{height - 8}" font-size="11" text-anchor="middle">'
               f'{html.escape(x_label)}</text>')
    out.append(f'<text x="14" y="{top + plot_h / 2:.1f}" font-size="11" text-anchor="middle" '
               f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">{html.escape(y_label)}</text>')
    out.append("</svg>")
    return "\n".join(out)
