"""``lmshards inspect``: the dataset summary as a JSON-able dict and as a text table.

Exact numbers come from the manifest (examples, tokens, shards, padding, dropped tokens,
rejected records, and the objective's counters summarised by
:mod:`transforms.objectives.summary` under ``stats[split]["objective_summary"]``, recomputed
from the counters for a manifest written before that block existed). Distributions come
from the shards (:class:`~loaders.inspection.stats.SplitStats`), on every example or on a
uniform sample of ``limit`` examples per split.
"""

from __future__ import annotations

import json
from typing import Any

from loaders.inspection.anatomy import ObjectiveView, take_apart
from loaders.inspection.source import InspectedDataset
from loaders.inspection.stats import SplitStats
from transforms.objectives.base import InspectionContext
from transforms.objectives.lines import number, table_rows
from transforms.objectives.registry import summarize_objective

__all__ = ["format_table", "inspect_dataset", "manifest_objective_summary", "measure_split", "split_context"]

_SPLIT_FIELDS = ("examples", "tokens", "num_shards", "documents", "duplicates", "padding_tokens", "dropped_tokens")


def manifest_objective_summary(ds: InspectedDataset, split: str) -> dict[str, Any] | None:
    """The manifest's summary of the objective counters of ``split`` (None when it has no counters)."""
    stats = ds.manifest.stats.get(split, {})
    if "objective_summary" in stats:
        return stats["objective_summary"]
    if "objective" not in stats:
        return None
    objective = ds.manifest.objective
    return summarize_objective(objective["name"], stats["objective"], objective.get("params"))


def split_context(ds: InspectedDataset, split: str) -> InspectionContext:
    """What the objective's hooks get for ``split``: the dataset's special ids and seed, the
    manifest's counters of the split and their summary."""
    counters = ds.manifest.stats.get(split, {}).get("objective", {})
    return ds.view.context(split, counters=counters, manifest_summary=manifest_objective_summary(ds, split))


def measure_split(ds: InspectedDataset, view: ObjectiveView, split: str, limit: int | None) -> SplitStats:
    """Statistics of ``split`` over all its examples, or a uniform sample of ``limit``."""
    stats = SplitStats(view, split_context(ds, split))
    for located in ds.sample(split, limit):
        stats.add(take_apart(located.example, view, stats.context), located.example)
    return stats


def inspect_dataset(ds: InspectedDataset, *, limit: int | None = None, splits: list[str] | None = None) -> dict:
    """Everything ``lmshards inspect`` shows, as a JSON-able dict."""
    manifest = ds.manifest
    view = ds.view
    tokenizer = dict(manifest.tokenizer)
    tokenizer["sentinels"] = len(ds.special.sentinels)
    out: dict[str, Any] = {
        "dataset": ds.path,
        "format_version": manifest.format_version,
        "formats": ds.formats,
        "objective": manifest.objective,
        "config": manifest.config,
        "tokenizer": tokenizer,
        "counts": manifest.counts,
        "splits": {},
    }
    for split in splits or ds.splits:
        info = manifest.splits[split]
        entry: dict[str, Any] = {name: info.get(name) for name in _SPLIT_FIELDS}
        entry["document_lengths"] = manifest.stats.get(split, {}).get("document_lengths")
        entry["manifest_summary"] = manifest_objective_summary(ds, split)
        entry["shard_tokens"] = [s.tokens for s in ds.shards(split)]
        entry["measured"] = measure_split(ds, view, split, limit).summary(info.get("examples"))
        out["splits"][split] = entry
    return out


def _value(value: Any) -> str:
    """A parameter as the manifest spells it (true, false, null), not as Python does (True, None)."""
    return value if isinstance(value, str) else json.dumps(value)


def format_table(summary: dict[str, Any], ds: InspectedDataset) -> str:
    """The human-readable ``inspect`` output of ``ds``; each split's statistics end with its
    objective's own lines (:meth:`~transforms.objectives.base.Objective.measured_lines`)."""
    recorded, tok, counts = summary["objective"], summary["tokenizer"], summary["counts"]
    params = {k: v for k, v in recorded.get("params", {}).items()
              if not isinstance(v, (list, dict)) and k not in ("objective", "reference")}
    lines = [
        f"dataset    {summary['dataset']}  (format {summary['format_version']}, {', '.join(summary['formats'])})",
        f"objective  {recorded['name']} ({recorded['family']})  "
        + "  ".join(f"{k}={_value(v)}" for k, v in params.items()),
        f"tokenizer  {tok.get('file')}  vocab {tok.get('vocab_size'):,}  sha256 {str(tok.get('sha256'))[:12]}  "
        + " ".join(f"{k}={v}" for k, v in tok.get("special_ids", {}).items())
        + f"  sentinels {tok['sentinels']}"
        + ("  objective tokens " + " ".join(f"{k}={v}" for k, v in tok["mode_tokens"].items())
           if tok.get("mode_tokens") else ""),
        f"documents  read {number(counts.get('documents_read'))}  written {number(counts.get('documents_written'))}  "
        f"duplicates {number(counts.get('duplicates'))}  rejected {number(counts.get('rejected'))}"
        + "".join(f"  [{reason}: {n:,}]" for reason, n in counts.get("rejected_by_reason", {}).items()),
        "",
    ]
    lines += table_rows(["split", "examples", "tokens", "shards", "documents", "padding", "dropped"], [
        [name, s["examples"], s["tokens"], s["num_shards"], s["documents"], s["padding_tokens"], s["dropped_tokens"]]
        for name, s in summary["splits"].items()], indent="")
    for name, s in summary["splits"].items():
        m = s["measured"]
        scope = f"a sample of {m['examples']:,}" if m["sampled"] else f"all {m['examples']:,}"
        lines += ["", f"{name}: measured on {scope} examples; padding share {number(m['padding_share'])}"
                  + (f"; {m['examples_with_issues']:,} with structural issues (run validate)"
                     if m["examples_with_issues"] else "")]
        rows = [[col, h.get("min"), h.get("mean"), h.get("p50"), h.get("p95"), h.get("max"), h.get("capacity")]
                for col, h in m["lengths"].items()]
        if "documents_per_example" in m:
            d = m["documents_per_example"]
            rows.append(["documents/example", d["min"], d["mean"], d["p50"], d["p95"], d["max"], None])
        lines += table_rows(["length", "min", "mean", "p50", "p95", "max", "capacity"], rows)
        lines += ds.objective.measured_lines(split_context(ds, name).known(measured=m))
    return "\n".join(lines) + "\n"
