"""The builder of BuildExamples (transforms.building.parallel): rows and counters that do not depend
on how chunks fall into blocks, and chunks laid out as columns for a shuffle (where the objective
runs on each runner: tests/pipelines/test_runner_tuning.py).

The pool of build processes that once ran beside the in-process runner is gone (measured
slower, benchmarks/README.md); the end-to-end byte identity across runners is in
tests/pipelines/test_runners.py.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from lmshards_testing import run_with_blocked_imports

import transforms.building.parallel as parallel
from transforms.elements import Chunk, ShardPiece
from transforms.objectives.common import SpecialIds
from transforms.objectives.packing import Piece
from transforms.objectives.registry import make_objective

# --- the builder -------------------------------------------------------------------------------


def test_the_builder_imports_no_beam():
    code = "import transforms.building.parallel, transforms.objectives.registry\nprint('ok')\n"
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
