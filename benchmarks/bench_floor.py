"""The floor of Beam's runner under ``lmshards materialize``: the same graph without the work.

What would a materialize run cost if tokenizing, packing and building examples were free?
Per objective and runner mode this script times, each run in a fresh process and in rounds
interleaved with the fastokens ceiling and real materialize runs
(:func:`benchmarks.bench_materialize.measure`), and prints as seconds and as a throughput
ratio to the ceiling:

- ``start-up``: the floor graph below on no input file: every stage, side input and shuffle
  of a materialize run built, scheduled and run on no data (Beam's fixed cost per run);
- ``bare``: the floor graph on the corpus. It is :func:`pipelines.materialize.build_pipeline`'s
  graph with the same primitive transforms (``ParDo``, ``GroupByKey``, ``Flatten``,
  ``Impulse`` and side inputs: the script checks it, :func:`compare_graphs`), doing the least
  that still moves the same bytes through the same shuffles:

  - ReadCorpus: the same files listed, spread and read (gzip and one ``json.loads`` per
    line, no verification pass; the records with a NUL byte, which materialize rejects, go
    to the rejected output); its line-position fix-up is materialize's own;
  - Tokenize: no encoder; the documents leave as Tokenize emits them, one
    ``(split, encoded DocumentBatch)`` per split of each batch of ``BATCH_SIZE`` texts of a
    bundle, each document's ids as many uint16 as it has tokens (counted once with fastokens
    and cached under ``benchmarks/.cache/``), its key, split (1% validation) and sub-bucket
    from a cheap integer hash instead of blake2b, and a bool per token for each feature the
    objective asks for (bart's word and sentence starts);
  - PlanGroups, AssignGroups: materialize's own transforms;
  - Pack: a group's blocks decoded, their ids (and features) joined once, EOS between documents, cut into
    ``Chunk`` elements of the objective's raw length (views; no sorting, no packer, no
    plan), the remainders through the same ``GroupRemainders`` shuffle;
  - BuildExamples over both chunk outputs as materialize's runner tuning applies it (on
    FnApiRunner once per output, else over their Flatten), with the split-token side input:
    chunks stacked into blocks of ``BLOCK_ROWS`` rows, each block one element per shard, in
    the layout of ``ShardPiece.encode`` (16-byte order keys, shard hashes and token counts
    per row, and the chunk's tokens once per token column of the objective, as uint16); no
    objective;
  - WriteShards: the same markers and ``GroupByShard``; each shard's bytes written once per
    format (side by side, as materialize writes them) to a temporary file and renamed (no
    Arrow or tar framing, no sort, no sha256);
  - WriteRejected and SumStatistics (materialize's own), and a manifest writer with
    WriteManifest's five side inputs that checks documents and rows add up.

  The runner tuning is materialize's (:class:`pipelines.runner_tuning.RunnerTuning`): in
  process, documents and example batches cross the shuffles by reference where
  build_pipeline hands them over; with ``multi_processing`` they travel as bytes and the
  workers freeze their heaps. Beam's
  pipeline type check is off, as in materialize.

- reading the corpus and writing the bare floor's shard bytes alone, without Beam, in one
  process: the floor's file work.

A materialize run cannot be faster than its bare floor on the same runner (it does all of
this and more), so a floor ratio below a target's ratio makes that target impossible on that
runner, by the factor between them.

    python -m benchmarks.bench_floor --objectives clm,bart,ul2 --repeats 3
    python -m benchmarks.bench_floor --objectives clm --modes in_process --no-materialize
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import apache_beam as beam
import numpy as np
from apache_beam.options.pipeline_options import PipelineOptions, TypeOptions
from apache_beam.transforms.window import GlobalWindows

from benchmarks.bench_materialize import (
    CACHE,
    MODES,
    RESULT_PREFIX,
    corpus_of,
    default_tokenizer,
    load_texts,
    measure,
    objective_args,
)
from benchmarks.bench_materialize import _child as materialize_child
from pipelines.parallelism import RunnerSetup
from pipelines.runner_tuning import choose_tuning, tuning_for
from pipelines.tuned_run import TunedRun
from transforms.building.parallel import BLOCK_ROWS
from transforms.elements import Chunk, DocumentBatch
from transforms.objectives.layout import shard_count
from transforms.objectives.packing import Piece
from transforms.packing.group import SUB_BUCKETS, AssignGroups, PlanGroups
from transforms.packing.group import split_tokens as document_tokens
from transforms.reading.read import empty_file_rejection, rejection
from transforms.reading.splits import FixLinePositions
from transforms.tokenizing.tokenize import BATCH_SIZE
from transforms.writing.manifest import SumStatistics, split_statistics
from transforms.writing.write import WriteRejected

__all__ = ["build_floor", "compare_graphs", "graph_counts", "read_documents", "read_records", "token_counts"]

MODULE = "benchmarks.bench_floor"
VALIDATION_FRACTION = 0.01
FORMATS = ("arrow", "webdataset")
EOS_IDS = np.zeros(1, dtype="<u2")
_NO_FEATURE = np.zeros(1, dtype=np.bool_)
_MASK64 = (1 << 64) - 1
#: Part of the token counts cache's name: changes with what :func:`read_documents` keeps.
_COUNTS_VERSION = 2


# --- the corpus ------------------------------------------------------------------------------


def read_records(path: str):
    """The records of one JSONL(.gz) file: one decompression, one ``json.loads`` per line;
    each a text, or None for one materialize rejects (a NUL byte in its text). Blank lines and
    blank texts are skipped. (The runs check that the documents the floor keeps hold the
    ceiling's tokens, so this reader keeps what materialize keeps, on the corpus used.)"""
    with open(path, "rb") as handle:
        data = handle.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    for line in data.split(b"\n"):
        if line.strip():
            text = json.loads(line)["text"]
            if text and not text.isspace():
                yield None if "\x00" in text else text


def read_documents(path: str):
    """The texts of :func:`read_records` that are kept."""
    return (text for text in read_records(path) if text is not None)


def token_counts(pattern: str, tokenizer: str, cache_dir: str = CACHE) -> dict[str, list[int]]:
    """Tokens of every document :func:`read_documents` yields, per file name, counted with
    fastokens once and cached in ``cache_dir`` by the files' and the tokenizer's identity."""
    files = sorted(glob.glob(pattern))
    with open(tokenizer, "rb") as handle:
        tokenizer_bytes = handle.read()
    identity = hashlib.sha256(b"%d\0" % _COUNTS_VERSION + tokenizer_bytes)
    for path in files:
        stat = os.stat(path)
        identity.update(f"{os.path.abspath(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    cache = os.path.join(cache_dir, f"floor-tokens-{identity.hexdigest()[:16]}.json")
    if os.path.exists(cache):
        with open(cache, encoding="utf-8") as handle:
            return json.load(handle)
    import fastokens

    encoder = fastokens.Tokenizer.from_json_str(tokenizer_bytes.decode("utf-8"))
    counts = {}
    for path in files:
        texts = list(read_documents(path))
        counted: list[int] = []
        for start in range(0, len(texts), 512):
            _, offsets = encoder.encode_batch_flat(texts[start : start + 512], add_special_tokens=False,
                                                   split_special_tokens=True)
            counted.extend(np.diff(np.frombuffer(offsets, dtype=np.int64)).tolist())
        counts[os.path.basename(path)] = counted
    os.makedirs(cache_dir, exist_ok=True)
    with open(cache + ".partial", "w", encoding="utf-8") as handle:
        json.dump(counts, handle)
    os.replace(cache + ".partial", cache)
    return counts


def _mix64(value: int) -> int:
    """splitmix64's finalizer: a cheap stand-in for Tokenize's blake2b digests."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


# --- the floor's stages ----------------------------------------------------------------------


class _ReadFile(beam.DoFn):
    """ReadRecords: ``(file, index, tokens, text)`` per document, one counters dict per file."""

    def __init__(self, counts: dict[str, list[int]]):
        self._counts = counts
        self._names = sorted(counts)

    def process(self, path):
        name = os.path.basename(path)
        file_id, counts = self._names.index(name), self._counts[name]
        documents = rejected = 0
        for position, text in enumerate(read_records(path)):
            if text is None:
                rejected += 1
                yield beam.pvalue.TaggedOutput("rejected", rejection(path, position, "nul_bytes"))
                continue
            yield file_id, documents, counts[documents], text
            documents += 1
        if documents != len(counts):
            raise RuntimeError(f"{path}: {documents} documents, the token counts cache has {len(counts)}")
        yield beam.pvalue.TaggedOutput("stats", {"documents": documents, "rejected": rejected})


class _Tokenize(beam.DoFn):
    """Tokenize without an encoder: ``(split, encoded DocumentBatch)`` per split of each batch."""

    def __init__(self, features):
        self._features = tuple(features)

    def start_bundle(self):
        self._batch = []

    def process(self, element):
        self._batch.append(element)
        if len(self._batch) >= BATCH_SIZE:
            yield from self._emit()

    def finish_bundle(self):
        for output in self._emit():
            yield GlobalWindows.windowed_value(output)

    def _emit(self):
        batch, self._batch = self._batch, []
        if not batch:
            return
        keys, buckets, lengths, splits = [], [], [], []
        for file_id, index, tokens, _text in batch:
            mixed = _mix64(file_id << 40 | index)
            keys.append(mixed.to_bytes(8, "little") + _mix64(mixed).to_bytes(8, "little"))
            splits.append(mixed % 10_000 < VALIDATION_FRACTION * 10_000)
            buckets.append((mixed >> 24) % SUB_BUCKETS)
            lengths.append(tokens)
        offsets = np.zeros(len(batch) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        whole = DocumentBatch(np.frombuffer(b"".join(keys), np.uint8).reshape(-1, 16), np.array(buckets, np.uint64),
                              offsets, np.zeros(int(offsets[-1]), np.uint16),
                              {name: np.zeros(int(offsets[-1]), np.bool_) for name in self._features})
        validation = np.array(splits, dtype=bool)
        for split, mask in (("train", ~validation), ("validation", validation)):
            if mask.any():
                yield split, (whole if mask.all() else whole.take(np.flatnonzero(mask))).encode()


def _chunks(split: str, prefix: str, tokens: np.ndarray, features: dict, length: int):
    """Chunks of ``length`` tokens (views), and the rest: ``(chunks, rest tokens, rest features)``."""
    full = len(tokens) // length
    chunks = [Chunk(split, f"{prefix}-c{index:06d}", 0,
                    Piece(tokens[index * length : (index + 1) * length], np.array([length]),
                          {name: values[index * length : (index + 1) * length] for name, values in features.items()}))
              for index in range(full)]
    cut = full * length
    return chunks, tokens[cut:].copy(), {name: values[cut:].copy() for name, values in features.items()}


class _Pack(beam.DoFn):
    """One copy of a group's ids and features (EOS between documents), cut into chunks."""

    def __init__(self, length: int, features):
        self._length, self._features = length, tuple(features)

    def process(self, element):
        (split, group), grouped = element
        ids, features, documents, doc_tokens = [], {name: [] for name in self._features}, 0, 0
        for value in grouped:  # AssignGroups' blocks
            block = DocumentBatch.decode(tuple(value))
            offsets = block.offsets.tolist()
            for start, end in zip(offsets, offsets[1:]):
                ids += (block.ids[start:end], EOS_IDS)
                for name, parts in features.items():
                    parts += (block.features[name][start:end], _NO_FEATURE)
            documents += block.count
            doc_tokens += block.tokens
        tokens = np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32)  # as Pack copies them
        del ids
        joined = {name: np.concatenate(parts) for name, parts in features.items()}
        chunks, rest, rest_features = _chunks(split, f"{split}-g{group:05d}", tokens, joined, self._length)
        yield from chunks
        yield beam.pvalue.TaggedOutput("stats", (split, {"documents": documents, "doc_tokens": doc_tokens}))
        if len(rest):
            yield beam.pvalue.TaggedOutput("rest", (split, (group, rest, rest_features)))


def _repack(element, length: int):
    split, rests = element
    rests = sorted(rests, key=lambda rest: rest[0])
    tokens = np.concatenate([rest[1] for rest in rests])
    features = {name: np.concatenate([rest[2][name] for rest in rests]) for name in rests[0][2]}
    yield from _chunks(split, f"{split}-r", tokens, features, length)[0]


class _FloorBuild(beam.PTransform):
    """BuildExamples' shape: ``(chunks, split_tokens)`` -> ``(batches, stats)`` through :class:`_Build`."""

    def __init__(self, sizing: dict, columns: tuple[str, ...]):
        super().__init__()
        self._fn = _Build(sizing, columns)

    def expand(self, inputs):
        chunks, split_tokens = inputs
        built = chunks | "ApplyObjective" >> beam.ParDo(
            self._fn, split_tokens=beam.pvalue.AsDict(split_tokens)).with_outputs("stats", main="batches")
        return built.batches, built.stats


class _Build(beam.DoFn):
    """Chunks -> blocks of :data:`BLOCK_ROWS` rows, one ``ShardPiece.encode()``-shaped element
    per shard a block touches; no objective."""

    def __init__(self, sizing: dict, columns: tuple[str, ...]):
        self._sizing, self._columns = sizing, columns

    def start_bundle(self):
        self._rows: dict[str, list] = {}
        self._counts: dict[str, int] = {}
        self._built: collections.Counter = collections.Counter()

    def process(self, chunk, split_tokens):
        split = chunk.split
        if split not in self._counts:
            self._counts[split] = shard_count(split, split_tokens.get(split, 0), **self._sizing)
        rows = self._rows.setdefault(split, [])
        rows.append(chunk.piece.tokens)
        if len(rows) >= BLOCK_ROWS:
            yield from self._block(split)

    def _block(self, split):
        block = np.stack(self._rows.pop(split))
        count, first = self._counts[split], self._built[split]
        self._built[split] += len(block)
        shards = np.arange(first, first + len(block)) % count
        for shard in np.unique(shards).tolist():
            rows = block[shards == shard]
            n, width = rows.shape
            offsets = np.arange(0, (n + 1) * width, width, dtype=np.int64).tobytes()
            narrow = rows.astype("<u2").tobytes()  # as the 16k vocabulary's ids travel
            columns = (n, {name: (narrow, "<u2", offsets) for name in self._columns}, {}, {})
            piece = (np.zeros(16 * n, np.uint8).tobytes(), np.zeros(n, np.uint64).tobytes(),
                     np.full(n, width, np.int64).tobytes(), columns)
            yield (split, shard, count), piece

    def finish_bundle(self):
        for split in list(self._rows):
            for output in self._block(split):
                yield GlobalWindows.windowed_value(output)
        for split, built in sorted(self._built.items()):
            yield beam.pvalue.TaggedOutput("stats", GlobalWindows.windowed_value((split, {"examples": built})))


def _shard_markers(element, sizing):
    split, tokens = element
    count = shard_count(split, tokens, **sizing)
    for index in range(count):
        yield (split, index, count), None


def _write_file(output: str, relative: str, parts: list) -> int:
    temp = os.path.join(output, ".tmp", f"{uuid.uuid4().hex}-{relative.replace('/', '-')}")
    written = 0
    with open(temp, "wb") as handle:
        for part in parts:
            for flat, dtype, _ in part[3][1].values():
                written += handle.write(np.frombuffer(flat, dtype=dtype).astype(np.int32))  # int32, as shards hold
    os.rename(temp, os.path.join(output, relative))
    return written


class _WriteShard(beam.DoFn):
    def __init__(self, output: str):
        self._output = output

    def process(self, element):
        (split, index, count), pieces = element
        parts = [piece for piece in pieces if piece is not None]
        names = [f"{split}/{fmt}/data-{index:05d}-of-{count:05d}" for fmt in FORMATS]
        with ThreadPoolExecutor(max_workers=len(names) - 1) as pool:
            others = [pool.submit(_write_file, self._output, name, parts) for name in names[1:]]
            written = [_write_file(self._output, names[0], parts)] + [future.result() for future in others]
        yield {"split": split, "index": index, "rows": sum(part[3][0] for part in parts), "bytes": sum(written)}


class _WriteManifest(beam.DoFn):
    def __init__(self, output: str):
        self._output = output

    def process(self, _, shards, statistics, reasons, rejected_files, groups):
        objective_stats, pack_stats, read_stats, _ = split_statistics(statistics)
        documents = sum(stats.get("documents", 0) for stats in pack_stats.values())
        duplicates = sum(stats.get("duplicates", 0) for stats in pack_stats.values())
        if documents + duplicates != read_stats.get("documents", 0):
            raise RuntimeError(f"floor: {read_stats.get('documents', 0)} documents read, {documents} packed "
                               f"and {duplicates} duplicates")
        examples = sum(stats["examples"] for stats in objective_stats.values())
        rows = sum(shard["rows"] for shard in shards)
        if rows != examples:
            raise RuntimeError(f"floor: {examples} examples built, {rows} written")
        manifest = {"documents": documents, "examples": examples, "shards": len(shards),
                    "doc_tokens": sum(stats.get("doc_tokens", 0) for stats in pack_stats.values()),
                    "bytes": sum(shard["bytes"] for shard in shards), "rejected": sum(reasons.values()),
                    "groups": {split: len(plan["tokens"]) for split, plan in groups.items()}}
        with open(os.path.join(self._output, "manifest.json"), "w", encoding="utf-8") as handle:
            json.dump(manifest, handle)
        yield manifest


def build_floor(pipeline: beam.Pipeline, files: list[str], counts: dict[str, list[int]], *, output: str,
                length: int, columns: tuple[str, ...], features=(), group_tokens: int, shard_bytes: int,
                tuned: TunedRun | None = None) -> None:
    """Add the floor's stages (see the module docstring) to ``pipeline``, writing under ``output``.

    Args:
        files: the corpus files (none: the start-up floor).
        counts: :func:`token_counts` of the files.
        length: the objective's raw chunk length (its mean, for UL2).
        columns: the objective's token columns (each holds a copy of the chunk's tokens).
        features: the per-token features the objective's Tokenize computes.
        group_tokens, shard_bytes: materialize's ``--pack-group-tokens`` and ``--shard-size-mb`` (in bytes).
        tuned: materialize's runner tuning for the run's runner (None: the plain graph).
    """
    tuned = tuned or TunedRun()
    sizing = {"num_shards": None, "tokens_per_example": length, "draws": 1,
              "bytes_per_example": 4 * length * len(columns), "shard_bytes": shard_bytes}
    # ReadCorpus
    read = (
        pipeline
        | "ReadCorpus/ListFiles" >> beam.Create(files, reshuffle=False)
        | "ReadCorpus/SpreadFiles" >> beam.Reshuffle()
        | "ReadCorpus/SplitFiles" >> beam.FlatMap(lambda path: [path])
        | "ReadCorpus/SpreadTasks" >> beam.Reshuffle()
        | "ReadCorpus/ReadRecords" >> beam.ParDo(_ReadFile(counts)).with_outputs(
            "rejected", "stats", "relative", "lines", main="texts")
    )
    shifted, empty = (read.relative, read.lines) | "ReadCorpus/FixLinePositions" >> FixLinePositions()
    empty_rejected = empty | "ReadCorpus/EmptyFileRejections" >> beam.Map(empty_file_rejection)
    read_rejected = (read.rejected, shifted, empty_rejected) | "ReadCorpus/AllRejected" >> beam.Flatten()
    empty_stats = empty | "ReadCorpus/EmptyFileStats" >> beam.Map(lambda _: {"rejected": 1})
    read_stats = (read.stats, empty_stats) | "ReadCorpus/AllReadStats" >> beam.Flatten()
    # Tokenize, PlanGroups, AssignGroups
    tokenized = tuned.before_tokenize(read.texts) | "Tokenize/Encode" >> beam.ParDo(
        _Tokenize(features)).with_outputs("rejected", "sources", main="documents")
    groups = tokenized.documents | "PlanGroups" >> PlanGroups(group_tokens)
    documents = tuned.hand_over(tokenized.documents, "HandOverDocuments", values_only=True)
    assigned = documents | "AssignGroups" >> AssignGroups(groups)
    assigned = tuned.hand_over(assigned, "HandOverBlocks", values_only=True)
    # Pack
    packed = (
        assigned
        | "Pack/GroupByPackGroup" >> beam.GroupByKey()
        | "Pack/PackBuckets" >> beam.ParDo(_Pack(length, features)).with_outputs("stats", "rest", main="chunks")
    )
    repacked = (
        packed.rest
        | "Pack/GroupRemainders" >> beam.GroupByKey()
        | "Pack/RepackRemainders" >> beam.FlatMap(_repack, length=length).with_outputs("stats", main="chunks")
    )
    packing_stats = (packed.stats, repacked.stats) | "Pack/AllPackStats" >> beam.Flatten()
    split_tokens = (
        tokenized.documents
        | "DocumentTokens" >> beam.Map(document_tokens)
        | "TokensPerSplit" >> beam.CombinePerKey(sum)
    )
    # BuildExamples over both chunk outputs (as materialize's runner tuning applies it), WriteShards
    batches, build_stats = tuned.build_examples((packed.chunks, repacked.chunks), split_tokens,
                                                lambda separate_ok: _FloorBuild(sizing, tuple(columns)))
    markers = split_tokens | "WriteShards/ShardMarkers" >> beam.FlatMap(_shard_markers, sizing=sizing)
    shards = (
        (*batches, markers)
        | "WriteShards/AllPieces" >> beam.Flatten()
        | "WriteShards/GroupByShard" >> beam.GroupByKey()
        | "WriteShards/WriteShardFiles" >> beam.ParDo(_WriteShard(output))
    )
    # WriteRejected, statistics, WriteManifest
    rejected = (read_rejected, tokenized.rejected) | "AllRejected" >> beam.Flatten()
    rejected_files, reasons = rejected | "WriteRejected" >> WriteRejected(output)
    statistics = {"read": read_stats, "source": tokenized.sources, "pack": packing_stats,
                  "objective": build_stats} | "SumStatistics" >> SumStatistics()
    _ = (
        pipeline
        | "WriteManifest/ManifestTrigger" >> beam.Create([None])
        | "WriteManifest/WriteManifestFile" >> beam.ParDo(
            _WriteManifest(output),
            shards=beam.pvalue.AsList(shards),
            statistics=beam.pvalue.AsDict(statistics),
            reasons=beam.pvalue.AsDict(reasons),
            rejected_files=beam.pvalue.AsList(rejected_files),
            groups=beam.pvalue.AsSingleton(groups, default_value={}),
        )
    )


# --- graphs ----------------------------------------------------------------------------------


def graph_counts(pipeline: beam.Pipeline) -> collections.Counter:
    """Primitive transforms of a pipeline by kind, and its side inputs."""
    from apache_beam.portability.api import beam_runner_api_pb2

    counts: collections.Counter = collections.Counter()
    for transform in pipeline.to_runner_api().components.transforms.values():
        if transform.subtransforms:
            continue
        kind = transform.spec.urn.split(":")[-2]
        counts[kind] += 1
        if kind == "pardo":
            counts["side input"] += len(beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload).side_inputs)
    return counts


def objective_shape(objective: str, seq_len: int) -> dict:
    """What the floor takes from materialize's defaults and the objective: raw chunk length,
    token columns, features, pack group and shard sizes (:func:`build_floor`'s arguments)."""
    from pipelines.options import parse_args
    from schemas.examples import example_schema
    from transforms.objectives.registry import make_objective

    options = parse_args(["--input", "unused", "--tokenizer", "unused", "--output", "unused",
                          *objective_args(objective, seq_len)])
    made = make_objective(options.objective, options.objective_params)
    schema = example_schema(made.family, **made.schema_kwargs())
    return {"length": max(1, round(made.mean_raw_length)), "columns": tuple(schema.token_columns),
            "features": tuple(sorted(made.features)), "group_tokens": options.pack_group_tokens,
            "shard_bytes": int(options.shard_size_mb * 2**20)}


def materialize_args(corpus: str, tokenizer: str, output: str, objective: str, seq_len: int, mode: str) -> list[str]:
    """The arguments of bench_materialize's runs."""
    return ["--input", corpus, "--tokenizer", tokenizer, "--output", output, "--formats", ",".join(FORMATS),
            "--validation-fraction", str(VALIDATION_FRACTION), "--overwrite", "--progress-seconds", "0",
            "--encoder", "auto", *objective_args(objective, seq_len), *MODES[mode]]


def compare_graphs(corpus: str, tokenizer: str, objective: str, seq_len: int, mode: str) -> list[str]:
    """Differences between the primitive transforms of materialize's graph and the floor's
    (one line per kind that differs), or one line listing them when they are the same."""
    from pipelines.materialize import build_pipeline
    from pipelines.options import parse_args
    from pipelines.plan import plan_run

    options = parse_args(materialize_args(corpus, tokenizer, "/nonexistent-floor-output", objective, seq_len, mode))
    plan = plan_run(options)
    graphs = []
    for build in ("materialize", "floor"):
        pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner", *MODES[mode]]))
        tuned = TunedRun(tuning_for(options, plan.files))
        if build == "materialize":
            build_pipeline(pipeline, plan, tuned=tuned)
        else:
            build_floor(pipeline, sorted(glob.glob(corpus)), {}, output="/nonexistent-floor-output", tuned=tuned,
                        **objective_shape(objective, seq_len))
        tuned.release()
        graphs.append(graph_counts(pipeline))
    theirs, ours = graphs
    return [f"{kind}: floor {ours[kind]}, materialize {theirs[kind]}" for kind in sorted(set(ours) | set(theirs))
            if ours[kind] != theirs[kind]] or [f"same primitives: {dict(sorted(theirs.items()))}"]


# --- measurements ----------------------------------------------------------------------------


def run_floor(spec: dict) -> dict:
    """One floor run in this process: wall seconds (graph built, run, manifest read) and tokens."""
    counts = token_counts(spec["corpus"], spec["tokenizer"], spec.get("cache_dir", CACHE))
    files = sorted(glob.glob(spec["corpus"])) if spec["kind"] == "bare" else []
    shape = objective_shape(spec["objective"], spec["seq_len"])
    output = spec["output"]
    start = time.perf_counter()
    for directory in [".tmp", "rejected"] + [f"{split}/{fmt}" for split in ("train", "validation") for fmt in FORMATS]:
        os.makedirs(os.path.join(output, directory), exist_ok=True)
    options = PipelineOptions(["--runner=FnApiRunner", *MODES[spec["mode"]]])
    options.view_as(TypeOptions).pipeline_type_check = False  # as materialize sets it
    pipeline = beam.Pipeline(options=options)
    tuned = TunedRun(choose_tuning(RunnerSetup.from_beam_args(["--runner=FnApiRunner", *MODES[spec["mode"]]])))
    build_floor(pipeline, files, counts, output=output, tuned=tuned, **shape)
    try:
        pipeline.run().wait_until_finish()
    finally:
        tuned.release()
    with open(os.path.join(output, "manifest.json"), encoding="utf-8") as handle:
        manifest = json.load(handle)
    return {"wall": time.perf_counter() - start, "tokens": manifest["doc_tokens"], "bytes": manifest["bytes"]}


def run_io(spec: dict) -> dict:
    """Outside Beam, in one process: the floor's reader over the corpus, then ``bytes`` written
    to two files side by side (the floor's shard files of two formats) in 8 MiB writes."""
    start = time.perf_counter()
    documents = sum(1 for path in sorted(glob.glob(spec["corpus"])) for _ in read_documents(path))
    read = time.perf_counter() - start
    block = np.zeros(1 << 23, dtype=np.uint8)

    def write(path: str, size: int) -> None:
        with open(path, "wb") as handle:
            for offset in range(0, size, len(block)):
                handle.write(block[: min(len(block), size - offset)])

    start = time.perf_counter()
    half = spec["bytes"] // 2
    with ThreadPoolExecutor(max_workers=1) as pool:
        other = pool.submit(write, os.path.join(spec["output"], "b"), spec["bytes"] - half)
        write(os.path.join(spec["output"], "a"), half)
        other.result()
    return {"read": read, "write": time.perf_counter() - start, "documents": documents}


def _child(spec: dict) -> dict:
    if spec["kind"] in ("startup", "bare"):
        return run_floor(spec)
    if spec["kind"] == "io":
        return run_io(spec)
    return materialize_child(spec)


#: The throughput targets, in-process: a run's throughput as a share of the fastokens ceiling.
TARGETS = {"clm": 0.4}
DEFAULT_TARGET = 0.3


def _measure_in(spec: dict) -> dict:
    """:func:`measure` of ``spec`` writing to a fresh ``output`` directory, removed after."""
    out = tempfile.mkdtemp(prefix="lmshards-floor-")
    try:
        if spec["kind"] == "materialize":
            spec = {"kind": "materialize", "args": materialize_args(spec["corpus"], spec["tokenizer"], out,
                                                                    spec["objective"], spec["seq_len"], spec["mode"])}
        return measure({**spec, "output": out}, module=MODULE)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="glob of JSONL(.gz) corpus files (default: the docstring corpus)")
    parser.add_argument("--megabytes", type=float, default=60, help="size of the built corpus")
    parser.add_argument("--tokenizer", help="tokenizer.json (default: the benchmarks' 32k byte-level BPE)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--objectives", default="clm", help="comma-separated objectives")
    parser.add_argument("--modes", default="in_process,multi_processing", help="runner modes")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds (the fastest of each counts)")
    parser.add_argument("--no-materialize", action="store_true", help="time the floors only")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(RESULT_PREFIX + json.dumps(_child(json.loads(args.child))), flush=True)
        return
    corpus = args.corpus or corpus_of(args.megabytes)
    texts = load_texts(corpus)
    size = sum(len(t.encode("utf-8")) for t in texts) / 2**20
    tokenizer = args.tokenizer or default_tokenizer(texts)
    del texts
    documents = sum(len(c) for c in token_counts(corpus, tokenizer).values())
    print(f"corpus: {corpus}: {documents:,} documents, {size:.1f} MB of text; tokenizer {tokenizer}")
    print(f"cores: {os.cpu_count()}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    objectives, modes = args.objectives.split(","), args.modes.split(",")
    for objective in objectives:
        for mode in modes:
            for difference in compare_graphs(corpus, tokenizer, objective, args.seq_len, mode):
                print(f"graph, {objective} ({mode}): {difference}", flush=True)
    # The start-up floor runs no data: once per mode (with the first objective's graph).
    runs = [("", mode, "startup") for mode in modes]
    runs += [(objective, mode, kind) for objective in objectives for mode in modes
             for kind in ("bare",) + (() if args.no_materialize else ("materialize",))]
    best = {run: float("inf") for run in runs}
    written: dict[str, int] = {}
    rate, tokens, read_wall, write_wall = 0.0, None, float("inf"), float("inf")
    loads = [os.getloadavg()[0]]
    rounds = max(1, args.repeats)
    for round_index in range(rounds):
        result = measure({"kind": "ceiling", "corpus": corpus, "tokenizer": tokenizer, "method": "fastokens"},
                         module=MODULE)
        rate, tokens = max(rate, result["rate"]), result["tokens"]
        for objective, mode, kind in runs:
            result = _measure_in({"kind": kind, "corpus": corpus, "tokenizer": tokenizer, "mode": mode,
                                  "objective": objective or objectives[0], "seq_len": args.seq_len})
            if kind != "startup" and result["tokens"] != tokens:
                raise SystemExit(f"{kind} {objective} ({mode}) saw {result['tokens']} tokens, the ceiling {tokens}")
            if kind == "bare":
                written[objective] = result["bytes"]
            best[objective, mode, kind] = min(best[objective, mode, kind], result["wall"])
        # reading and writing alone: the floor's file work, without Beam
        result = _measure_in({"kind": "io", "corpus": corpus, "bytes": written[objectives[0]]})
        read_wall, write_wall = min(read_wall, result["read"]), min(write_wall, result["write"])
        loads.append(os.getloadavg()[0])
        print(f"round {round_index + 1} of {rounds} done; load average {loads[-1]:.2f}", flush=True)

    def row(label: str, seconds: float) -> None:
        print(f"{label:<58} {seconds:8.2f} {tokens / seconds:>14,.0f} {tokens / seconds / rate:7.3f}", flush=True)

    print(f"best of {rounds} interleaved rounds; 1-minute load average {min(loads):.2f} to {max(loads):.2f} "
          f"(at the start and after each round); {tokens:,} tokens")
    print(f"{'':<58} {'seconds':>8} {'tokens/s':>14} {'ratio':>7}")
    row("ceiling: fastokens encode_batch_flat", tokens / rate)
    row("reading the corpus alone (no Beam)", read_wall)
    row(f"writing {objectives[0]}'s {written[objectives[0]] / 2**20:.0f} MiB of shards alone (no Beam)", write_wall)
    for (objective, mode, kind), wall in best.items():
        row({"startup": f"floor: Beam start-up, no input ({mode})",
             "bare": f"floor: bare pipeline, {objective} ({mode})",
             "materialize": f"materialize {objective} ({mode})"}[kind], wall)
    for objective in objectives:
        target = TARGETS.get(objective, DEFAULT_TARGET)
        for mode in modes:
            allowed = tokens / best[objective, mode, "bare"] / rate
            verdict = (f"impossible: the bare floor alone reaches {allowed:.3f}, {target / allowed:.1f}x short"
                       if allowed < target else f"not ruled out by the floor (it reaches {allowed:.3f})")
            print(f"target {objective} >= {target} ({mode}; a run of at most {tokens / rate / target:.2f} s): "
                  f"{verdict}")


if __name__ == "__main__":
    sys.exit(main())
