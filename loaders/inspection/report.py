"""``lmshards report``: one self-contained HTML page (inline CSS and SVG, no scripts, no
network) that describes the corpus as well as the noise.

Sections, in order: the ``inspect`` summary; how the dataset was made (command line, run,
encoder); its configuration, objective parameters and tokenizer; the corpus (documents,
input files and their shares, document lengths per split and, where the manifest has them,
per source: :mod:`loaders.inspection.corpus`); rejected records by reason with samples; the
plots of every split (:mod:`loaders.inspection.figures`, with facts in place of constant
plots); the shards (tokens per shard per split, rows, bytes and sha256 of every file); and
rendered examples with a legend, as the objective shows them (``Objective.example_lines``),
the first of every group of examples first where the objective has groups
(``Objective.example_groups``).

Laid out for a 1400 px wide window: plots two to a row, long lines wrapped inside their
boxes (the browser test checks that no element overflows).
"""

from __future__ import annotations

import html
import itertools
from typing import Any

from loaders.inspection.anatomy import take_apart
from loaders.inspection.decode import RunDecoder
from loaders.inspection.figures import Figures, report_figures, shard_figure
from loaders.inspection.render import legend_html, render_example, to_html
from loaders.inspection.report_sections import (
    config_section,
    corpus_section,
    figure_html,
    rejected_section,
    run_section,
    shards_section,
)
from loaders.inspection.source import InspectedDataset, Located
from loaders.inspection.table import format_table, inspect_dataset, split_context

__all__ = ["build_report", "example_selection", "report_figures"]

#: Examples read at most while looking for one of every group of examples.
MAX_SCANNED = 5000

_CSS = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 24px; color: #222;
  font-size: 14px; }
h1 { font-size: 22px; overflow-wrap: anywhere; } h3 { font-size: 15px; margin: 14px 0 6px; }
h2 { font-size: 18px; border-bottom: 1px solid #ccc; padding-bottom: 4px; margin-top: 28px; }
pre.table, pre.cmd { background: #f6f8fa; padding: 12px; font-size: 12px; white-space: break-spaces;
  overflow-wrap: anywhere; }
.plots { display: flex; flex-wrap: wrap; gap: 8px 16px; align-items: flex-start; }
figure { margin: 8px 0; max-width: 100%; } figure svg { max-width: 100%; height: auto; }
figcaption { font-size: 12px; color: #555; max-width: 640px; }
ul.facts { font-size: 13px; color: #333; }
.columns { display: flex; flex-wrap: wrap; gap: 8px 32px; align-items: flex-start; }
.columns > div { min-width: 0; max-width: 100%; }
table { border-collapse: collapse; font-size: 12px; margin: 4px 0 10px; max-width: 100%; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 3px 8px; text-align: left; vertical-align: top;
  overflow-wrap: anywhere; }
table.kv th { color: #555; font-weight: normal; white-space: nowrap; } table.kv td { max-width: 560px; }
table.num td { text-align: right; } table.num td:first-child, table.files td:first-child { text-align: left; }
table.shards td:nth-child(5), table.shards td:last-child { text-align: left; }
table.mixture td, table.mixture th { padding: 1px 6px; }
code.sha { font-size: 11px; } .path { overflow-wrap: anywhere; }
.share { display: inline-block; width: 80px; height: 9px; background: #eee; margin-right: 6px; }
.sharebar { display: block; height: 9px; background: #4472c4; }
table.rejected td:last-child { max-width: 900px; }
.sample { margin-bottom: 6px; } .where { color: #555; font-size: 11px; overflow-wrap: anywhere; }
pre.excerpt { margin: 2px 0; background: #fdf3f2; padding: 4px 6px; white-space: pre-wrap; overflow-wrap: anywhere;
  font-size: 11px; max-height: 8em; overflow: hidden; }
.example { font-family: Menlo, Consolas, monospace; font-size: 12px; border: 1px solid #ddd; margin: 10px 0;
  padding: 8px; white-space: break-spaces; overflow-wrap: anywhere; }
.example .header { font-weight: bold; margin-bottom: 6px; } .example .name { color: #888; }
.line { margin: 6px 0; display: grid; grid-template-columns: 6.5em minmax(0, 1fr); }
.line .text { min-width: 0; } .seg { box-decoration-break: clone; -webkit-box-decoration-break: clone; }
.seg.mask { background: #dc322f; color: white; } .seg.random { background: #f0c419; }
.seg.kept { text-decoration: underline; color: #2e7d32; } .seg.prefix { color: #00838f; }
.seg.mode { background: #1565c0; color: white; } .seg.special, .seg.pad { color: #999; }
.seg.boundary, .seg.sentence { color: #c2185b; font-weight: bold; } .seg.sentinel { font-weight: bold; }
.seg.span { background: #fdf6e3; } .seg.hidden { background: #fde2e1; color: #9b1c1c; }
.seg.insert { background: #8e24aa; color: white; } .seg.deleted { color: #c62828; text-decoration: line-through; }
.nl, .seg.newline { color: #bbb; }
ul.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 4px 18px; font-size: 13px; }
p.problem { color: #c62828; }
"""


def example_selection(ds: InspectedDataset, split: str, examples: int) -> list[Located]:
    """The examples the report shows: the first ``examples`` of ``split``; for an objective with
    groups of examples (``Objective.example_groups``), the first of every group
    (in its order; at most :data:`MAX_SCANNED` read), then more of the first ones up to ``examples``."""
    wanted = list(ds.objective.example_groups)
    if not wanted:
        return ds.head(split, examples)
    first: dict[str, Located] = {}
    rest: list[Located] = []
    context = split_context(ds, split)
    for located in itertools.islice(ds.iter_split(split), MAX_SCANNED):
        name = ds.objective.example_group(context.known(example=located.example))
        if name in wanted and name not in first:
            first[name] = located
        elif len(rest) < examples:
            rest.append(located)
        if len(first) == len(wanted) and len(rest) >= examples:
            break
    chosen = [first[name] for name in wanted if name in first]
    return chosen + rest[: max(0, examples - len(chosen))]


def _plots_html(sections: list[Figures]) -> str:
    out = []
    for section in sections:
        facts = "".join(f"<li>{html.escape(fact)}</li>" for fact in section.facts)
        out.append(f"<h3>{html.escape(section.title)}</h3>"
                   + (f'<ul class="facts">{facts}</ul>' if facts else "")
                   + '<div class="plots">' + "".join(figure_html(c, svg) for c, svg in section.plots) + "</div>")
    return "\n".join(out)


def build_report(ds: InspectedDataset, *, limit: int | None = None, examples: int = 4) -> str:
    """The report page as one HTML string."""
    summary: dict[str, Any] = inspect_dataset(ds, limit=limit)
    view, decoder = ds.view, RunDecoder(ds.tokenizer)
    split = "train" if "train" in ds.splits else ds.splits[0]
    context = split_context(ds, split)
    rendered = [render_example(located, take_apart(located.example, view, context), view, seed=ds.seed,
                               decoder=decoder, context=context) for located in example_selection(ds, split, examples)]
    title = f"lmshards report: {ds.path}"
    table = format_table(summary, ds)
    scope = f" (one per {ds.objective.group_label} first)" if ds.objective.example_groups else ""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{_CSS}</style></head><body>\n<h1>{html.escape(title)}</h1>\n"
            f'<section id="summary"><h2>Summary</h2><pre class="table">{html.escape(table)}</pre>'
            f"</section>\n{run_section(ds)}\n{config_section(ds)}\n{corpus_section(ds)}\n{rejected_section(ds)}\n"
            f'<section id="plots"><h2>Plots</h2>\n{_plots_html(report_figures(ds, summary))}\n</section>\n'
            f"{shards_section(ds, shard_figure(summary))}\n"
            f'<section id="examples"><h2>Examples: {html.escape(split)}{scope}</h2>{legend_html(rendered)}\n'
            f'{"".join(to_html(r, decoder) for r in rendered)}\n</section>\n</body></html>\n')
