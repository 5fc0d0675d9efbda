"""WriteManifest: the last stage. Collects shard infos and statistics (as side inputs, so
it runs only after every shard is written; per split, the summed integer counters under
``stats[split]["objective"]`` and their summary from :mod:`transforms.objectives.summary`
under ``stats[split]["objective_summary"]``), writes the ``datasets`` metadata next to the
Arrow shards, then ``manifest.json`` (atomically), then removes ``OUT/.tmp``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from schemas.manifest import FORMAT_DIRS, MANIFEST_NAME, Manifest
from transforms.accounting import check_reconciled, check_rejected_fraction, document_counts
from transforms.objectives.summary import summarize_objective
from transforms.write import TMP_DIR, join_path, write_atomic

__all__ = ["WriteManifest", "hf_dataset_files", "summarize_lengths"]


def summarize_lengths(counters: dict[str, int], prefix: str) -> dict[str, Any]:
    """count/sum/min/max/mean and log2 histogram of a length counter family."""
    count = counters.get(f"{prefix}_count", 0)
    total = counters.get(f"{prefix}_sum", 0)
    hist = {k[len(prefix) + 6 :]: v for k, v in counters.items() if k.startswith(f"{prefix}_hist_")}
    return {
        "count": count,
        "sum": total,
        "min": counters.get(f"{prefix}_min", 0),
        "max": counters.get(f"{prefix}_max", 0),
        "mean": round(total / count, 4) if count else 0.0,
        "log2_histogram": {f"<{2 ** int(b)}": n for b, n in sorted(hist.items())},
    }


def hf_dataset_files(split: str, shard_paths: list[str], schema_meta: dict) -> dict[str, bytes]:
    """``state.json`` and ``dataset_info.json`` that let ``datasets.load_from_disk`` open a split."""
    fingerprint = hashlib.sha256("\n".join(shard_paths).encode()).hexdigest()[:16]
    state = {
        "_data_files": [{"filename": p.rsplit("/", 1)[-1]} for p in shard_paths],
        "_fingerprint": fingerprint,
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": split,
    }
    info = {"description": f"lmshards {schema_meta['family']} examples, split {split}", "citation": "",
            "homepage": "", "license": "", "features": None}
    return {
        "state.json": (json.dumps(state, indent=2, sort_keys=True) + "\n").encode(),
        "dataset_info.json": (json.dumps(info, indent=2, sort_keys=True) + "\n").encode(),
    }


class _WriteManifest(beam.DoFn):
    def __init__(self, output, static):
        self._output, self._static = output, static

    def process(self, _, shards, objective_stats, pack_stats, read_stats, reasons, rejected_files):
        static = self._static
        splits: dict[str, Any] = {}
        stats: dict[str, Any] = {}
        for split in static["splits"]:
            rows = sorted((s for s in shards if s["split"] == split), key=lambda s: s["index"])
            split_stats = objective_stats.get(split, {})
            packing = pack_stats.get(split, {})
            splits[split] = {
                "documents": packing.get("documents", 0),
                "duplicates": packing.get("duplicates", 0),
                "examples": sum(r["rows"] for r in rows),
                "tokens": sum(r["tokens"] for r in rows),
                "padding_tokens": split_stats.get("padding_tokens", 0),
                "dropped_tokens": packing.get("dropped_tokens", 0),
                "document_tokens": packing.get("doc_tokens_sum", 0) + (  # an EOS after each document
                    packing.get("documents", 0) if static["config"].get("document_separator", "eos") == "eos" else 0),
                "num_shards": len(rows),
                "shards": rows,
            }
            stats[split] = {
                "document_lengths": summarize_lengths(packing, "doc_tokens"),
                "objective": dict(sorted(split_stats.items())),
                "objective_summary": summarize_objective(
                    static["objective"]["name"], split_stats, static["objective"]["params"]
                ),
            }
        written = sum(s["documents"] for s in splits.values())
        duplicates = sum(s["duplicates"] for s in splits.values())
        counts = document_counts(read_stats, reasons, written, duplicates)
        counts["rejected_files"] = sorted(rejected_files, key=lambda f: f["path"])
        # Before anything is written: a run that lost documents, or is over the rejected limit,
        # fails and leaves no manifest.
        check_reconciled(counts)
        check_rejected_fraction(counts, static["config"].get("max_rejected_fraction"),
                                join_path(self._output, "rejected/rejected.jsonl"))
        for split, info in splits.items():
            if "arrow" in static["formats"] and info["shards"]:
                paths = [s["files"]["arrow"]["path"] for s in info["shards"]]
                for name, payload in hf_dataset_files(split, paths, static["schema"]).items():
                    relative = f"{split}/{FORMAT_DIRS['arrow']}/{name}"
                    write_atomic(self._output, relative, lambda h, p=payload: h.write(p))
        manifest = Manifest(
            objective=static["objective"],
            config=static["config"],
            tokenizer=static["tokenizer"],
            schema=static["schema"],
            counts=counts,
            splits=splits,
            stats=stats,
            run=static["run"],
        )
        text = manifest.dumps().encode("utf-8")
        write_atomic(self._output, MANIFEST_NAME, lambda h: h.write(text))
        try:
            FileSystems.delete([join_path(self._output, TMP_DIR)])
        except Exception:  # nothing left to clean, or a filesystem without directories
            pass
        yield manifest.to_json()


class WriteManifest(beam.PTransform):
    """Write ``manifest.json`` once everything else is written.

    Args:
        output: dataset directory.
        static: manifest parts known before the run (objective, config, tokenizer,
            schema, run, splits, formats).

    Inputs: ``(shards, objective_stats, pack_stats, read_stats, reasons, rejected_files)``
    (``objective_stats``: per split, the summed counters of BuildExamples); the counts
    follow :func:`transforms.accounting.document_counts`. When ``static["config"]`` has a
    ``max_rejected_fraction`` that the run exceeds, it raises
    :class:`~transforms.accounting.RejectedFractionError` and writes nothing.
    """

    def __init__(self, output, static):
        super().__init__()
        self._output, self._static = output, static

    def expand(self, inputs):
        shards, objective_stats, pack_stats, read_stats, reasons, rejected_files = inputs
        pipeline = shards.pipeline
        return (
            pipeline
            | "ManifestTrigger" >> beam.Create([None])
            | "WriteManifestFile"
            >> beam.ParDo(
                _WriteManifest(self._output, self._static),
                shards=beam.pvalue.AsList(shards),
                objective_stats=beam.pvalue.AsDict(objective_stats),
                pack_stats=beam.pvalue.AsDict(pack_stats),
                read_stats=beam.pvalue.AsSingleton(read_stats),
                reasons=beam.pvalue.AsDict(reasons),
                rejected_files=beam.pvalue.AsList(rejected_files),
            )
        )
