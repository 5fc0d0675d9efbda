"""The report's plots: ``(caption, svg)`` pairs, and facts in place of constant plots.

Per split: length histograms per token column; for packed decoder objectives documents per
example and the lengths of the document segments packed into them; then the objective's own
charts (``Objective.measured_charts``, plain :class:`~transforms.objectives.lines.Chart`
records drawn here: a measured distribution against the configured one, say). The
corpus: document lengths per split (shares) and per source (counts on one scale, each
source's documents in the legend; manifest). The shards: raw tokens per shard, a series per
split.

A histogram with one value only (every example of a packed objective has ``seq_len``
tokens; one span length where the noise's count and length are fixed) would be one bar:
it becomes a sentence instead (:class:`Figures`' ``facts``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from loaders.inspection.corpus import source_stats
from loaders.inspection.source import InspectedDataset
from loaders.inspection.svg import Series, bar_chart
from loaders.inspection.table import split_context

__all__ = ["Figures", "corpus_figures", "report_figures", "shard_figure"]

MEASURED, EXPECTED, OTHER = "#4472c4", "#e4572e", "#76b041"
SPLIT_COLOURS = ("#4472c4", "#76b041", "#9c27b0", "#ff9800")
SOURCE_COLOURS = ("#4472c4", "#76b041", "#e4572e", "#9c27b0", "#ff9800", "#00838f", "#795548", "#607d8b")
_MAX_BINS = 40
_MAX_SOURCES = 8


@dataclass
class Figures:
    """Plots of one section and the facts that replace constant ones."""

    title: str
    plots: list[tuple[str, str]] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)


def _binned(histogram: dict[str, int]) -> tuple[list[str], list[float]]:
    """Exact lengths as categories, or about 30 equal bins when they are too many."""
    lengths = sorted(int(k) for k in histogram)
    if not lengths:
        return [], []
    low, high = lengths[0], lengths[-1]
    if high - low + 1 <= _MAX_BINS:
        return [str(k) for k in range(low, high + 1)], [float(histogram.get(str(k), 0)) for k in range(low, high + 1)]
    width = math.ceil((high - low + 1) / 30)
    labels, counts = [], []
    for start in range(low, high + 1, width):
        labels.append(f"{start}-{start + width - 1}")
        counts.append(float(sum(histogram.get(str(k), 0) for k in range(start, start + width))))
    return labels, counts


def _single(histogram: dict[str, Any]) -> tuple[str, int] | None:
    """``(value, count)`` when the histogram holds one value only."""
    present = [(k, int(v)) for k, v in histogram.items() if v]
    return present[0] if len(present) == 1 else None


def _histogram(out: Figures, title: str, caption: str, histogram: dict[str, int], x_label: str, what: str,
               width: int = 640) -> None:
    single = _single(histogram)
    if single is not None:
        out.facts.append(f"{title}: all {single[1]:,} {what} are {single[0]}")
        return
    labels, counts = _binned(histogram)
    out.plots.append((caption, bar_chart(title, labels, [Series(what, counts, MEASURED)], x_label=x_label,
                                         y_label=what, width=width)))


_COLOURS = {"measured": MEASURED, "expected": EXPECTED, "other": OTHER}


def _objective_charts(out: Figures, ds: InspectedDataset, split: str, m: dict[str, Any]) -> None:
    """The objective's own charts (``Objective.measured_charts``): a chart, or a sentence for a constant one."""
    for chart in ds.objective.measured_charts(split_context(ds, split).known(measured=m)):
        if isinstance(chart, str):
            out.facts.append(chart)
            continue
        series = [Series(s.name, s.values, _COLOURS[s.role], s.style) for s in chart.series]
        out.plots.append((chart.caption, bar_chart(chart.title, chart.labels, series, x_label=chart.x_label,
                                                   y_label=chart.y_label, width=chart.width)))


def report_figures(ds: InspectedDataset, summary: dict[str, Any]) -> list[Figures]:
    """One :class:`Figures` per split, from the ``inspect`` summary."""
    sections = []
    for split, s in summary["splits"].items():
        m = s["measured"]
        scope = "a sample of " if m["sampled"] else ""
        out = Figures(f"{split} ({scope}{m['examples']:,} examples)")
        for column, h in m["lengths"].items():
            _histogram(out, f"{split}: {column} length",
                       f"{column} lengths without padding (row capacity {h.get('capacity') or 'variable'})",
                       h.get("histogram", {}), "tokens (without padding)", "examples")
        if "documents_per_example" in m:
            _histogram(out, f"{split}: documents per example", "document segments packed into one example",
                       m["documents_per_example"]["histogram"], "documents", "examples", width=460)
            _histogram(out, f"{split}: document segment lengths", "tokens of each document segment in an example "
                       "(a document cut at a chunk boundary counts once per chunk)",
                       m["document_segment_lengths"].get("histogram", {}), "tokens", "segments")
        _objective_charts(out, ds, split, m)
        sections.append(out)
    return sections


def corpus_figures(ds: InspectedDataset, document_bins: dict[str, list[tuple[str, int]]]) -> list[tuple[str, str]]:
    """Document lengths per split (shares, from the manifest's log2 histograms) and, where the
    manifest has a ``sources`` block, per source: documents on one scale for all sources, each
    source's count in its legend entry."""
    plots = []
    labels = list(dict.fromkeys(label for bins in document_bins.values() for label, _ in bins))
    order = sorted(labels, key=lambda label: int(label.split("-")[0].replace(",", "")))
    if order:
        series = []
        for n, (split, bins) in enumerate(document_bins.items()):
            counts, total = dict(bins), sum(c for _, c in bins)
            series.append(Series(split, [round(counts.get(label, 0) / total, 6) if total else 0.0 for label in order],
                                 SPLIT_COLOURS[n % len(SPLIT_COLOURS)]))
        plots.append(("share of each split's documents by length in tokens (log2 bins; manifest)", bar_chart(
            "document lengths", order, series, x_label="document length (tokens)", y_label="share of documents",
            width=1000)))
    for split in ds.splits:
        sources = source_stats(ds, split)
        if not sources:
            continue
        names = list(sources)[:_MAX_SOURCES]
        bins = {name: dict(sources[name]["bins"]) for name in names}
        order = sorted({label for b in bins.values() for label in b},
                       key=lambda label: int(label.split("-")[0].replace(",", "")))
        # Counts on one scale, not each source's shares: a share scales every source to 1, and a
        # source of one document would draw a bar as tall as the largest source's tallest.
        counts = {name: sum(bins[name].values()) for name in names}
        series = [Series(f"{name} ({counts[name]:,} document{'' if counts[name] == 1 else 's'})",
                         [float(bins[name].get(label, 0)) for label in order], SOURCE_COLOURS[n % len(SOURCE_COLOURS)])
                  for n, name in enumerate(names)]
        plots.append((f"documents of each source by length ({split}; manifest; one scale for every source"
                      + (f"; the {len(names)} largest of {len(sources)} sources" if len(sources) > len(names) else "")
                      + ")", bar_chart(f"{split}: document lengths by source", order, series,
                                        x_label="document length (tokens)", y_label="documents", width=1000)))
    return plots


def shard_figure(summary: dict[str, Any]) -> tuple[str, str]:
    """Raw tokens per shard file, one series (colour) per split."""
    splits = list(summary["splits"])
    labels, series_values = [], {split: [] for split in splits}
    for split, s in summary["splits"].items():
        for i, tokens in enumerate(s["shard_tokens"]):
            labels.append(f"{split[:5]}/{i}")
            for other in splits:
                series_values[other].append(float(tokens) if other == split else None)
    series = [Series(split, series_values[split], SPLIT_COLOURS[n % len(SPLIT_COLOURS)]) for n, split in
              enumerate(splits)]
    width = min(1300, max(640, 120 + 28 * len(labels)))
    return ("raw tokens per shard file (manifest), a colour per split", bar_chart(
        "tokens per shard", labels, series, x_label="split/shard", y_label="tokens", width=width))
