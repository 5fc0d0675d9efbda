"""Tests of the decoder-only prefix-LM objective."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from objective_oracles import assert_fits

from transforms.objectives.base import Block, build_example
from transforms.objectives.common import SpecialIds
from transforms.objectives.layout import example_digests, example_randoms
from transforms.objectives.prefix_lm import (
    SPLIT_STREAM,
    PrefixLM,
    PrefixLMConfig,
    prefix_lengths,
    segment_prefix_lengths,
)

PAD = 0
SPECIAL = SpecialIds(vocab_size=1000, pad=PAD, eos=1)


def split(tokens, key: str = "k", seq_len: int = 8, doc_lengths=None):
    return build_example(PrefixLM(PrefixLMConfig(seq_len)), np.asarray(tokens), SPECIAL, example_randoms(0, [key]),
                         doc_lengths=doc_lengths)


def test_golden_split():
    # The split is 1 + floor(u * (L - 1)) for the row's first number of the split stream: U[1, 7] here.
    u = float(example_randoms(0, ["k"]).uniforms(SPLIT_STREAM, 1)[0, 0])
    example, counters = split(np.arange(10, 18))
    assert example["prefix_lengths"].tolist() == [1 + int(u * 7)] and example["prefix_lengths"].dtype == np.int32
    assert example["input_ids"].tolist() == list(range(10, 18)) and example["input_ids"].dtype == np.int32
    assert example["doc_lengths"].tolist() == [8] and example["doc_lengths"].dtype == np.int32
    prefix = int(example["prefix_lengths"][0])
    assert counters == {"examples": 1, "tokens": 8, "prefix_tokens": prefix, "suffix_tokens": 8 - prefix,
                        "padding_tokens": 0}


def test_every_document_segment_gets_its_own_split():
    # segment j of the row is split at 1 + floor(u_j * (d_j - 1)), u_j the row's j-th number
    u = example_randoms(0, ["m"]).uniforms(SPLIT_STREAM, 3)[0]
    example, counters = split(np.arange(10, 22), "m", 12, np.array([5, 1, 6]))
    assert example["prefix_lengths"].tolist() == [1 + int(u[0] * 4), 1, 1 + int(u[2] * 5)]
    assert counters["prefix_tokens"] == int(example["prefix_lengths"].sum())
    assert split(np.arange(4), "m", 4, np.array([4]))[0]["prefix_lengths"].tolist() == [1 + int(u[0] * 3)]


def test_two_tokens_always_split_in_the_middle():
    for key in ("a", "b", "c"):
        assert split([5, 6], key, 2)[0]["prefix_lengths"].tolist() == [1]


def test_short_chunk_is_padded_and_split_over_real_tokens():
    example, counters = split([5, 6, 7], "s", 6)
    assert example["input_ids"].tolist() == [5, 6, 7, PAD, PAD, PAD]
    assert example["doc_lengths"].tolist() == [3] and counters["padding_tokens"] == 3
    assert 1 <= example["prefix_lengths"][0] <= 2
    assert split([5], "s", 6)[0]["prefix_lengths"].tolist() == [1]


def test_doc_lengths_pass_through_and_are_checked():
    assert split(np.arange(6), "d", 6, np.array([2, 4]))[0]["doc_lengths"].tolist() == [2, 4]
    with pytest.raises(ValueError, match="doc_lengths"):
        split(np.arange(6), "d", 6, np.array([2, 3]))


@pytest.mark.parametrize("seq_len", [1, 0, 8.0, True, "8"])
def test_config_validation(seq_len):
    with pytest.raises(ValueError, match="seq_len") as info:
        PrefixLMConfig(seq_len)
    assert repr(seq_len) in str(info.value)


def test_errors():
    with pytest.raises(ValueError, match="does not fit the fixed length 4"):
        split(np.arange(5), seq_len=4)
    with pytest.raises(ValueError, match="at least 1 token"):
        prefix_lengths(np.array([0]), example_randoms(0, ["e"]))
    with pytest.raises(ValueError, match="1-D"):
        split(np.zeros((2, 2), dtype=np.int32), seq_len=4)


def test_objective_interface():
    objective = PrefixLM(PrefixLMConfig(16))
    assert (objective.name, objective.family) == ("prefix_lm", "decoder")
    assert objective.fixed_raw_length == 16 and objective.plan(np.array([0.9]))[0].tolist() == [16]
    assert objective.schema_kwargs() == {"seq_len": 16, "prefix_lengths": True}
    assert objective.max_sentinels() == 0 and objective.params()["seq_len"] == 16


@settings(max_examples=100)
@given(rows=st.lists(st.lists(st.integers(0, 60), min_size=1, max_size=5).filter(lambda d: sum(d) >= 1),
                     min_size=1, max_size=20), seed=st.integers(0, 2**32))
def test_a_block_splits_each_segment_as_the_documented_draw(rows, seed):
    keys = [f"b{i}" for i in range(len(rows))]
    randoms = example_digests(seed % 1000, keys).randoms
    lengths = np.array([sum(docs) for docs in rows])
    docs = np.concatenate([np.array(d, np.int32) for d in rows])
    doc_offsets = np.concatenate([[0], np.cumsum([len(d) for d in rows])])
    block = Block(np.concatenate([np.arange(n) + 3 for n in lengths]).astype(np.int32),
                  np.concatenate([[0], np.cumsum(lengths)]), docs, doc_offsets, {},
                  np.zeros(lengths.size, np.int64), randoms)
    built = PrefixLM(PrefixLMConfig(300)).build(block, SPECIAL)
    assert built.scalars == {}
    prefix, offsets = built.arrays["prefix_lengths"]
    assert offsets.tolist() == doc_offsets.tolist()
    uniforms = randoms.uniforms(SPLIT_STREAM, max(len(d) for d in rows))
    expected = [0 if d == 0 else 1 + int(uniforms[r, j] * max(d - 1, 1)) for r, row in enumerate(rows)
                for j, d in enumerate(row)]
    assert prefix.tolist() == expected
    assert all(1 <= p <= max(d - 1, 1) for p, d in zip(prefix.tolist(), docs.tolist()) if d)
    rows_out = built.arrays["input_ids"][0].reshape(lengths.size, 300)
    for row, n in enumerate(lengths.tolist()):
        assert rows_out[row, :n].tolist() == list(range(3, n + 3)) and not rows_out[row, n:].any()
    assert built.counters["prefix_tokens"] == int(prefix.sum())
    assert built.counters["suffix_tokens"] == int(lengths.sum() - prefix.sum())
    assert segment_prefix_lengths(docs, doc_offsets, randoms).tolist() == expected


def test_split_is_uniform():
    randoms = example_digests(1, [f"u{i}" for i in range(14_000)]).randoms
    draws = prefix_lengths(np.full(14_000, 8), randoms)
    assert draws.min() == 1 and draws.max() == 7
    assert_fits(np.bincount(draws, minlength=8)[1:], [1 / 7] * 7, "split of 8 tokens")
    long = prefix_lengths(np.full(10_000, 2048), example_digests(2, [f"l{i}" for i in range(10_000)]).randoms)
    assert long.min() >= 1 and long.max() <= 2047
    assert_fits(np.bincount((long - 1) // 64, minlength=32), [64 / 2047] * 31 + [63 / 2047], "split of 2048")
