"""Text formatting of the lines an objective adds to ``lmshards inspect``'s table (and so to the
report's summary): numbers as the table spells them and aligned rows, shared by the table's
own lines and every objective's :meth:`~transforms.objectives.base.Objective.measured_lines`."""

from __future__ import annotations

from typing import Any

__all__ = ["number", "table_rows"]


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
