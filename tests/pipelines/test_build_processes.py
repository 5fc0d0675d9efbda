"""``--build-processes``: examples built by worker processes are the bytes built inline.

The sample corpus is small beside a task (:data:`transforms.parallel.TASK_TOKENS`), so the
pipeline tests shrink tasks to a few chunks: every run then sends many tasks, keeps the pool
full and builds a remainder inline at the end of the bundle.

This module imports no Beam at the top: a worker that unpickles the failing objective below
imports it.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from lmshards_testing import ROOT, file_digests, run_with_blocked_imports

import transforms.parallel as parallel
from transforms.elements import Chunk, ShardPiece
from transforms.objectives.base import Objective
from transforms.objectives.common import SpecialIds
from transforms.objectives.packing import Piece
from transforms.objectives.registry import make_objective

#: faq and tutorial: 40% of the sample (115k tokens: ~900 chunks of 128, ~100 tasks of 2,000 tokens).
SAMPLE_PART = str(ROOT / "data" / "sample" / "[ft]*.jsonl")
OBJECTIVES = {
    "clm": ["--objective", "clm", "--seq-len", "128"],
    "ul2": ["--objective", "ul2", "--inputs-length", "128"],
    "ul2_decoder": ["--objective", "ul2", "--inputs-length", "128", "--layout", "decoder"],
    "bart": ["--objective", "bart", "--seq-len", "128"],
    "mlm": ["--objective", "mlm", "--seq-len", "128", "--whole-word-mask"],
}


@pytest.fixture
def pool_sizes(monkeypatch):
    """Tiny tasks, and the sizes of the pools the runs used."""
    used = []
    make_pool = parallel.worker_pool

    def worker_pool(processes):
        used.append(processes)
        return make_pool(processes)

    monkeypatch.setattr(parallel, "TASK_TOKENS", 2000)
    monkeypatch.setattr(parallel, "worker_pool", worker_pool)
    return used


@pytest.mark.parametrize("name, pools", [(name, ("1", "2") if name == "ul2" else ("2",)) for name in OBJECTIVES],
                         ids=list(OBJECTIVES))
def test_worker_processes_write_the_bytes_of_an_inline_build(tmp_path, tokenizer_path, pool_sizes, name, pools):
    args = ["--input", SAMPLE_PART, "--tokenizer", tokenizer_path, *OBJECTIVES[name], "--draws", "2",
            "--validation-fraction", "0.1", "--num-shards", "3", "--formats", "arrow,webdataset",
            "--progress-seconds", "0"]
    reference, examples = _materialize(tmp_path / "inline", *args, "--build-processes", "0")
    assert pool_sizes == [] and examples == sum(split["examples"] for split in reference.splits.values())
    reference_digests = file_digests(tmp_path / "inline")
    for processes in pools:
        out = tmp_path / f"processes-{processes}"
        manifest, pooled_examples = _materialize(out, *args, "--build-processes", processes)
        assert file_digests(out) == reference_digests, processes
        assert manifest.deterministic_view() == reference.deterministic_view(), processes
        assert pooled_examples == examples, processes
    assert set(pool_sizes) == {int(p) for p in pools}


def _materialize(output, *args):
    """The manifest and the ``examples`` counter of a run."""
    from apache_beam.metrics.metric import MetricsFilter

    from pipelines.materialize import run_job

    manifest, result = run_job(["--output", str(output), *args])
    counters = result.metrics().query(MetricsFilter().with_namespace("lmshards").with_name("examples"))["counters"]
    return manifest, sum(counter.committed for counter in counters)


# --- the option --------------------------------------------------------------------------------

PATHS = ["--input", "in.txt", "--output", "out", "--tokenizer", "tok.json"]
BASE = [*PATHS, "--objective", "ul2", "--inputs-length", "128"]
CLM = [*PATHS, "--objective", "clm", "--seq-len", "128"]


def test_auto_is_one_process_per_core_in_process_and_none_where_workers_are_processes():
    from pipelines.options import parse_args

    cores = len(os.sched_getaffinity(0))
    cores = cores if cores > 1 else 0  # one core: no workers
    assert parse_args(BASE).build_processes == cores
    assert parse_args([*BASE, "--runner", "DirectRunner"]).build_processes == cores
    assert parse_args([*BASE, "--build-processes", "auto"]).build_processes == cores
    assert parse_args([*BASE, "--direct_running_mode=multi_processing", "--direct_num_workers=2"]).build_processes == 0
    assert parse_args([*BASE, "--runner", "DataflowRunner"]).build_processes == 0
    assert parse_args([*BASE, "--build-processes", "0"]).build_processes == 0
    assert parse_args([*BASE, "--build-processes", "3", "--direct_running_mode=multi_processing"]).build_processes == 3
    # clm's examples are copies of its chunks: no workers unless asked for.
    assert parse_args(CLM).build_processes == 0
    assert parse_args([*CLM, "--build-processes", "2"]).build_processes == 2


@pytest.mark.parametrize("value", ["-1", "two", "1.5", ""])
def test_a_bad_count_fails_naming_the_flag(capsys, value):
    from pipelines.options import parse_args

    with pytest.raises(SystemExit) as exc:
        parse_args([*BASE, "--build-processes", value])
    assert exc.value.code == 2
    assert f"--build-processes {value}: expected auto or a number of processes >= 0" in capsys.readouterr().err


# --- the pool ----------------------------------------------------------------------------------


def test_workers_import_no_beam():
    code = "import transforms.parallel, transforms.objectives.registry\nprint('ok')\n"
    result = run_with_blocked_imports(code, "apache_beam,torch,tokenizers")
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


SPECIAL = SpecialIds(pad=0, eos=1, vocab_size=1000)


def _config(objective=None, draws=2):
    from schemas.examples import example_schema

    objective = objective or make_objective("clm", {"seq_len": 32})
    schema = example_schema(objective.family, **objective.schema_kwargs())
    return parallel.BuildConfig(objective, SPECIAL, schema, seed=3, draws=draws, block_rows=5)


def _chunks(count):
    rng = np.random.default_rng(0)
    return [Chunk("train" if i % 7 else "validation", f"x-b00000-c{i:06d}", 0,
                  Piece(rng.integers(2, 1000, 32, dtype=np.int32), np.array([20, 12], np.int32)))
            for i in range(count)]


def _rows(pieces, schema):
    """(shard, order key, row bytes) of every row of the pieces: equal however they were batched."""
    rows = []
    for shard, encoded in pieces:
        batch = ShardPiece.decode(encoded, schema)
        for i in range(batch.count):
            row = batch.columns.take(np.array([i]))
            rows.append((shard, batch.orders[i].tobytes(), repr(row.encode())))
    return sorted(rows)


def _build(builder, chunks):
    pieces = []
    for chunk in chunks:
        pieces += builder.add(chunk, 4 if chunk.split == "train" else 1)
    return pieces + builder.finish()


def test_pooled_builder_equals_the_inline_builder(monkeypatch):
    monkeypatch.setattr(parallel, "TASK_TOKENS", 200)
    config, chunks = _config(), _chunks(300)
    inline = parallel.ChunkBuilder(config)
    expected = _build(inline, chunks)
    for processes in (1, 2):
        pooled = parallel.PooledBuilder(config, processes)
        assert _rows(_build(pooled, chunks), config.schema) == _rows(expected, config.schema)
        assert pooled.stats == inline.stats and pooled.built == inline.built == 600


BLOCK_CASES = {
    "clm": ("clm", {"seq_len": 32}),
    "prefix_lm": ("prefix_lm", {"seq_len": 32}),
    "mlm": ("mlm", {"seq_len": 32}),
    "mlm_wwm": ("mlm", {"seq_len": 32, "whole_word_mask": True, "frame": True}),
    "span_corruption": ("span_corruption", {"inputs_length": 32}),
    "bart": ("bart", {"seq_len": 34}),
    "ul2": ("ul2", {"inputs_length": 32}),
    "ul2_decoder": ("ul2", {"inputs_length": 32, "layout": "decoder"}),
}


def _objective_chunks(name: str, count: int = 70):
    """An objective, its special ids and ``count`` chunks: full ones at its planned length, a few
    short, EOS between packed documents, the features it reads."""
    from transforms.objectives.layout import plan_uniforms

    modes = {"[R]": 990, "[S]": 991, "[X]": 992}
    special = SpecialIds(vocab_size=1000, pad=0, eos=1, bos=3, mask=2, cls=4, sep=5,
                         sentinels=tuple(range(800, 900)), mode_tokens=modes)
    objective = make_objective(*BLOCK_CASES[name])
    keys = [f"x-b00000-c{i:06d}" for i in range(count)]
    lengths, plans = objective.plan(plan_uniforms(3, keys))
    rng = np.random.default_rng(len(name))
    chunks = []
    for i, (key, length, plan) in enumerate(zip(keys, lengths.tolist(), plans.tolist())):
        length -= 5 if i % 11 == 4 else 0  # a few short chunks
        tokens = rng.integers(6, 800, length, dtype=np.int32)
        tokens[rng.random(length) < 0.05] = 1  # EOS between packed documents
        features = {"word_starts": rng.random(length) < 0.6, "space_starts": rng.random(length) < 0.4,
                    "sentence_starts": rng.random(length) < 0.1}
        chunks.append(Chunk("train" if i % 7 else "validation", key, plan,
                            Piece(tokens, np.array([length], np.int32), features)))
    return objective, special, chunks


@pytest.mark.parametrize("draws", [1, 2])
@pytest.mark.parametrize("name", sorted(BLOCK_CASES))
def test_rows_and_counters_do_not_depend_on_how_chunks_fall_into_blocks(name, draws):
    """Blocks of 16 rows (cut by split too), of 5, and one block of everything: the same rows
    (shard, order key, bytes) and the same summed counters."""
    from schemas.examples import example_schema

    objective, special, chunks = _objective_chunks(name)
    schema = example_schema(objective.family, **objective.schema_kwargs())
    results = []
    for block_rows in (16, 5, 10_000):
        config = parallel.BuildConfig(objective, special, schema, seed=3, draws=draws, block_rows=block_rows)
        builder = parallel.ChunkBuilder(config)
        results.append((_rows(_build(builder, chunks), schema), builder.stats, builder.built))
    assert results[0] == results[1] == results[2]
    assert results[0][2] == 70 * draws and results[0][1]["validation"]["examples"] == 10 * draws


def test_tasks_carry_chunks_as_columns():
    rng = np.random.default_rng(2)
    chunks = [Chunk(("train", "validation")[i % 2], f"k{i}", i % 3,
                    Piece(rng.integers(0, 1000, n, dtype=np.int32), np.array([n - 1, 1], np.int32),
                          {"word_starts": rng.random(n) < 0.5, "sentence_starts": rng.random(n) < 0.1}))
              for i, n in enumerate([5, 1, 9, 3])]

    def plain(chunks):
        return [(s, k, p, piece.tokens.tolist(), piece.doc_lengths.tolist(),
                 {name: flags.tolist() for name, flags in piece.features.items()}) for s, k, p, piece in chunks]

    encoded = parallel.encode_chunks(chunks)
    assert encoded[0] == "columns" and encoded[6].dtype == np.int32 and encoded[8]["word_starts"].dtype == bool
    decoded = parallel.decode_chunks(pickle.loads(pickle.dumps(encoded)))
    assert plain(decoded) == plain(chunks) and all(isinstance(chunk, Chunk) for chunk in decoded)
    assert all(piece.tokens.dtype == np.int32 and piece.doc_lengths.dtype == np.int32 for *_, piece in decoded)
    mixed = [*chunks, Chunk("train", "k9", 0, Piece(np.arange(3, dtype=np.int32), np.array([3], np.int32)))]
    assert parallel.encode_chunks(mixed)[0] == "chunks"  # chunks with different features travel as they are
    assert plain(parallel.decode_chunks(pickle.loads(pickle.dumps(parallel.encode_chunks(mixed))))) == plain(mixed)
    assert parallel.decode_chunks(parallel.encode_chunks([])) == []


def test_pooled_bart_equals_the_inline_builder(monkeypatch):
    """Chunks with features travel to the workers as columns and build the same rows."""
    from schemas.examples import example_schema

    monkeypatch.setattr(parallel, "TASK_TOKENS", 300)
    special = SpecialIds(vocab_size=1000, pad=1, eos=2, bos=0, mask=3)
    objective = make_objective("bart", {"seq_len": 34})
    rng = np.random.default_rng(3)
    features = [{"space_starts": rng.random(32) < 0.7, "sentence_starts": rng.random(32) < 0.1} for _ in range(80)]
    chunks = [chunk._replace(piece=Piece(chunk.piece.tokens, chunk.piece.doc_lengths, flags))
              for chunk, flags in zip(_chunks(80), features)]
    schema = example_schema(objective.family, **objective.schema_kwargs())
    config = parallel.BuildConfig(objective, special, schema, seed=3, draws=1, block_rows=5)
    inline = parallel.ChunkBuilder(config)
    expected = _build(inline, chunks)
    pooled = parallel.PooledBuilder(config, 2)
    assert _rows(_build(pooled, chunks), schema) == _rows(expected, schema)
    assert pooled.stats == inline.stats and pooled.built == inline.built == 80


def test_a_bundle_smaller_than_a_task_is_built_inline(monkeypatch):
    def no_pool(processes):
        raise AssertionError("no task expected")

    monkeypatch.setattr(parallel, "worker_pool", no_pool)
    pooled = parallel.PooledBuilder(_config(), 2)
    assert _build(pooled, _chunks(3)) and pooled.built == 6


class _Failing(Objective):
    """An objective that fails (or kills its worker) on a block with one chunk."""

    name, family, fixed_raw_length = "failing", "decoder", 32

    def __init__(self, how):
        self.how = how
        self.inner = make_objective("clm", {"seq_len": 32})

    def schema_kwargs(self):
        return self.inner.schema_kwargs()

    def params(self):
        return {}

    def build(self, block, special):
        if (block.tokens[block.offsets[:-1]] == 999).any():
            if self.how == "die":
                os._exit(3)
            raise ValueError("chunk 999 is bad")
        return self.inner.build(block, special)


@pytest.mark.parametrize("how, message", [
    ("raise", "BuildExamples: building examples in a worker process (--build-processes 1) failed: "
              "ValueError: chunk 999 is bad"),
    ("die", "BuildExamples: a worker process of the build pool (--build-processes 1) died"),
])
def test_a_failing_worker_fails_the_stage_with_a_clear_error(monkeypatch, how, message):
    monkeypatch.setattr(parallel, "TASK_TOKENS", 200)
    chunks = _chunks(100)
    chunks[50].piece.tokens[0] = 999
    pooled = parallel.PooledBuilder(_config(_Failing(how)), 1)
    with pytest.raises(parallel.BuildWorkerError) as exc:
        _build(pooled, chunks)
    assert str(exc.value).startswith(message)
    # The pool still works (a dead one is replaced).
    pooled = parallel.PooledBuilder(_config(), 1)
    assert _build(pooled, _chunks(100)) and pooled.built == 200


def test_encoder_threads_share_the_cores_among_multi_processing_workers(capsys):
    from pipelines.options import parse_args

    cores = len(os.sched_getaffinity(0))
    assert parse_args(BASE).encoder_threads is None  # in-process: the tokenizer's default
    multi = [*BASE, "--direct_running_mode=multi_processing"]
    assert parse_args([*multi, "--direct_num_workers=2"]).encoder_threads == max(1, cores // 2)
    assert parse_args([*multi, f"--direct_num_workers={2 * cores}"]).encoder_threads == 1
    assert parse_args([*multi, "--direct_num_workers=2", "--encoder-threads", "3"]).encoder_threads == 3
    # Dataflow runs one SDK process per core, unless told to run one.
    assert parse_args([*BASE, "--runner", "DataflowRunner"]).encoder_threads == 1
    single = ["--runner", "DataflowRunner", "--experiments=no_use_multiple_sdk_containers"]
    assert parse_args([*BASE, *single]).encoder_threads is None
    for bad in ("0", "many"):
        with pytest.raises(SystemExit):
            parse_args([*BASE, "--encoder-threads", bad])
        assert f"--encoder-threads {bad}: expected auto or a number of threads >= 1" in capsys.readouterr().err
