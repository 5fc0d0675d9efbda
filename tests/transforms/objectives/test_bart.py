"""Tests of transforms/objectives/bart.py: golden examples, a fairseq oracle, properties, statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.examples import example_schema
from transforms.objectives import bart as bart_module
from transforms.objectives.bart import Bart, BartConfig, bart, bart_with_stats, poisson_span_cdf
from transforms.objectives.common import SpecialIds, example_rng
from transforms.objectives.mlm import STATS_KEY
from transforms.objectives.packing import Piece

# ids 0..3 special (<s>, <pad>, </s>, <mask>), 4..49 ordinary
SPECIAL = SpecialIds(vocab_size=50, pad=1, eos=2, bos=0, mask=3)
TOKENS = np.arange(10, 22, dtype=np.int32)
# words [10 11] [12] [13 14 15] [16] [17 18] [19] [20 21]; framed positions 1..12
WORD_STARTS = np.array([1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 1, 0], dtype=bool)
# sentences [10 11 12] [13 14 15 16] [17 18 19 20 21]
SENTENCE_STARTS = np.isin(np.arange(12), [3, 7])
FRAMED = [0, *range(10, 22), 2]


def run(**overrides):
    config = BartConfig(**{"seq_len": 14, **overrides})
    return bart_with_stats(TOKENS, example_rng(0, "key"), config, SPECIAL, WORD_STARTS, SENTENCE_STARTS)


def test_golden_bart_large_defaults():
    example, counters = run()
    # permutation of the 3 sentences: chosen = [2 0 1], shuffled by [1 0 2] -> order [2 1 0]:
    # <s> 17 18 19 20 21 | 13 14 15 16 | 10 11 12 </s>
    replay = example_rng(0, "key")
    assert replay.permutation(3).tolist() == [2, 0, 1] and replay.permutation(3).tolist() == [1, 0, 2]
    # budget ceil(7 words * 0.3) = 3; first Poisson(3.5) draw is 3 -> one span of 3 words,
    # started at word [19]: [19] [20 21] [13 14 15] -> one <mask>.
    assert np.searchsorted(poisson_span_cdf(3.5), replay.random(3), side="right")[0] == 3
    assert example["inputs"].tolist() == [0, 17, 18, 3, 16, 10, 11, 12, 2]
    assert example["targets"].tolist() == FRAMED
    assert counters["permuted_sentences"] == 2 and counters["sentences"] == 3
    assert (counters["mask_budget"], counters["masked_spans"], counters["span_len_hist_3"]) == (3, 1, 1)
    assert (counters["masked_words"], counters["masked_tokens"], counters["deleted"]) == (3, 6, 5)


def test_golden_word_deletion():
    # mask_length=word: 3 one-word spans at framed positions [3 10 11] = words [12] [19] [20 21], deleted
    example, counters = run(permute_sentences=0.0, replace_length=0, mask_length="word")
    word_positions = np.array([1, 3, 4, 7, 8, 10, 11])
    assert example_rng(0, "key").choice(word_positions, size=3, replace=False).tolist() == [3, 10, 11]
    assert example["inputs"].tolist() == [0, 10, 11, 13, 14, 15, 16, 17, 18, 2]
    assert (counters["masked_words"], counters["masked_tokens"], counters["deleted"]) == (3, 4, 4)


def test_golden_token_masking_span_stops_at_eos():
    # replace_length=-1: first draw 6 trimmed to the budget 3; the span starts at [19], covers
    # [19] [20 21] and stops before </s>. It is random (0.378 < 0.5): each token becomes a
    # random id (ranks 11 12 7 among ids 4..49 -> 15 16 11).
    example, counters = run(permute_sentences=0.0, replace_length=-1, mask_random=0.5)
    assert example["inputs"].tolist() == [0, *range(10, 19), 15, 16, 11, 2]
    assert (counters["span_len_hist_3"], counters["masked_words"], counters["random_tokens"]) == (1, 2, 3)


def test_golden_overlapping_spans_merge():
    # lambda=1, budget ceil(7 * 0.5) = 4: lengths [2 2]; starts [4 7] = words [13 14 15] and [16];
    # span 2 starts inside span 1's tail, so 13..18 become one <mask> (fairseq's to_keep logic).
    example, counters = run(permute_sentences=0.0, mask=0.5, poisson_lambda=1.0)
    replay = example_rng(0, "key")
    assert np.searchsorted(poisson_span_cdf(1.0), replay.random(4), side="right").tolist() == [2, 2, 1, 0]
    assert replay.choice(np.array([1, 3, 4, 7, 8, 10, 11]), size=2, replace=False).tolist() == [4, 7]
    assert example["inputs"].tolist() == [0, 10, 11, 12, 3, 19, 20, 21, 2]
    assert (counters["span_len_hist_2"], counters["masked_words"], counters["mask_tokens"]) == (2, 3, 1)


def test_golden_zero_length_spans_insert_masks():
    example, counters = bart_with_stats(
        TOKENS,
        example_rng(0, "k0"),
        BartConfig(seq_len=14, permute_sentences=0.0, mask=0.5, poisson_lambda=1.0),
        SPECIAL,
        WORD_STARTS,
        SENTENCE_STARTS,
    )
    # four one-word spans ([12] [13 14 15] [16] [19]) -> one <mask> each, then 2 zero-length spans insert 2 <mask>
    assert example["inputs"].tolist() == [0, 3, 10, 11, 3, 3, 3, 3, 17, 18, 3, 20, 21, 2]
    assert (counters["span_len_hist_0"], counters["span_len_hist_1"], counters["inserted"]) == (2, 4, 2)


def test_golden_rotation_insertion_token_passes():
    # rotation: coin 0.90 < 1, offset 3 -> <s> 12..21 10 11 </s>
    assert run(permute_sentences=0.0, mask=0.0, rotate=1.0)[0]["inputs"].tolist() == [
        0,
        *range(12, 22),
        10,
        11,
        2,
    ]
    # insertion: ceil(14 * 0.2) = 3 tokens at result positions [4 13 3]; only the third is random
    # (0.154 < 0.2): rank 17 -> id 21; the others are <mask>.
    example, counters = run(permute_sentences=0.0, mask=0.0, insert=0.2, mask_random=0.2)
    assert example["inputs"].tolist() == [0, 10, 11, 21, 3, *range(12, 20), 3, 20, 21, 2]
    assert (counters["inserted"], counters["random_tokens"], counters["mask_tokens"]) == (3, 1, 2)
    # token masking / deletion: ceil(7 * 0.3) = 3 words [12] [19] [20 21]
    assert run(permute_sentences=0.0, mask=0.0, token_mask=0.3)[0]["inputs"].tolist() == [
        0,
        10,
        11,
        3,
        *range(13, 19),
        3,
        3,
        3,
        2,
    ]
    assert run(permute_sentences=0.0, mask=0.0, token_delete=0.3)[0]["inputs"].tolist() == [
        0,
        10,
        11,
        *range(13, 19),
        2,
    ]


def _fairseq_span_walk(word_start, barrier, start, length):
    """fairseq's loop: walk right, subtracting word starts (a huge value at a barrier)."""
    position, remaining = start, length - 1
    while True:
        position += 1
        remaining -= 255 if barrier[position] else int(word_start[position])
        if remaining < 0:
            return position


@settings(max_examples=200, deadline=None)
@given(st.integers(3, 60), st.integers(0, 2**32 - 1))
def test_span_ends_match_fairseq_walk(size, seed):
    rng = np.random.default_rng(seed)
    word_start = rng.random(size) < 0.6
    barrier = rng.random(size) < 0.1
    barrier[[0, -1]] = True
    pool = np.flatnonzero(word_start & ~barrier)
    lengths = rng.integers(1, 12, size=pool.size)
    ends = bart_module._span_ends(word_start, barrier, pool, lengths)
    assert ends.tolist() == [_fairseq_span_walk(word_start, barrier, s, n) for s, n in zip(pool, lengths, strict=True)]


class _ScriptedRng:
    """Stands in for the generator of ``_mask_spans``: scripted starts and coins, id rank 0."""

    def __init__(self, starts, coins):
        self.starts, self.coins = starts, coins

    def choice(self, pool, size, replace):
        assert not replace and set(self.starts) <= set(pool.tolist())
        return np.array(self.starts[:size], dtype=np.int64)

    def random(self, size):
        return np.array(self.coins[:size])

    def integers(self, low, high, size):
        return np.zeros(size, dtype=np.int64)


def _fairseq_mask(ids, word_start, starts, lengths, coins, replace_length, mask_random, mask, random_id):
    """Literal numpy transcription of fairseq ``add_whole_word_mask`` after the draws."""
    source, size = ids.copy(), ids.size
    is_word_start = word_start.astype(np.int64)
    is_word_start[0], is_word_start[-1] = 0, 255
    indices, lengths = np.array(starts, dtype=np.int64), np.array(lengths, dtype=np.int64) - 1
    is_random = np.array(coins, dtype=float) < mask_random
    to_keep = np.ones(size, dtype=bool)
    if replace_length == 0:
        to_keep[indices] = False
    else:
        source[indices] = mask
        source[indices[is_random]] = random_id
    while indices.size:
        lengths = lengths - is_word_start[indices + 1]
        uncompleted = lengths >= 0
        indices, is_random, lengths = indices[uncompleted] + 1, is_random[uncompleted], lengths[uncompleted]
        if replace_length != -1:
            to_keep[indices] = False
        else:
            source[indices] = mask
            source[indices[is_random]] = random_id
    return source[to_keep]


@settings(max_examples=300, deadline=None)
@given(st.integers(3, 40), st.sampled_from([-1, 0, 1]), st.integers(0, 2**32 - 1))
def test_masking_matches_fairseq_transcription(size, replace_length, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, 50, size=size).astype(np.int32)
    ids[0], ids[-1] = SPECIAL.bos, SPECIAL.eos
    word_start = rng.random(size) < 0.6
    word_start[[0, -1]] = False
    barrier = np.zeros(size, dtype=bool)
    barrier[[0, -1]] = True
    pool = np.flatnonzero(word_start)
    count = int(rng.integers(0, pool.size + 1))
    starts = rng.permutation(pool)[:count].tolist()
    lengths = rng.integers(1, 6, size=count)
    coins = rng.random(count).tolist()
    config = BartConfig(seq_len=max(size, 3), mask_random=0.5)
    src = bart_module._Noisy(ids.copy(), word_start.copy(), barrier)
    counters = {"random_tokens": 0}
    bart_module._mask_spans(src, lengths, replace_length, config, SPECIAL, _ScriptedRng(starts, coins), counters)
    expected = _fairseq_mask(ids, word_start, starts, lengths, coins, replace_length, 0.5, SPECIAL.mask, 4)
    assert src.ids.tolist() == expected.tolist()


@st.composite
def chunks(draw):
    seq_len = draw(st.integers(3, 80))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    length = draw(st.integers(0, seq_len - 2))
    tokens = rng.integers(4, 60, size=length).astype(np.int32)
    tokens[rng.random(length) < draw(st.sampled_from([0.0, 0.05]))] = 2  # EOS between packed documents
    replace_length = draw(st.sampled_from([-1, 0, 1]))
    mask_length = draw(st.sampled_from(["span-poisson", "word"] + (["subword"] if replace_length != -1 else [])))
    probability = st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0])
    config = BartConfig(
        seq_len=seq_len,
        mask=draw(probability),
        mask_random=draw(probability),
        insert=draw(probability),
        rotate=draw(probability),
        permute_sentences=draw(probability),
        replace_length=replace_length,
        mask_length=mask_length,
        poisson_lambda=draw(st.sampled_from([0.5, 3.0, 3.5, 10.0])),
        token_mask=draw(probability),
        token_delete=draw(probability),
    )
    word_starts = rng.random(length) < 0.7 if draw(st.booleans()) else None
    sentence_starts = rng.random(length) < 0.2 if draw(st.booleans()) else None
    special = SpecialIds(vocab_size=60, pad=1, eos=2, bos=0, mask=3)
    return tokens, word_starts, sentence_starts, config, special, draw(st.text(max_size=8))


@settings(max_examples=400, deadline=None)
@given(chunks())
def test_properties(case):
    tokens, word_starts, sentence_starts, config, special, key = case
    example, counters = bart_with_stats(tokens, example_rng(5, key), config, special, word_starts, sentence_starts)
    inputs, targets = example["inputs"], example["targets"]
    assert inputs.dtype == targets.dtype == np.int32
    assert targets.tolist() == [special.bos, *tokens.tolist(), special.eos]
    assert inputs[0] == special.bos and inputs[-1] == special.eos and inputs.size >= 2
    assert inputs.size <= config.max_inputs_length
    if config.insert == 0:
        assert inputs.size <= config.seq_len
    interior = inputs[1:-1]
    # specials of the chunk (EOS separators) survive every noise; no other special appears but <mask>
    assert (interior == special.eos).sum() == (tokens == special.eos).sum()
    assert (np.isin(interior, special.non_special_ids()) | np.isin(interior, [special.mask, special.eos])).all()
    noise_free = config.mask == config.token_mask == config.token_delete == config.insert == 0
    if noise_free:
        assert sorted(interior.tolist()) == sorted(tokens.tolist())  # permutation and rotation only move tokens
    assert counters["input_tokens"] == inputs.size and counters["source_tokens"] == targets.size
    assert counters["mask_tokens"] == int((inputs == special.mask).sum())
    applied = sum(int(k.rsplit("_", 1)[1]) * v for k, v in counters.items() if k.startswith("span_len_hist_"))
    assert applied == counters["mask_budget"]
    assert counters["deleted"] == targets.size - inputs.size + counters["inserted"]
    assert all(isinstance(v, int) for v in counters.values())
    again = bart(tokens, example_rng(5, key), config, special, word_starts, sentence_starts)
    assert again["inputs"].tolist() == inputs.tolist()


def test_poisson_span_distribution():
    cdf = poisson_span_cdf(3.5)
    pmf = np.diff(cdf, prepend=0.0)
    assert cdf.size == 19 and cdf[-1] == pytest.approx(1.0)  # k = 0..18; p_18 < 1e-7 is the last kept
    assert (pmf * np.arange(cdf.size)).sum() == pytest.approx(3.5, abs=1e-5)
    assert pmf[0] == pytest.approx(math.exp(-3.5), rel=1e-6)


def test_statistics_over_10000_examples():
    """BART-large noise on 510-token chunks (about 1.33 tokens per word, 21 sentences).

    Measured: ``mask_budget / words`` (nominal, ceil(0.3 * words) / words), ``masked_words /
    words`` (realized: overlapping spans and spans cut at </s> cover fewer words, about 0.267),
    the mean of the applied span lengths in words (zero-length spans included, the last span
    trimmed to the budget, which pulls the mean about 1.5% under lambda), the share of
    zero-length spans (e^-3.5) and the share of random tokens among surviving masks.
    """
    config = BartConfig()
    special = SpecialIds(vocab_size=50265, pad=1, eos=2, bos=0, unk=3, mask=50264)
    data = np.random.default_rng(2)
    totals: dict[str, int] = {}
    for i in range(10_000):
        tokens = data.integers(4, 50000, size=510).astype(np.int32)
        word_starts, sentence_starts = data.random(510) < 0.75, data.random(510) < 0.04
        _, counters = bart_with_stats(tokens, example_rng(0, f"ex{i}"), config, special, word_starts, sentence_starts)
        for name, value in counters.items():
            totals[name] = totals.get(name, 0) + value
    hist = {int(k.rsplit("_", 1)[1]): v for k, v in totals.items() if k.startswith("span_len_hist_")}
    spans = sum(hist.values())
    mean_span = sum(k * v for k, v in hist.items()) / spans
    assert 0.3 <= totals["mask_budget"] / totals["words"] <= 0.3 + 10_000 / totals["words"]
    assert 0.25 <= totals["masked_words"] / totals["words"] <= 0.3
    assert abs(mean_span - 3.5) / 3.5 < 0.05
    assert abs(hist[0] / spans - math.exp(-3.5)) < 0.005
    assert abs(totals["random_tokens"] / (totals["random_tokens"] + totals["mask_tokens"]) - 0.1) < 0.01
    assert totals["inserts_dropped"] == 0 and totals["permuted_sentences"] > 0.9 * totals["sentences"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mask": 1.5}, "mask"),
        ({"mask_random": -0.1}, "mask_random"),
        ({"rotate": 2.0}, "rotate"),
        ({"permute_sentences": -1.0}, "permute_sentences"),
        ({"replace_length": 2}, "replace_length"),
        ({"mask_length": "span"}, "mask_length"),
        ({"mask_length": "subword", "replace_length": -1}, "subword"),
        ({"poisson_lambda": 0.0}, "poisson_lambda"),
        ({"seq_len": 2}, "seq_len"),
        ({"token_delete": 1.1}, "token_delete"),
    ],
)
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BartConfig(**kwargs)


def test_bad_input():
    config = BartConfig(seq_len=8)
    with pytest.raises(ValueError, match="raw length"):
        bart(np.arange(4, 12), example_rng(0, "k"), config, SPECIAL)
    with pytest.raises(ValueError, match="word_starts"):
        bart(np.arange(4, 8), example_rng(0, "k"), config, SPECIAL, word_starts=np.ones(3, bool))
    with pytest.raises(ValueError, match="bos"):
        bart(np.arange(4, 8), example_rng(0, "k"), config, SpecialIds(vocab_size=50, pad=1, eos=2, mask=3))


def test_objective_class():
    objective = Bart(BartConfig(seq_len=14))
    assert (objective.name, objective.family) == ("bart", "seq2seq")
    assert objective.features == {"word_starts", "sentence_starts"}
    assert objective.required_specials == {"bos", "eos", "mask", "pad"}
    assert objective.plan_chunk(example_rng(0, "k")) == (12, 0)
    features = {"word_starts": WORD_STARTS, "sentence_starts": SENTENCE_STARTS, "doc_lengths": np.array([12])}
    example = objective.build(TOKENS, example_rng(0, "key"), 0, SPECIAL, features)
    assert example["inputs"].tolist() == run()[0]["inputs"].tolist()
    assert objective.stats(example) == example[STATS_KEY]
    bare = objective.stats({"inputs": example["inputs"], "targets": example["targets"]})
    assert bare == {"examples": 1, "tokens": 14, "source_tokens": 14, "input_tokens": 9}
    schema = example_schema(objective.family, **objective.schema_kwargs())
    assert schema.fixed_length("inputs") is None and schema.fixed_length("targets") is None
    assert objective.max_sentinels() == 0 and objective.params()["poisson_lambda"] == 3.5


# --- the block path -------------------------------------------------------------------------


@st.composite
def blocks(draw):
    """Rows of one length with the features and configurations ``bart_many`` covers."""
    seq_len = draw(st.integers(3, 60))
    size = draw(st.integers(1, seq_len - 2))
    count = draw(st.integers(1, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tokens = rng.integers(4, 60, size=(count, size)).astype(np.int32)
    tokens[rng.random((count, size)) < draw(st.sampled_from([0.0, 0.1]))] = 2  # EOS between packed documents
    if draw(st.booleans()):
        tokens[rng.integers(0, count)] = 2  # a row without a maskable word
    probability = st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0])
    config = BartConfig(
        seq_len=seq_len,
        mask=draw(probability),
        mask_random=draw(probability),
        permute_sentences=draw(probability),
        mask_length=draw(st.sampled_from(["span-poisson", "word", "subword"])),
        poisson_lambda=draw(st.sampled_from([0.5, 3.0, 3.5, 10.0])),
    )
    word_starts = rng.random((count, size)) < draw(st.sampled_from([0.3, 0.7, 1.0])) if draw(st.booleans()) else None
    sentence_starts = rng.random((count, size)) < draw(st.sampled_from([0.0, 0.05, 0.3]))
    keys = [f"k{i}-{draw(st.text(max_size=4))}" for i in range(count)]
    return tokens, word_starts, sentence_starts, config, keys


@settings(max_examples=400, deadline=None)
@given(blocks(), st.booleans())
def test_bart_many_equals_bart_with_stats_row_by_row(case, lazy):
    from transforms.objectives.common import LazyGenerator

    tokens, word_starts, sentence_starts, config, keys = case
    special = SpecialIds(vocab_size=60, pad=1, eos=2, bos=0, mask=3)
    generators = [LazyGenerator(9, key) if lazy else example_rng(9, key) for key in keys]
    inputs, offsets, targets, counters = bart_module.bart_many(tokens, generators, config, special, word_starts,
                                                               sentence_starts)
    assert inputs.dtype == targets.dtype == np.int32 and offsets.dtype == np.int64
    summed: dict[str, int] = {}
    for row, key in enumerate(keys):
        example, row_counters = bart_with_stats(tokens[row], example_rng(9, key), config, special,
                                                None if word_starts is None else word_starts[row], sentence_starts[row])
        assert inputs[offsets[row] : offsets[row + 1]].tolist() == example["inputs"].tolist()
        assert targets[row].tolist() == example["targets"].tolist()
        for name, value in row_counters.items():
            summed[name] = summed.get(name, 0) + value
    assert offsets[-1] == inputs.size
    assert counters == summed and all(isinstance(v, int) for v in counters.values())


def test_bart_many_on_a_hand_checked_block():
    """Two rows of the golden chunk: each row is the one-by-one example of its key."""
    config = BartConfig(seq_len=14)
    tokens = np.stack([TOKENS, TOKENS[::-1]])
    words, sentences = np.stack([WORD_STARTS, WORD_STARTS]), np.stack([SENTENCE_STARTS, SENTENCE_STARTS])
    inputs, offsets, targets, counters = bart_module.bart_many(
        tokens, [example_rng(0, "key"), example_rng(0, "other")], config, SPECIAL, words, sentences)
    first = run()[0]["inputs"].tolist()  # the golden example of key "key"
    assert inputs[offsets[0] : offsets[1]].tolist() == first
    assert targets.tolist() == [FRAMED, [0, *range(21, 9, -1), 2]]
    assert counters["examples"] == 2 and counters["source_tokens"] == 28
    assert counters["input_tokens"] == inputs.size == offsets[-1]


def test_bart_many_refuses_what_it_does_not_cover():
    tokens, generators = np.full((2, 12), 5, np.int32), [example_rng(0, "a"), example_rng(0, "b")]
    flags = np.zeros((2, 12), bool)
    features = {"word_starts": flags[0], "sentence_starts": flags[0]}
    full = Piece(tokens[0], np.array([12]), features)
    for passes in ({"insert": 0.1}, {"rotate": 0.5}, {"token_mask": 0.1}, {"token_delete": 0.1},
                   {"replace_length": 0}, {"replace_length": -1}):
        config = BartConfig(seq_len=14, **passes)
        assert not Bart(config).builds_many(full, 0)
        with pytest.raises(ValueError, match="bart_many covers"):
            bart_module.bart_many(tokens, generators, config, SPECIAL, None, flags)
    config = BartConfig(seq_len=14)
    assert Bart(config).builds_many(full, 0)
    short = Piece(tokens[0, :11], np.array([11]), {name: flags[:11] for name, flags in features.items()})
    assert not Bart(config).builds_many(short, 0)
    assert not Bart(config).builds_many(Piece(tokens[0], np.array([12]), {"word_starts": flags[0]}), 0)
    with pytest.raises(ValueError, match="generators"):
        bart_module.bart_many(tokens, generators[:1], config, SPECIAL, None, flags)
    with pytest.raises(ValueError, match="sentence_starts"):
        bart_module.bart_many(tokens, generators, config, SPECIAL, None, flags[:, :5])
    with pytest.raises(ValueError, match="word_starts"):
        bart_module.bart_many(tokens, generators, config, SPECIAL, flags[:1], flags)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 50\)"):
        bart_module.bart_many(np.full((2, 12), 50, np.int32), generators, config, SPECIAL, None, flags)
    with pytest.raises(ValueError, match="size <= 12"):
        bart_module.bart_many(np.full((2, 13), 5, np.int32), generators, config, SPECIAL, None, np.zeros((2, 13), bool))
