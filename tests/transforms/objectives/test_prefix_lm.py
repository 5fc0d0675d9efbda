"""Tests of the decoder-only prefix-LM objective."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.objectives.common import SpecialIds, example_rng
from transforms.objectives.prefix_lm import PrefixLM, PrefixLMConfig, draw_prefix_length, prefix_lm

PAD = 0
SPECIAL = SpecialIds(vocab_size=1000, pad=PAD, eos=1)


def test_golden_split():
    tokens = np.arange(10, 18)
    # The split is one draw of integers(1, L) (high exclusive): U[1, L-1] = U[1, 7] here.
    expected = int(example_rng(0, "k").integers(1, 8))
    assert 1 <= expected <= 7
    example = prefix_lm(tokens, example_rng(0, "k"), PrefixLMConfig(8), SPECIAL)
    assert example["prefix_length"] == expected
    assert example["input_ids"].tolist() == list(range(10, 18))
    assert example["input_ids"].dtype == np.int32
    assert example["doc_lengths"].tolist() == [8] and example["doc_lengths"].dtype == np.int32


def test_two_tokens_always_split_in_the_middle():
    for key in ("a", "b", "c"):
        assert prefix_lm(np.array([5, 6]), example_rng(0, key), PrefixLMConfig(2), SPECIAL)["prefix_length"] == 1


def test_short_chunk_is_padded_and_split_over_real_tokens():
    example = prefix_lm(np.array([5, 6, 7]), example_rng(0, "s"), PrefixLMConfig(6), SPECIAL)
    assert example["input_ids"].tolist() == [5, 6, 7, PAD, PAD, PAD]
    assert example["doc_lengths"].tolist() == [3]
    assert 1 <= example["prefix_length"] <= 2
    assert prefix_lm(np.array([5]), example_rng(0, "s"), PrefixLMConfig(6), SPECIAL)["prefix_length"] == 1


def test_doc_lengths_pass_through_and_are_checked():
    objective = PrefixLM(PrefixLMConfig(6))
    example = objective.build(np.arange(6), example_rng(0, "d"), 0, SPECIAL, {"doc_lengths": np.array([2, 4])})
    assert example["doc_lengths"].tolist() == [2, 4]
    with pytest.raises(ValueError, match="doc_lengths"):
        objective.build(np.arange(6), example_rng(0, "d"), 0, SPECIAL, {"doc_lengths": np.array([2, 3])})


@pytest.mark.parametrize("seq_len", [1, 0, 8.0, True, "8"])
def test_config_validation(seq_len):
    with pytest.raises(ValueError, match="seq_len") as info:
        PrefixLMConfig(seq_len)
    assert repr(seq_len) in str(info.value)


def test_errors():
    with pytest.raises(ValueError, match="more than seq_len 4"):
        prefix_lm(np.arange(5), example_rng(0, "e"), PrefixLMConfig(4), SPECIAL)
    with pytest.raises(ValueError, match="at least 1 token"):
        draw_prefix_length(0, example_rng(0, "e"))
    with pytest.raises(ValueError, match="1-D"):
        prefix_lm(np.zeros((2, 2)), example_rng(0, "e"), PrefixLMConfig(4), SPECIAL)


def test_objective_interface():
    objective = PrefixLM(PrefixLMConfig(16))
    assert (objective.name, objective.family) == ("prefix_lm", "decoder")
    assert objective.plan_chunk(example_rng(0, "p")) == (16, 0)
    assert objective.schema_kwargs() == {"seq_len": 16, "prefix_length": True}
    assert objective.max_sentinels() == 0
    assert objective.params()["seq_len"] == 16
    example = objective.build(np.arange(3, 13), example_rng(0, "x"), 0, SPECIAL, {})
    counters = objective.stats(example)
    assert counters["examples"] == 1 and counters["tokens"] == 10 and counters["padding_tokens"] == 6
    assert counters["prefix_tokens"] + counters["suffix_tokens"] == 10
    assert all(type(value) is int for value in counters.values())


@settings(max_examples=200, deadline=None)
@given(length=st.integers(1, 300), seed=st.integers(0, 2**32))
def test_split_bounds(length, seed):
    example = prefix_lm(np.arange(length) + 3, example_rng(seed, "b"), PrefixLMConfig(300), SPECIAL)
    assert 1 <= example["prefix_length"] <= max(length - 1, 1)
    assert example["input_ids"][:length].tolist() == list(range(3, length + 3))
    assert (example["input_ids"][length:] == PAD).all()


def test_split_is_uniform():
    draws = np.array([draw_prefix_length(8, example_rng(1, f"u{i}")) for i in range(14_000)])
    shares = np.bincount(draws, minlength=8)[1:] / draws.size
    assert np.abs(shares - 1 / 7).max() < 0.01  # every value of [1, 7] (and nothing else) within 1 point
    long = np.array([draw_prefix_length(2048, example_rng(2, f"l{i}")) for i in range(10_000)])
    assert long.min() >= 1 and long.max() <= 2047
    assert abs(long.mean() - 1024) / 1024 < 0.02


@settings(max_examples=150, deadline=None)
@given(seq_len=st.sampled_from([2, 16, 1024]), rows=st.lists(st.lists(st.floats(0.01, 1.0), min_size=1, max_size=4),
                                                            max_size=10), seed=st.integers(0, 2**32 - 1))
def test_build_many_equals_build_and_stats_row_by_row(seq_len, rows, seed):
    """Full and short chunks of one or more documents: the columns and counters of
    PrefixLM.build + stats one example at a time."""
    from schemas.examples import example_schema
    from transforms.objectives.common import example_rngs
    from transforms.objectives.counters import add_counters
    from transforms.objectives.packing import Piece
    from transforms.shard_format import ExampleColumns

    objective = PrefixLM(PrefixLMConfig(seq_len=seq_len))
    special = SpecialIds(vocab_size=100, pad=0, eos=1)
    rng = np.random.default_rng(seed)
    pieces, keys = [], []
    for index, fractions in enumerate(rows):
        segments = [max(1, int(seq_len * f / len(fractions))) for f in fractions]
        while sum(segments) > seq_len:
            segments.pop()
        segments = segments or [1]
        length = sum(segments)
        pieces.append(Piece(rng.integers(2, 100, length).astype(np.int32), np.array(segments, np.int32)))
        keys.append(f"k{index}")
    arrays, scalars, strings, counters = objective.build_many(pieces, [0] * len(keys), example_rngs(8, keys), special)
    schema = example_schema(objective.family, **objective.schema_kwargs())
    examples, summed = [], {}
    for piece, key in zip(pieces, keys):
        example = objective.build(piece.tokens, example_rng(8, key), 0, special, {"doc_lengths": piece.doc_lengths})
        add_counters(summed, objective.stats(example))
        examples.append({**example, "key": key})
    expected = ExampleColumns.from_examples(examples, schema)
    got = ExampleColumns(schema, len(keys), arrays, scalars, {"key": keys, **strings})
    assert got.encode() == expected.encode()
    assert counters == summed
