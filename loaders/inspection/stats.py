"""Per-split statistics measured on the shards, next to the manifest's own.

:class:`SplitStats` adds up :class:`~loaders.inspection.anatomy.Anatomy` records: examples,
raw chunk tokens, padding, the length distribution of every token column, documents per
example and the lengths of the document segments packed into them; the objective counts its
own (``Objective.count_measured``) into ``counts`` or into records of its own
(:meth:`SplitStats.record`), and turns them into statistics (``Objective.measured_summary``).
Every number is an exact integer count until :meth:`SplitStats.summary` turns counts into shares.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from loaders.inspection.anatomy import Anatomy, ObjectiveView
from transforms.objectives.base import InspectionContext

__all__ = ["SplitStats", "length_summary"]


def length_summary(histogram: Counter, capacity: int | None = None) -> dict[str, Any]:
    """min/mean/p50/p95/max and the histogram of exact lengths."""
    if not histogram:
        return {"count": 0}
    lengths = np.array(sorted(histogram))
    counts = np.array([histogram[k] for k in lengths])
    cumulative = np.cumsum(counts) / counts.sum()

    def quantile(q: float) -> int:
        return int(lengths[np.searchsorted(cumulative, q - 1e-12)])

    return {
        "count": int(counts.sum()),
        "min": int(lengths[0]),
        "mean": round(float((lengths * counts).sum() / counts.sum()), 3),
        "p50": quantile(0.5),
        "p95": quantile(0.95),
        "max": int(lengths[-1]),
        "capacity": capacity,
        "histogram": {str(k): int(histogram[k]) for k in lengths},
    }


def _share(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 6) if denominator else None


class SplitStats:
    """Statistics of the examples of one split measured from the shards.

    Args:
        view: the dataset's objective view.
        context: what the objective's hooks get for the split (default the view's).
    """

    def __init__(self, view: ObjectiveView, context: InspectionContext | None = None):
        self.view = view
        self.context = (context or view.context()).known(stats=self)
        self.counts: Counter = Counter()
        self.lengths = {column: Counter() for column in view.schema.token_columns}
        self.documents: Counter = Counter()
        self.segments: Counter = Counter()
        self._records: dict[str, Any] = {}

    def record(self, name: str, factory: Callable[[], Any]) -> Any:
        """The objective's own record ``name`` (a ``Counter``, say), made by ``factory()`` on first use."""
        if name not in self._records:
            self._records[name] = factory()
        return self._records[name]

    def add(self, a: Anatomy, example: dict[str, Any] | None = None) -> None:
        """Count one example (``a``, taken apart from ``example``)."""
        c = self.counts
        c.update(examples=1, raw_tokens=a.raw_tokens, padding_tokens=a.padding,
                 examples_with_issues=int(bool(a.issues)))
        for column, length in a.lengths.items():
            if column in self.lengths:
                self.lengths[column][length] += 1
        if self.view.decoder_layout and a.inputs is not None:
            self.lengths.setdefault("inputs", Counter())[int(a.inputs.size)] += 1
            self.lengths.setdefault("targets", Counter())[int(a.targets.size)] += 1
        if a.doc_lengths is not None and not self.view.decoder_layout:  # a seq2seq example's row: one sequence
            self.documents[int(a.doc_lengths.size)] += 1
            self.segments.update(int(n) for n in a.doc_lengths)
        if a.complete:  # the objective's own counts
            self.view.objective.count_measured(self.context.known(example=example, anatomy=a))

    def summary(self, manifest_examples: int | None = None) -> dict[str, Any]:
        """JSON-able statistics; ``sampled`` is true when fewer than ``manifest_examples`` were read."""
        c = self.counts
        capacity = sum(n for n in self.view.fixed.values() if n) * c["examples"]
        out: dict[str, Any] = {
            "examples": c["examples"],
            "sampled": manifest_examples is not None and c["examples"] < manifest_examples,
            "raw_tokens": c["raw_tokens"],
            "padding_tokens": c["padding_tokens"],
            "padding_share": _share(c["padding_tokens"], capacity),
            "examples_with_issues": c["examples_with_issues"],
            "lengths": {col: length_summary(h, self.view.fixed.get(col)) for col, h in self.lengths.items()},
        }
        if self.documents:
            out["documents_per_example"] = length_summary(self.documents)
            out["document_segment_lengths"] = length_summary(self.segments)
        out.update(self.view.objective.measured_summary(self.context))  # the objective's own part
        return out

