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
    return parallel.BuildConfig(objective, SPECIAL, schema, seed=3, draws=draws, batch_rows=5, max_buffered_rows=20)


def _chunks(count):
    rng = np.random.default_rng(0)
    return [("train" if i % 7 else "validation", f"x-b00000-c{i:06d}", 0,
             Piece(rng.integers(2, 1000, 32, dtype=np.int32), np.array([20, 12], np.int32)))
            for i in range(count)]


def _rows(pieces, schema):
    """(shard, order key, row bytes) of every row of the pieces: equal however they were batched."""
    rows = []
    for shard, encoded in pieces:
        batch = parallel.ExampleBatch.decode(encoded, schema)
        for i in range(batch.count):
            row = batch.columns.take(np.array([i]))
            rows.append((shard, batch.orders[i].tobytes(), repr(row.encode())))
    return sorted(rows)


def _build(builder, chunks):
    pieces = []
    for chunk in chunks:
        pieces += builder.add(chunk, 4 if chunk[0] == "train" else 1)
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


def test_clm_blocks_give_the_rows_and_counters_of_one_chunk_at_a_time(monkeypatch):
    """Full clm chunks (one draw) are built in blocks by CLM.build_block; short ones (padded)
    one at a time, as all chunks are with the block path off or with two draws."""
    monkeypatch.setattr(parallel, "BLOCK_CHUNKS", 64)
    rng = np.random.default_rng(5)
    chunks = []
    for i, (split, chunk_key, plan, piece) in enumerate(_chunks(150)):
        cuts = np.sort(rng.choice(np.arange(1, 32), size=int(rng.integers(0, 4)), replace=False))
        lengths = np.diff(np.concatenate([[0], cuts, [32]])).astype(np.int32)
        if i % 37 == 5:  # a short chunk: padded, built on its own
            piece, lengths = Piece(piece.tokens[:20], np.array([20], np.int32)), None
        chunks.append((split, chunk_key, plan, piece if lengths is None else Piece(piece.tokens, lengths)))
    config = _config(draws=1)
    assert config.block_length == 32 and _config(draws=2).block_length is None
    blocked = parallel.ChunkBuilder(config)
    got = _build(blocked, chunks)
    # a block's rows of one shard make one piece, never cut at batch_rows (5)
    assert max(parallel.ExampleBatch.decode(p, config.schema).count for _, p in got) > 5
    plain_config = _config(draws=1)
    plain_config.block_length = None
    plain = parallel.ChunkBuilder(plain_config)
    expected = _build(plain, chunks)
    assert _rows(got, config.schema) == _rows(expected, config.schema)
    assert blocked.stats == plain.stats and blocked.built == plain.built == 150
    assert blocked.stats["train"]["padding_tokens"] == 12 * sum(
        1 for c in chunks if c[0] == "train" and len(c[3].tokens) == 20)


@pytest.mark.parametrize("draws", [1, 2])
def test_bart_blocks_give_the_rows_and_counters_of_one_chunk_at_a_time(monkeypatch, draws):
    """Full bart chunks with both features are built MANY_ROWS rows at a time by Bart.build_many
    (every draw); short chunks and chunks without the features one at a time, as all chunks
    are with the block path off."""
    monkeypatch.setattr(parallel, "MANY_ROWS", 16)
    special = SpecialIds(vocab_size=1000, pad=1, eos=2, bos=0, mask=3)
    objective = make_objective("bart", {"seq_len": 34})
    rng = np.random.default_rng(8)
    chunks = []
    for i, (split, chunk_key, plan, piece) in enumerate(_chunks(90)):
        tokens = piece.tokens.copy()
        tokens[rng.random(32) < 0.05] = 2  # EOS between packed documents
        features = {"word_starts": rng.random(32) < 0.7, "sentence_starts": rng.random(32) < 0.1}
        if i % 29 == 3:  # a short chunk: built on its own
            tokens, features = tokens[:20], {name: flags[:20] for name, flags in features.items()}
        if i % 31 == 4:  # no features (another tokenizer path): built on its own
            features = {}
        chunks.append((split, chunk_key, plan, Piece(tokens, piece.doc_lengths, features)))

    def config(many):
        from schemas.examples import example_schema

        schema = example_schema(objective.family, **objective.schema_kwargs())
        built = parallel.BuildConfig(objective, special, schema, seed=3, draws=draws, batch_rows=5,
                                     max_buffered_rows=20)
        built.many = many
        return built

    blocked_config, plain_config = config(True), config(False)
    assert blocked_config.many and objective.builds_many(chunks[0][3], 0)
    calls = []
    build_many = type(objective).build_many
    monkeypatch.setattr(type(objective), "build_many", lambda self, pieces, *rest: calls.append(len(pieces))
                        or build_many(self, pieces, *rest))
    blocked, plain = parallel.ChunkBuilder(blocked_config), parallel.ChunkBuilder(plain_config)
    got, expected = _build(blocked, chunks), _build(plain, chunks)
    assert _rows(got, blocked_config.schema) == _rows(expected, plain_config.schema)
    assert blocked.stats == plain.stats and blocked.built == plain.built == 90 * draws
    singles = sum(1 for c in chunks if len(c[3].tokens) < 32 or not c[3].features)
    assert sum(calls) == (90 - singles) * draws and max(calls) > 8  # a block of 16 rows, cut by split
    assert blocked.stats["train"]["masked_spans"] > 0 and blocked.stats["validation"]["examples"] > 0


def _blocks_equal_one_at_a_time(monkeypatch, objective, special, chunks, draws):
    """Build ``chunks`` through the objective's ``build_many`` (blocks of 16 rows) and one at a
    time; both give the same rows and counters. Returns the block builder."""
    from schemas.examples import example_schema

    monkeypatch.setattr(parallel, "MANY_ROWS", 16)
    schema = example_schema(objective.family, **objective.schema_kwargs())
    configs = [parallel.BuildConfig(objective, special, schema, seed=3, draws=draws, batch_rows=5, max_buffered_rows=20)
               for _ in range(2)]
    configs[1].many = False
    assert configs[0].many
    blocked, plain = parallel.ChunkBuilder(configs[0]), parallel.ChunkBuilder(configs[1])
    assert _rows(_build(blocked, chunks), schema) == _rows(_build(plain, chunks), schema)
    assert blocked.stats == plain.stats and blocked.built == plain.built == len(chunks) * draws
    return blocked


@pytest.mark.parametrize("layout, draws", [("encoder_decoder", 1), ("encoder_decoder", 2), ("decoder", 2)])
def test_ul2_blocks_give_the_rows_and_counters_of_one_chunk_at_a_time(monkeypatch, layout, draws):
    """UL2 builds every chunk (full or short, any denoiser) MANY_ROWS rows at a time by
    UL2.build_many: the rows and counters of the one-at-a-time path."""
    modes = {"[R]": 990, "[S]": 991, "[X]": 992}
    special = SpecialIds(vocab_size=1000, pad=0, eos=1, sentinels=tuple(range(800, 900)), mode_tokens=modes)
    objective = make_objective("ul2", {"inputs_length": 32, "layout": layout})
    rng = np.random.default_rng(9)
    chunks = []
    for i in range(70):
        plan = int(rng.integers(0, len(objective.denoisers)))
        length = objective.lengths[plan].raw_length - (5 if i % 23 == 4 else 0)  # a few short chunks
        chunks.append(("train" if i % 7 else "validation", f"x-b00000-c{i:06d}", plan,
                       Piece(rng.integers(2, 800, length, dtype=np.int32), np.array([length], np.int32))))
    blocked = _blocks_equal_one_at_a_time(monkeypatch, objective, special, chunks, draws)
    assert blocked.stats["train"]["noise_spans"] > 0


@pytest.mark.parametrize("draws", [1, 2])
def test_span_corruption_blocks_give_the_rows_and_counters_of_one_chunk_at_a_time(monkeypatch, draws):
    """span_corruption builds every chunk MANY_ROWS rows at a time, short chunks padded as the
    one-at-a-time path pads them (padding_tokens)."""
    special = SpecialIds(vocab_size=1000, pad=0, eos=1, sentinels=tuple(range(800, 900)))
    objective = make_objective("span_corruption", {"inputs_length": 32})
    rng = np.random.default_rng(10)
    chunks = []
    for i in range(70):
        length = objective.raw_length - (9 if i % 11 == 4 else 0)  # a few short chunks
        chunks.append(("train" if i % 7 else "validation", f"x-b00000-c{i:06d}", 0,
                       Piece(rng.integers(2, 800, length, dtype=np.int32), np.array([length], np.int32))))
    blocked = _blocks_equal_one_at_a_time(monkeypatch, objective, special, chunks, draws)
    assert blocked.stats["train"]["padding_tokens"] > 0 and blocked.stats["train"]["partial_examples"] > 0


@pytest.mark.parametrize("params, draws", [({"seq_len": 32}, 1), ({"seq_len": 32, "whole_word_mask": True}, 2)])
def test_mlm_blocks_give_the_rows_and_counters_of_one_chunk_at_a_time(monkeypatch, params, draws):
    special = SpecialIds(vocab_size=1000, pad=0, eos=1, mask=2)
    objective = make_objective("mlm", params)
    rng = np.random.default_rng(12)
    chunks = []
    for i in range(70):
        length = 32 - (9 if i % 11 == 4 else 0)  # a few short chunks
        features = {"word_starts": rng.random(length) < 0.6} if objective.features else {}
        chunks.append(("train" if i % 7 else "validation", f"x-b00000-c{i:06d}", 0,
                       Piece(rng.integers(3, 1000, length, dtype=np.int32), np.array([length], np.int32), features)))
    blocked = _blocks_equal_one_at_a_time(monkeypatch, objective, special, chunks, draws)
    assert blocked.stats["train"]["padding_tokens"] > 0 and blocked.stats["train"]["masked"] > 0


@pytest.mark.parametrize("draws", [1, 2])
def test_prefix_lm_blocks_give_the_rows_and_counters_of_one_chunk_at_a_time(monkeypatch, draws):
    objective = make_objective("prefix_lm", {"seq_len": 32})
    chunks = [(split, key, plan, piece if i % 13 != 6 else Piece(piece.tokens[:20], np.array([20], np.int32)))
              for i, (split, key, plan, piece) in enumerate(_chunks(70))]  # two documents, a few short chunks
    blocked = _blocks_equal_one_at_a_time(monkeypatch, objective, SPECIAL, chunks, draws)
    assert blocked.stats["train"]["padding_tokens"] > 0 and blocked.stats["train"]["suffix_tokens"] > 0


def test_tasks_carry_chunks_as_columns():
    rng = np.random.default_rng(2)
    chunks = [(("train", "validation")[i % 2], f"k{i}", i % 3,
               Piece(rng.integers(0, 1000, n, dtype=np.int32), np.array([n - 1, 1], np.int32),
                     {"word_starts": rng.random(n) < 0.5, "sentence_starts": rng.random(n) < 0.1}))
              for i, n in enumerate([5, 1, 9, 3])]

    def plain(chunks):
        return [(s, k, p, piece.tokens.tolist(), piece.doc_lengths.tolist(),
                 {name: flags.tolist() for name, flags in piece.features.items()}) for s, k, p, piece in chunks]

    encoded = parallel.encode_chunks(chunks)
    assert encoded[0] == "columns" and encoded[6].dtype == np.int32 and encoded[8]["word_starts"].dtype == bool
    decoded = parallel.decode_chunks(pickle.loads(pickle.dumps(encoded)))
    assert plain(decoded) == plain(chunks)
    assert all(piece.tokens.dtype == np.int32 and piece.doc_lengths.dtype == np.int32 for *_, piece in decoded)
    mixed = [*chunks, ("train", "k9", 0, Piece(np.arange(3, dtype=np.int32), np.array([3], np.int32)))]
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
    chunks = [(split, key, plan, Piece(piece.tokens, piece.doc_lengths,
                                       {"word_starts": rng.random(32) < 0.7, "sentence_starts": rng.random(32) < 0.1}))
              for split, key, plan, piece in _chunks(80)]
    schema = example_schema(objective.family, **objective.schema_kwargs())
    config = parallel.BuildConfig(objective, special, schema, seed=3, draws=1, batch_rows=5, max_buffered_rows=20)
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


class _Failing:
    """An objective that fails (or kills its worker) on one chunk."""

    def __init__(self, how):
        self.how = how
        self.inner = make_objective("clm", {"seq_len": 32})
        self.family = self.inner.family

    def schema_kwargs(self):
        return self.inner.schema_kwargs()

    def stats(self, example):
        return self.inner.stats(example)

    def build(self, tokens, rng, plan, special, features):
        if tokens[0] == 999:
            if self.how == "die":
                os._exit(3)
            raise ValueError("chunk 999 is bad")
        return self.inner.build(tokens, rng, plan, special, features)


@pytest.mark.parametrize("how, message", [
    ("raise", "BuildExamples: building examples in a worker process (--build-processes 1) failed: "
              "ValueError: chunk 999 is bad"),
    ("die", "BuildExamples: a worker process of the build pool (--build-processes 1) died"),
])
def test_a_failing_worker_fails_the_stage_with_a_clear_error(monkeypatch, how, message):
    monkeypatch.setattr(parallel, "TASK_TOKENS", 200)
    chunks = _chunks(100)
    chunks[50][3].tokens[0] = 999
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
