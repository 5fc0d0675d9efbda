"""``lmshards report``: one self-contained HTML page (inline CSS and SVG, no scripts, no
network) with the ``inspect`` table, plots and a few rendered examples.

Plots: length histograms per split and column; noise span lengths measured against the
configured law (T5's uniform compositions for span corruption and UL2's span denoisers,
see :func:`loaders.inspection.stats.expected_span_lengths`; BART's truncated Poisson
against the manifest's drawn spans); the MLM replacement split and prefix-LM split point
against their configuration; UL2's denoiser mix by examples and tokens against the
weights; documents per example; tokens per shard.
"""

from __future__ import annotations

import html
import math
from typing import Any

from loaders.inspection.anatomy import take_apart
from loaders.inspection.render import render_example, to_html
from loaders.inspection.source import InspectedDataset
from loaders.inspection.svg import Series, bar_chart
from loaders.inspection.table import format_table, inspect_dataset

__all__ = ["build_report", "report_figures"]

MEASURED, EXPECTED, OTHER = "#4472c4", "#e4572e", "#76b041"
_MAX_BINS = 40

_CSS = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; } h3 { font-size: 15px; margin-bottom: 0; }
h2 { font-size: 18px; border-bottom: 1px solid #ccc; padding-bottom: 4px; }
pre.table { background: #f6f8fa; padding: 12px; overflow-x: auto; font-size: 12px; }
figure { display: inline-block; margin: 8px; vertical-align: top; } figcaption { font-size: 12px; color: #555; }
.example { font-family: Menlo, Consolas, monospace; font-size: 12px; border: 1px solid #ddd; margin: 10px 0;
  padding: 8px; white-space: pre-wrap; word-break: break-all; }
.example .header { font-weight: bold; margin-bottom: 6px; } .example .name { color: #888; margin-right: 8px; }
.line { margin: 4px 0; } .seg.mask { background: #dc322f; color: white; } .seg.random { background: #f0c419; }
.seg.kept { text-decoration: underline; color: #2e7d32; } .seg.prefix { color: #00838f; }
.seg.mode { background: #1565c0; color: white; } .seg.special, .seg.pad { color: #999; }
.seg.boundary { color: #c2185b; font-weight: bold; } .seg.sentinel { font-weight: bold; }
.seg.span { background: #fdf6e3; }
"""


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


def _span_chart(title: str, measured: dict[str, int], expected: dict[str, float]) -> str:
    keys = {int(k) for k, v in measured.items() if v} | {int(k) for k, v in expected.items() if v >= 0.5}
    lengths = list(range(min(keys, default=1), max(keys, default=1) + 1))
    return bar_chart(title, [str(k) for k in lengths], [
        Series("measured", [float(measured.get(str(k), 0)) for k in lengths], MEASURED),
        Series("expected (configured)", [float(expected.get(str(k), 0.0)) for k in lengths], EXPECTED, "line"),
    ], x_label="span length (tokens)", y_label="spans")


def _bart_chart(ds: InspectedDataset, split: str) -> str | None:
    from transforms.objectives.bart import poisson_span_cdf

    counters = ds.manifest.stats.get(split, {}).get("objective", {})
    drawn = {int(k[len("span_len_hist_"):]): v for k, v in counters.items() if k.startswith("span_len_hist_")}
    if not drawn:
        return None
    config = ds.objective.config
    cdf = poisson_span_cdf(config.poisson_lambda)
    pmf = [cdf[0]] + [cdf[k] - cdf[k - 1] for k in range(1, len(cdf))]
    total = sum(drawn.values())
    lengths = list(range(0, max(max(drawn), min(len(pmf) - 1, 3 * int(config.poisson_lambda) + 6)) + 1))
    return bar_chart(f"{split}: BART span lengths (words), manifest vs Poisson({config.poisson_lambda})",
                     [str(k) for k in lengths], [
                         Series("drawn (manifest)", [float(drawn.get(k, 0)) for k in lengths], MEASURED),
                         Series("expected (configured)", [total * (pmf[k] if k < len(pmf) else 0.0) for k in lengths],
                                EXPECTED, "line")], x_label="span length (words)", y_label="spans")


def _objective_charts(ds: InspectedDataset, split: str, m: dict[str, Any]) -> list[tuple[str, str]]:
    charts = []
    if "denoisers" in m:
        names = list(m["denoisers"])
        charts.append(("share of examples and of raw tokens per denoiser; dots: the configured weights",
                       bar_chart(f"{split}: UL2 denoiser mix", names, [
                           Series("examples share", [m["denoisers"][n]["examples_share"] for n in names], MEASURED),
                           Series("tokens share", [m["denoisers"][n]["tokens_share"] for n in names], OTHER),
                           Series("configured weight", [m["denoisers"][n]["weight"] for n in names], EXPECTED,
                                  "points"),
                       ], x_label="denoiser", y_label="share", width=860)))
        for name, d in m["denoisers"].items():
            if d["kind"] == "span" and d["spans"]:
                charts.append(("measured span lengths; line: expected under T5's random_spans_noise_mask",
                               _span_chart(f"{split}: span lengths of {name}", d["span_lengths"],
                                           d["expected_span_lengths"])))
    elif "noise" in m:
        charts.append(("measured span lengths; line: expected under T5's random_spans_noise_mask",
                       _span_chart(f"{split}: noise span lengths", m["noise"]["span_lengths"],
                                   m["noise"]["expected_span_lengths"])))
    if "mlm" in m:
        parts = ["masked", "random", "kept"]
        charts.append(("share of selected tokens; dots: configured ratios", bar_chart(
            f"{split}: MLM replacement split", parts, [
                Series("measured", [m["mlm"]["split"][p] for p in parts], MEASURED),
                Series("configured", [m["mlm"]["configured_split"][p] for p in parts], EXPECTED, "points"),
            ], x_label="selected tokens", y_label="share", width=420)))
    if "prefix_tenths" in m:
        tenths = [f"{k / 10:.1f}" for k in range(10)]
        total = sum(m["prefix_tenths"].values())
        seq_len = ds.objective.config.seq_len
        uniform = [sum(1 for p in range(1, seq_len) if min(9, 10 * p // seq_len) == k) / (seq_len - 1) * total
                   for k in range(10)]
        charts.append(("prefix length over chunk length; line: the split point ~ U[1, L-1]", bar_chart(
            f"{split}: prefix length / chunk length", tenths, [
                Series("measured", [float(m["prefix_tenths"].get(t, 0)) for t in tenths], MEASURED),
                Series("expected U[1, L-1]", uniform, EXPECTED, "line")], x_label="prefix share",
            y_label="examples")))
    if ds.objective.name == "bart" and (chart := _bart_chart(ds, split)):
        charts.append(("span lengths drawn by text infilling (manifest counters); line: Poisson(lambda) "
                       "truncated as fairseq does", chart))
    return charts


def report_figures(ds: InspectedDataset, summary: dict[str, Any]) -> list[tuple[str, list[tuple[str, str]]]]:
    """Sections of ``(caption, svg)`` plots: one per split, then the shards."""
    sections = []
    for split, s in summary["splits"].items():
        m, figures = s["measured"], []
        for column, h in m["lengths"].items():
            labels, counts = _binned(h.get("histogram", {}))
            figures.append((f"{column} lengths without padding (row capacity {h.get('capacity') or 'variable'})",
                            bar_chart(f"{split}: {column} length", labels, [Series("examples", counts, MEASURED)],
                                      x_label="tokens (without padding)", y_label="examples")))
        if "documents_per_example" in m:
            labels, counts = _binned(m["documents_per_example"]["histogram"])
            figures.append(("document segments packed into one example", bar_chart(
                f"{split}: documents per example", labels, [Series("examples", counts, MEASURED)],
                x_label="documents", y_label="examples", width=420)))
        figures += _objective_charts(ds, split, m)
        scope = "a sample of " if m["sampled"] else ""
        sections.append((f"{split} ({scope}{m['examples']:,} examples)", figures))
    labels, tokens = [], []
    for split, s in summary["splits"].items():
        labels += [f"{split[:5]}/{i}" for i in range(len(s["shard_tokens"]))]
        tokens += [float(t) for t in s["shard_tokens"]]
    sections.append(("shards", [("raw tokens per shard file (manifest)", bar_chart("tokens per shard", labels, [
        Series("tokens", tokens, MEASURED)], x_label="split/shard", y_label="tokens"))]))
    return sections


def build_report(ds: InspectedDataset, *, limit: int | None = None, examples: int = 4) -> str:
    """The report page as one HTML string."""
    summary = inspect_dataset(ds, limit=limit)
    view = ds.view
    rendered = []
    for split in ds.splits[:1]:
        for located in ds.head(split, examples):
            a = take_apart(located.example, view)
            rendered.append(to_html(render_example(located, a, view), ds.tokenizer))
    figures = "\n".join(
        f"<h3>{html.escape(title)}</h3>\n" + "\n".join(
            f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>" for caption, svg in plots)
        for title, plots in report_figures(ds, summary))
    legend = ("<p>Markers: <span class='seg mask'>[MASK:original]</span> <span class='seg random'>[RAND:shown-&gt;"
              "original]</span> <span class='seg kept'>[KEEP:original]</span> sentinels <b>&lt;extra_id_k&gt;</b> "
              "with their spans in the same colour, <span class='seg boundary'>[/prefix]</span> and "
              "<span class='seg boundary'>[/doc]</span> boundaries, <span class='seg mode'>mode tokens</span>.</p>")
    title = f"lmshards report: {ds.path}"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n<h1>{html.escape(title)}</h1>\n"
            f'<section id="summary"><h2>Summary</h2><pre class="table">{html.escape(format_table(summary))}</pre>'
            f'</section>\n<section id="plots"><h2>Plots</h2>\n{figures}\n</section>\n'
            f'<section id="examples"><h2>Examples</h2>{legend}\n{"".join(rendered)}\n</section>\n</body></html>\n')
