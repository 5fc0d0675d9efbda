"""WriteManifest: the last stage. Collects shard infos and statistics (as side inputs, so
it runs only after every shard is written; per split, the summed integer counters under
``stats[split]["objective"]`` and their summary from :mod:`transforms.objectives.summary`
under ``stats[split]["objective_summary"]``), writes the ``datasets`` metadata (so that
``datasets.load_from_disk`` opens ``OUT`` as a ``DatasetDict`` of the splits, ``OUT/SPLIT``
and ``OUT/SPLIT/arrow`` as one split), then ``manifest.json`` (atomically), then removes
``OUT/.tmp``.

The ``run`` block gets the inputs read without verified checksums (``unverified_inputs``:
zstd frames written without a content checksum), from the reader's statistics.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import apache_beam as beam

from schemas.manifest import FORMAT_DIRS, MANIFEST_NAME, Manifest
from transforms.objectives.counters import add_counters, sum_counters
from transforms.objectives.registry import summarizer
from transforms.packing.group import plan_summary
from transforms.reading.inputs import InputFile, check_all_unchanged
from transforms.reading.read import UNVERIFIED_PREFIX
from transforms.writing.accounting import (
    check_conservation,
    check_reconciled,
    check_rejected_fraction,
    check_splits_have_examples,
    document_counts,
)
from transforms.writing.output import RunLock, delete_tree
from transforms.writing.write import TMP_DIR, join_path, write_atomic

__all__ = ["MAX_SOURCES", "WriteManifest", "hf_dataset_files", "source_summary", "summarize_lengths"]


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


#: Sources kept in a split's ``sources`` (the largest by documents); the rest are summed as one.
MAX_SOURCES = 256
OTHER_SOURCES = "(other sources)"


def source_summary(sources: list, split: str) -> dict[str, Any]:
    """A split's documents, tokens and length histogram per source (``--source-field``), from
    ``((split, source), counters)``: the :data:`MAX_SOURCES` largest by documents (then by
    name), the others summed under :data:`OTHER_SOURCES`. Documents are counted as read,
    before exact duplicates are dropped."""
    rows = sorted(((name, counters) for (where, name), counters in sources if where == split),
                  key=lambda row: (-row[1].get("documents", 0), row[0]))
    kept, rest = rows[:MAX_SOURCES - 1] if len(rows) > MAX_SOURCES else rows, rows[MAX_SOURCES - 1:]
    if len(rows) > MAX_SOURCES:
        other: dict[str, int] = {}
        for _, counters in rest:
            add_counters(other, counters)
        kept = [*kept, (OTHER_SOURCES, other)]
    return {name: {"documents": counters.get("documents", 0), "tokens": counters.get("doc_tokens_sum", 0),
                   "document_lengths": summarize_lengths(counters, "doc_tokens")} for name, counters in kept}


def hf_dataset_files(split: str, shard_paths: list[str], schema_meta: dict, prefix: str = "") -> dict[str, bytes]:
    """``state.json`` and ``dataset_info.json`` that let ``datasets.load_from_disk`` open a split.

    Args:
        prefix: the shards' directory relative to where these files go (``arrow/`` for the
            files in ``OUT/SPLIT``; empty for those beside the shards).
    """
    fingerprint = hashlib.sha256("\n".join(shard_paths).encode()).hexdigest()[:16]
    state = {
        "_data_files": [{"filename": prefix + p.rsplit("/", 1)[-1]} for p in shard_paths],
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
    def __init__(self, output, static, lock: RunLock | None = None):
        self._output, self._static, self._lock = output, static, lock
        # The objective's summary function, looked up where the pipeline is built: a worker process
        # (multi_processing, Dataflow) imports the objective's module with the DoFn, not the
        # registration of an objective that another package registered in the launcher.
        self._summarize = summarizer(static["objective"]["name"])

    def process(self, _, shards, statistics, reasons, rejected_files, groups):
        static = self._static
        objective_stats, pack_stats, read_stats, sources = split_statistics(statistics)
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
                "pack_groups": plan_summary(groups.get(split)),
                "shards": rows,
            }
            stats[split] = {
                **({"sources": source_summary(sources, split)} if static["config"].get("source_field") else {}),
                "document_lengths": summarize_lengths(packing, "doc_tokens"),
                "objective": dict(sorted(split_stats.items())),
                "objective_summary": self._summarize(split_stats, static["objective"]["params"]),
            }
        written = sum(s["documents"] for s in splits.values())
        duplicates = sum(s["duplicates"] for s in splits.values())
        unverified = sorted(k[len(UNVERIFIED_PREFIX):] for k in read_stats if k.startswith(UNVERIFIED_PREFIX))
        read_stats = {k: v for k, v in read_stats.items() if not k.startswith(UNVERIFIED_PREFIX)}
        counts = document_counts(read_stats, reasons, written, duplicates)
        counts["rejected_files"] = sorted(rejected_files, key=lambda f: f["path"])
        # Before anything is written: a run that lost or repeated documents, tokens, examples or
        # rows, or is over the rejected limit, fails and leaves no manifest.
        check_reconciled(counts)
        for split, info in splits.items():
            check_conservation(split, info, objective_stats.get(split, {}), pack_stats.get(split, {}),
                               static["config"]["draws"])
        # A run's inputs must not change under it: one changed after it was read fails the run here.
        listed = [InputFile(f["path"], f["bytes"], f["modified"]) for f in static["run"].get("input_files", [])
                  if "modified" in f]
        check_all_unchanged(listed, "during the run")
        rejected_path = counts["rejected_files"][0]["path"] if len(counts["rejected_files"]) == 1 else "rejected/"
        check_rejected_fraction(counts, static["config"].get("max_rejected_fraction"),
                                join_path(self._output, rejected_path))
        check_splits_have_examples(splits, static["config"].get("last_chunk"))
        hf_splits = []
        for split, info in splits.items():
            if "arrow" in static["formats"] and info["shards"]:
                paths = [s["files"]["arrow"]["path"] for s in info["shards"]]
                arrow_dir = FORMAT_DIRS["arrow"]
                for directory, prefix in ((f"{split}/{arrow_dir}", ""), (split, f"{arrow_dir}/")):
                    for name, payload in hf_dataset_files(split, paths, static["schema"], prefix).items():
                        write_atomic(self._output, f"{directory}/{name}", lambda h, p=payload: h.write(p),
                                     self._lock)
                hf_splits.append(split)
        if hf_splits:
            listing = (json.dumps({"splits": hf_splits}, indent=2, sort_keys=True) + "\n").encode()
            write_atomic(self._output, "dataset_dict.json", lambda h: h.write(listing), self._lock)
        manifest = Manifest(
            objective=static["objective"],
            config=static["config"],
            tokenizer=static["tokenizer"],
            schema=static["schema"],
            counts=counts,
            splits=splits,
            stats=stats,
            run={**static["run"], "unverified_inputs": unverified},
        )
        text = manifest.dumps().encode("utf-8")
        write_atomic(self._output, MANIFEST_NAME, lambda h: h.write(text), self._lock)
        try:
            delete_tree(join_path(self._output, TMP_DIR))  # object by object: on gs:// a directory is a prefix
        except Exception:  # noqa: BLE001 - nothing left to clean
            pass
        yield manifest.to_json()


#: The kinds of counters :class:`SumStatistics` sums: the reader's (one set), the sources' (per
#: ``(split, source)``), Pack's and the objective's (per split).
STATISTICS_KINDS = ("read", "source", "pack", "objective")


class SumStatistics(beam.PTransform):
    """The run's counters, every kind summed by one combine: ``{kind: PCollection}`` (the kinds of
    :data:`STATISTICS_KINDS`; ``read`` holds counter dicts, the others ``(key, counters)``) ->
    ``((kind, key), summed counters)`` (``key`` ``""`` for ``read``).

    One combine, not one per kind: each is a shuffle and a stage or two of its own, a fixed cost
    of every run on every runner (:func:`split_statistics` takes the kinds apart again)."""

    def expand(self, kinds):
        unknown = set(kinds) - set(STATISTICS_KINDS)
        if unknown:
            raise ValueError(f"SumStatistics: unknown kinds {sorted(unknown)}")
        keyed = [kinds[kind] | f"Key{kind.capitalize()}Stats" >> beam.Map(_keyed_statistics, kind)
                 for kind in STATISTICS_KINDS if kind in kinds]
        return keyed | "AllStatistics" >> beam.Flatten() | "Sum" >> beam.CombinePerKey(sum_counters)


def _keyed_statistics(element, kind: str):
    """``((kind, key), counters)``: the reader's counters have no key of their own (``""``)."""
    return ((kind, ""), element) if kind == "read" else ((kind, element[0]), element[1])


def split_statistics(statistics: dict) -> tuple[dict, dict, dict, list]:
    """:class:`SumStatistics`' output (as a dict) -> ``(objective counters per split, Pack's per
    split, the reader's, [((split, source), counters)])``; a kind with nothing is empty."""
    by_kind: dict[str, dict] = {kind: {} for kind in STATISTICS_KINDS}
    for (kind, key), counters in statistics.items():
        by_kind[kind][key] = counters
    return by_kind["objective"], by_kind["pack"], by_kind["read"].get("", {}), list(by_kind["source"].items())


class WriteManifest(beam.PTransform):
    """Write ``manifest.json`` once everything else is written.

    Args:
        output: dataset directory.
        static: manifest parts known before the run (objective, config, tokenizer,
            schema, run, splits, formats).

    Inputs: ``(shards, statistics, reasons, rejected_files, groups)`` (``statistics``: the
    output of :class:`SumStatistics`: among them, per split, the summed counters of
    BuildExamples; ``groups``: the pack-group plan of :class:`transforms.packing.group.PlanGroups`,
    recorded per split as ``pack_groups``: groups, their tokens, the largest group's; one element,
    or none when the corpus gave nothing to plan: ``{}`` then); the counts
    follow :func:`transforms.writing.accounting.document_counts`. When ``static["config"]`` has a
    ``max_rejected_fraction`` that the run exceeds, it raises
    :class:`~transforms.writing.accounting.RejectedFractionError` and writes nothing. ``lock``: the
    run's lock (checked before every rename), or None.
    """

    def __init__(self, output, static, lock: RunLock | None = None):
        super().__init__()
        self._output, self._static, self._lock = output, static, lock

    def expand(self, inputs):
        shards, statistics, reasons, rejected_files, groups = inputs
        pipeline = shards.pipeline
        return (
            pipeline
            | "ManifestTrigger" >> beam.Create([None])
            | "WriteManifestFile"
            >> beam.ParDo(
                _WriteManifest(self._output, self._static, self._lock),
                shards=beam.pvalue.AsList(shards),
                statistics=beam.pvalue.AsDict(statistics),
                reasons=beam.pvalue.AsDict(reasons),
                rejected_files=beam.pvalue.AsList(rejected_files),
                groups=beam.pvalue.AsSingleton(groups, default_value={}),
            )
        )
