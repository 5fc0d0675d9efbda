"""Per-split statistics measured on the shards, next to the manifest's own.

:class:`SplitStats` adds up :class:`~loaders.inspection.anatomy.Anatomy` records: examples,
raw chunk tokens, padding, the length distribution of every token column, documents per
example and the lengths of the document segments packed into them; the objective counts its
own (``Objective.count_measured``) into ``counts`` and the records kept for it here: the
prefix tenths, noise tokens and the noise span lengths (overall and per denoiser,
:meth:`SplitStats.add_noise`) and the MLM replacement split. Every number is an exact integer
count until :meth:`SplitStats.summary` turns counts into shares.

Span lengths are compared with what the configured objective would give on the same
chunks: T5's ``random_spans_noise_mask`` splits ``N`` noise tokens into ``m`` spans as a
uniformly random composition, so one span has ``k`` tokens with probability
``C(N-k-1, m-2) / C(N-1, m-1)``; the expected histogram is that law summed over the
``(N, m)`` of every measured example (:func:`expected_span_lengths`).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from loaders.inspection.anatomy import Anatomy, ObjectiveView

__all__ = ["SplitStats", "composition_pmf", "expected_span_lengths", "length_summary"]


def composition_pmf(total: int, parts: int, length: int) -> float:
    """Probability that one part of a uniform random composition of ``total`` into ``parts`` has ``length``."""
    if parts < 1 or not 1 <= length <= total - parts + 1:
        return 0.0
    if parts == 1:
        return 1.0 if length == total else 0.0
    return math.comb(total - length - 1, parts - 2) / math.comb(total - 1, parts - 1)


def expected_span_lengths(compositions: Counter) -> dict[int, float]:
    """Expected span-length histogram for examples with ``(noise tokens, spans)`` counted in ``compositions``."""
    out: dict[int, float] = {}
    for (total, parts), count in compositions.items():
        for length in range(1, total - parts + 2):
            out[length] = out.get(length, 0.0) + count * parts * composition_pmf(total, parts, length)
    return dict(sorted(out.items()))


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


class _Noise:
    """Noise tokens, spans and span lengths of one group of examples."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.span_lengths: Counter = Counter()
        self.compositions: Counter = Counter()

    def add(self, a: Anatomy) -> None:
        self.counts.update(examples=1, raw_tokens=a.raw_tokens, noise_tokens=a.noise_tokens,
                           inputs_tokens=a.lengths.get("inputs", 0), targets_tokens=a.lengths.get("targets", 0))
        if a.span_lengths is not None:
            self.counts["spans"] += int(a.span_lengths.size)  # the S denoiser's suffix counts as one span
        if a.kind == "span" and a.span_lengths is not None:
            self.span_lengths.update(int(k) for k in a.span_lengths)
            self.compositions[(a.noise_tokens, int(a.span_lengths.size))] += 1

    def summary(self, density: float | None, mean: float | None, expected: bool) -> dict[str, Any]:
        c = self.counts
        out = {
            "examples": c["examples"], "raw_tokens": c["raw_tokens"], "noise_tokens": c["noise_tokens"],
            "spans": c["spans"], "density": _share(c["noise_tokens"], c["raw_tokens"]),
            "mean_span_length": _share(c["noise_tokens"], c["spans"]),
            "configured_density": density, "configured_mean_span_length": mean,
            "span_lengths": {str(k): n for k, n in sorted(self.span_lengths.items())},
        }
        if expected:
            expected_lengths = expected_span_lengths(self.compositions)
            out["expected_span_lengths"] = {str(k): round(v, 3) for k, v in expected_lengths.items()}
        return out


class SplitStats:
    """Statistics of the examples of one split measured from the shards.

    Args:
        view: the dataset's objective view.
    """

    def __init__(self, view: ObjectiveView):
        self.view = view
        self.counts: Counter = Counter()
        self.lengths = {column: Counter() for column in view.schema.token_columns}
        self.documents: Counter = Counter()
        self.segments: Counter = Counter()
        self.prefix_tenths: Counter = Counter()  # per document segment: tenth of its length in its prefix
        self.prefix_expected_tenths: Counter = Counter()  # the same under each segment's U[1, d-1]
        self.noise = _Noise()
        self.denoisers: dict[str, _Noise] = {}
        self.mlm: Counter = Counter()

    def add(self, a: Anatomy) -> None:
        """Count one example."""
        c = self.counts
        c.update(examples=1, raw_tokens=a.raw_tokens, padding_tokens=a.padding,
                 examples_with_issues=int(bool(a.issues)))
        for column, length in a.lengths.items():
            if column in self.lengths:
                self.lengths[column][length] += 1
        if self.view.decoder_layout and a.inputs is not None:
            self.lengths.setdefault("inputs", Counter())[int(a.inputs.size)] += 1
            self.lengths.setdefault("targets", Counter())[int(a.targets.size)] += 1
        if a.doc_lengths is not None and not self.view.decoder_layout:  # UL2's decoder rows hold one sequence
            self.documents[int(a.doc_lengths.size)] += 1
            self.segments.update(int(n) for n in a.doc_lengths)
        self.view.objective.count_measured(self, a)  # the objective's own counts

    def add_noise(self, a: Anatomy) -> None:
        """Count the noise of a span or S example, overall and under its denoiser (if any)."""
        self.noise.add(a)
        if a.denoiser is not None:
            self.denoisers.setdefault(a.denoiser, _Noise()).add(a)

    def noise_of(self, denoiser: str) -> _Noise:
        """The noise statistics of one denoiser's examples (empty if none was seen)."""
        return self.denoisers.get(denoiser, _Noise())

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
        out.update(self.view.objective.measured_summary(self))  # the objective's own part
        return out

