"""``lmshards validate``: everything that can be checked about a dataset without its corpus.

Checks, each reported as a :class:`Problem` naming the file or example:

1. ``manifest``: shard lists dense, split totals equal to the sums over shards.
2. ``missing`` / ``size`` / ``checksum``: every file the manifest lists exists with its
   size and sha256 (the tokenizer too).
3. ``schema``: Arrow schemas equal the manifest's and the objective's (:mod:`schemas.examples`);
   tar members are the schema's fields as int32 ``.npy`` or ``.txt``, with the manifest's
   dtypes and shapes (a member that differs is a ``read`` problem naming it).
4. ``rows`` / ``tokens``: per-shard row and raw-token counts equal the manifest's.
5. ``shard`` / ``order`` / ``duplicate``: each key sits in the shard the writer's hash
   names, rows are in the writer's seeded order, no key appears twice.
6. ``invariant``: the objective invariants and replay of :mod:`loaders.inspection.checks`.
7. ``cross-format``: Arrow and WebDataset copies hold the same rows (catches a copy that was
   changed and re-hashed into the manifest).
8. ``stats``: counters recomputed from the shards equal the manifest's (full scans only).

``sample=N`` checks about N examples per split (the leading rows of every shard, a
uniform sample since rows are stored in hashed order); files are still hashed whole.
A change to a token that breaks none of these (e.g. one text token replaced by another
in every copy, with the manifest re-hashed) is indistinguishable from real data.
"""

from __future__ import annotations

import itertools
import math
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from loaders.access.files import sha256_file
from loaders.inspection.anatomy import Anatomy, ObjectiveView, take_apart
from loaders.inspection.checks import example_problems
from loaders.inspection.source import InspectedDataset, order_digest, shard_of_key
from loaders.inspection.table import split_context
from schemas.manifest import MANIFEST_VERSION
from transforms.objectives.base import InspectionContext

__all__ = ["Problem", "ValidationReport", "validate_dataset"]



@dataclass(frozen=True)
class Problem:
    """One thing wrong: which check, where (file or example), what."""

    check: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.where}: {self.message}"


@dataclass
class ValidationReport:
    """Problems found and how much was checked."""

    problems: list[Problem] = field(default_factory=list)
    examples_checked: int = 0
    files_hashed: int = 0
    sample: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        by_check = Counter(p.check for p in self.problems)
        return {"ok": self.ok, "examples_checked": self.examples_checked, "files_hashed": self.files_hashed,
                "sample": self.sample, "problems_by_check": dict(sorted(by_check.items())),
                "problems": [asdict(p) for p in self.problems]}

    def format(self, max_problems: int = 50) -> str:
        lines = [str(p) for p in self.problems[:max_problems]]
        if len(self.problems) > max_problems:
            lines.append(f"... and {len(self.problems) - max_problems} more (--max-problems, or --json for all)")
        scope = f"a sample of {self.examples_checked:,}" if self.sample else f"{self.examples_checked:,}"
        verdict = "OK" if self.ok else f"FAILED: {len(self.problems)} problem(s) " + ", ".join(
            f"{check} {n}" for check, n in sorted(Counter(p.check for p in self.problems).items()))
        lines.append(f"validate: {verdict}; checked {scope} examples, hashed {self.files_hashed} files")
        return "\n".join(lines) + "\n"


def _check_file(ds: InspectedDataset, relative: str, size: int | None, sha256: str, report: ValidationReport,
                ) -> str | None:
    """Local path of a listed file after its size and checksum checks; None when missing."""
    try:
        path = ds.files.local_file(relative)
    except FileNotFoundError:
        report.problems.append(Problem("missing", relative, "listed in the manifest but not found"))
        return None
    if size is not None and os.path.getsize(path) != size:
        report.problems.append(Problem("size", relative, f"{os.path.getsize(path)} bytes, the manifest says {size}"))
    actual = sha256_file(path)
    report.files_hashed += 1
    if actual != sha256:
        report.problems.append(Problem("checksum", relative, f"sha256 {actual} does not match the manifest's {sha256}"))
    return path


def _check_manifest(ds: InspectedDataset, report: ValidationReport) -> None:
    for split, info in ds.manifest.splits.items():
        shards = ds.shards(split)
        if not info.get("examples"):
            report.problems.append(Problem("empty", split, "the split has no examples (a training job cannot use it)"))
        if [s.index for s in shards] != list(range(len(shards))) or info.get("num_shards", len(shards)) != len(shards):
            report.problems.append(Problem("manifest", split, f"shard indices {[s.index for s in shards]} are not "
                                           f"0..{info.get('num_shards', len(shards)) - 1}"))
        for name, total in (("examples", sum(s.rows for s in shards)), ("tokens", sum(s.tokens for s in shards))):
            if info.get(name) != total:
                report.problems.append(Problem("manifest", split,
                                               f"{name} {info.get(name)} != {total} over its shards"))
        for shard in shards:
            missing = sorted(set(ds.formats) - set(shard.files))
            if missing:
                report.problems.append(Problem("manifest", f"{split} shard {shard.index}", f"no {missing} file"))


def _arrow_schema_problem(path: str, view: ObjectiveView, manifest_columns: list[tuple[str, str]]) -> str | None:
    try:
        with pa.memory_map(path, "r") as source:
            schema = pa.ipc.open_stream(source).schema
    except (pa.ArrowInvalid, OSError) as exc:
        return f"not an Arrow IPC stream ({exc})"
    got = [(f.name, str(f.type)) for f in schema]
    shown = ", ".join(f"{name}: {kind}" for name, kind in got)
    if got != manifest_columns:
        want = ", ".join(f"{name}: {kind}" for name, kind in manifest_columns)
        return f"schema ({shown}) differs from the manifest's ({want})"
    expected = view.schema.schema
    if got != [(f.name, str(f.type)) for f in expected]:
        want = ", ".join(f"{f.name}: {f.type}" for f in expected)
        return f"schema ({shown}) differs from the objective's ({want})"
    return None


def _tar_fields_problem(example: dict[str, Any], view: ObjectiveView) -> str | None:
    expected = set(view.schema.schema.names)
    if set(example) != expected:
        return f"fields {sorted(example)} differ from the schema's {sorted(expected)}"
    bad = [c for c in view.schema.array_columns if np.asarray(example[c]).dtype != np.int32]
    return f"columns {bad} are not int32" if bad else None


def _same_example(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    columns = sorted(set(a) | set(b))
    return [c for c in columns if c not in a or c not in b or not np.array_equal(np.asarray(a[c]), np.asarray(b[c]))]


def _exact_counters(example: dict[str, Any], a: Anatomy, view: ObjectiveView, context: InspectionContext) -> Counter:
    """The manifest counters an example contributes that the shards determine exactly: the
    common ones, counted here, and the objective's own (``Objective.shard_counters``) of an
    example whose parts are complete."""
    c = Counter(examples=1, chunk_tokens=a.raw_tokens, padding_tokens=a.padding)
    if a.complete:
        c.update(view.objective.shard_counters(context.known(example=example, anatomy=a)))
    return c


def _covered(name: str, objective: Any) -> bool:
    """Whether a manifest counter is one the shards determine exactly (``Objective.exact_counters``)."""
    base = name.rpartition("/")[2]
    if base in ("examples", "chunk_tokens", "padding_tokens"):
        return True
    return any(base.startswith(entry[:-1]) if entry.endswith("*") else base == entry
               for entry in objective.exact_counters)


def _check_counters(split: str, manifest: dict[str, int], shards: Counter, objective: Any,
                    report: ValidationReport) -> None:
    for name, value in sorted(manifest.items()):
        if _covered(name, objective) and shards.get(name, 0) != value:
            report.problems.append(Problem("stats", split, f"counter {name}: manifest {value}, shards "
                                           f"{shards.get(name, 0)}"))
    # Histograms: a bin the shards have and the manifest lacks, where the manifest keeps that histogram.
    histograms = {name.partition("span_len_hist_")[0] for name in manifest if "span_len_hist_" in name}
    for name in sorted(set(shards) - set(manifest)):
        if "span_len_hist_" in name and name.partition("span_len_hist_")[0] in histograms:
            report.problems.append(Problem("stats", split, f"counter {name}: not in the manifest, shards "
                                           f"{shards[name]}"))


def _guarded(stream: Any, fmt: str, failures: dict[str, Exception]) -> Any:
    """``stream`` that ends quietly at a read error, recorded in ``failures``."""
    try:
        yield from stream
    except Exception as exc:  # a truncated or garbled file
        failures[fmt] = exc


@dataclass
class _SplitState:
    context: InspectionContext  # what the objective's hooks get for the split
    keys: set[str] = field(default_factory=set)
    counters: Counter = field(default_factory=Counter)
    complete: bool = True  # every shard read whole: the counters can be compared with the manifest's


def _check_example(ds: InspectedDataset, view: ObjectiveView, split: str, shard_index: int, shards: int, row: int,
                   example: dict[str, Any], state: _SplitState, report: ValidationReport, primary: str) -> int:
    """Check one example; return its raw tokens."""
    key = str(example.get("key", ""))
    at = f"{key} ({split} shard {shard_index} row {row})"
    if primary == "webdataset" and (problem := _tar_fields_problem(example, view)):
        report.problems.append(Problem("schema", at, problem))
        return 0
    if (expected := shard_of_key(ds.seed, key, shards)) != shard_index:
        report.problems.append(Problem("shard", at, f"the writer's hash puts this key in shard {expected}"))
    if key in state.keys:
        report.problems.append(Problem("duplicate", at, "key appears more than once"))
    state.keys.add(key)
    raw = 0
    try:
        anatomy = take_apart(example, view, state.context)
        raw = anatomy.raw_tokens
        state.counters.update(_exact_counters(example, anatomy, view, state.context))
        found = example_problems(split, example, anatomy, view, ds.seed, state.context)
    except Exception as exc:  # content too broken to take apart, or to replay
        found = [f"cannot be checked: {exc!r}"]
    report.problems += [Problem("invariant", at, p) for p in found]
    return raw


def _check_shard(ds: InspectedDataset, view: ObjectiveView, split: str, shard: Any, per_shard: int | None,
                 state: _SplitState, report: ValidationReport) -> None:
    paths = {fmt: _check_file(ds, f.path, f.bytes, f.sha256, report) for fmt, f in sorted(shard.files.items())}
    readable = [fmt for fmt in ("arrow", "webdataset") if paths.get(fmt)]
    columns = [(c["name"], c["type"]) for c in ds.manifest.schema.get("columns", [])]
    if "arrow" in readable and (problem := _arrow_schema_problem(paths["arrow"], view, columns)):
        report.problems.append(Problem("schema", shard.files["arrow"].path, problem))
        readable.remove("arrow")
    if not readable:
        state.complete = False
        return
    primary, others = readable[0], readable[1:]
    failures: dict[str, Exception] = {}
    streams = [_guarded(ds.iter_shard(split, shard.index, fmt, per_shard), fmt, failures) for fmt in readable]
    shards, rows, raw, previous = len(ds.shards(split)), 0, 0, b""
    for row, copies in enumerate(itertools.zip_longest(*streams)):
        example = copies[0]
        for fmt, copy in zip(others, copies[1:]):
            if fmt in failures or primary in failures:
                continue
            if example is None or copy is None or (diff := _same_example(example, copy)):
                what = "has a different row count" if example is None or copy is None else f"differs in {diff}"
                report.problems.append(Problem("cross-format", f"{shard.files[fmt].path} row {row}",
                                               f"{fmt} copy {what} from {primary}"))
        if example is None:
            continue
        rows += 1
        order = order_digest(ds.seed, str(example.get("key", "")))
        if order < previous:
            report.problems.append(Problem("order", f"{example.get('key')} ({split} shard {shard.index} row {row})",
                                           "row is out of the writer's seeded order"))
        previous = order
        raw += _check_example(ds, view, split, shard.index, shards, row, example, state, report, primary)
    for fmt, exc in failures.items():
        report.problems.append(Problem("read", shard.files[fmt].path, f"cannot be read to the end: {exc}"))
        state.complete = False
    report.examples_checked += rows
    where = shard.files[primary].path
    if primary not in failures and (per_shard is None or per_shard >= shard.rows):
        if rows != shard.rows:
            report.problems.append(Problem("rows", where, f"{rows} rows, the manifest says {shard.rows}"))
        elif raw != shard.tokens:
            report.problems.append(Problem("tokens", where, f"{raw} raw tokens, the manifest says {shard.tokens}"))


def validate_dataset(ds: InspectedDataset, *, sample: int | None = None,
                     progress: Callable[[str], None] | None = None) -> ValidationReport:
    """Run every check (see the module docstring) and return the problems found."""
    report = ValidationReport(sample=sample or None)
    ds.verify_reads = False  # every file is hashed and checked here, and what is wrong reported
    _check_manifest(ds, report)
    tokenizer = ds.manifest.tokenizer
    if _check_file(ds, tokenizer.get("file", "tokenizer.json"), None, tokenizer.get("sha256", ""), report) is None:
        return report
    if ds.manifest.format_version != MANIFEST_VERSION:  # another layout and noise: only the files can be checked
        report.problems.append(Problem(
            "manifest", "format_version", f"format {ds.manifest.format_version}, written by another lmshards: this "
            f"one (format {MANIFEST_VERSION}) places, orders and noises examples otherwise; the files are hashed, "
            "the examples are not checked (validate with the lmshards that wrote it)"))
        for split in ds.splits:
            for shard in ds.shards(split):
                for file in shard.files.values():
                    _check_file(ds, file.path, file.bytes, file.sha256, report)
        return report
    view = ds.view
    keys: set[str] = set()
    for split in ds.splits:
        shards = ds.shards(split)
        per_shard = math.ceil(sample / max(1, sum(1 for s in shards if s.rows))) if sample else None
        state = _SplitState(split_context(ds, split), keys=keys)
        for shard in shards:
            if progress:
                progress(f"{split} shard {shard.index + 1}/{len(shards)}")
            _check_shard(ds, view, split, shard, per_shard, state, report)
        if not sample and state.complete:
            _check_counters(split, ds.manifest.stats.get(split, {}).get("objective", {}), state.counters,
                            view.objective, report)
    return report
