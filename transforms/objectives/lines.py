"""What an objective adds to ``lmshards inspect``'s table and the report, as plain data: numbers
as the table spells them and aligned rows (the table's own lines and every objective's
:meth:`~transforms.objectives.base.Objective.measured_lines`), and the charts of
:meth:`~transforms.objectives.base.Objective.measured_charts`, which the report draws."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["Chart", "ChartSeries", "number", "table_rows"]


class ChartSeries(NamedTuple):
    """One series of a :class:`Chart`: ``values`` one per category (None: a gap); ``role``
    ``measured``, ``expected`` or ``other`` (its colour); ``style`` ``bar``, ``line`` or ``points``."""

    name: str
    values: list[float | None]
    role: str = "measured"
    style: str = "bar"


class Chart(NamedTuple):
    """A bar chart of the report over shared categories ``labels``, under its ``caption``."""

    caption: str
    title: str
    labels: list[str]
    series: list[ChartSeries]
    x_label: str = ""
    y_label: str = ""
    width: int = 640


def number(value: Any) -> str:
    """A value as the table shows it: ``-`` for None, floats to 4 places, ints with separators."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def table_rows(header: list[str], rows: list[list[Any]], indent: str = "  ") -> list[str]:
    """``header`` and ``rows`` as aligned text lines (first column left, the others right)."""
    cells = [header] + [[number(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return [indent + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in cells]
