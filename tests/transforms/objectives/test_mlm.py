"""Tests of transforms/objectives/mlm.py: golden examples, properties, 80/10/10 statistics."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.examples import example_schema
from transforms.objectives.common import SpecialIds, example_rng
from transforms.objectives.mlm import (
    IGNORE_INDEX,
    MLM,
    STATS_KEY,
    MLMConfig,
    draw_non_special,
    exact_split,
    mlm,
    mlm_with_stats,
    round_half_up,
)

# ids 0..4 special, 5..29 ordinary
SPECIAL = SpecialIds(vocab_size=30, pad=0, eos=1, mask=2, cls=3, sep=4)


def test_golden_plain():
    tokens = np.arange(5, 25, dtype=np.int32)
    example, counters = mlm_with_stats(
        tokens, example_rng(0, "key"), MLMConfig(seq_len=20, mlm_probability=0.3), SPECIAL
    )
    # n = 20 non-special -> 6 selected: the first 6 of the generator's permutation.
    replay = example_rng(0, "key")
    assert replay.permutation(20)[:6].tolist() == [10, 18, 1, 19, 9, 8]
    # split of 6 at floor([4.8, 5.4] + u), u = 0.656 -> 5 masks, 1 random, 0 kept, in that order.
    assert replay.random() == pytest.approx(0.6561448642764803)
    # the random token: rank 15 among the 25 non-special ids 5..29 -> id 20, at position 8.
    assert replay.integers(0, 25, size=1).tolist() == [15]
    assert example["input_ids"].tolist() == [5, 2, 7, 8, 9, 10, 11, 12, 20, 2, 2, 16, 17, 18, 19, 20, 21, 22, 2, 2]
    expected_labels = [-100] * 20
    for position in (1, 8, 9, 10, 18, 19):
        expected_labels[position] = int(tokens[position])
    assert example["labels"].tolist() == expected_labels
    assert counters == {
        "examples": 1,
        "tokens": 20,
        "padding_tokens": 0,
        "maskable_tokens": 20,
        "selected": 6,
        "masked": 5,
        "random": 1,
        "kept": 0,
    }


def test_golden_framed_with_inner_special_and_padding():
    tokens = np.array([5, 6, 7, 1, 8, 9, 10, 11], dtype=np.int32)  # EOS (1) between two documents
    config = MLMConfig(seq_len=12, mlm_probability=0.5, frame=True)
    example, counters = mlm_with_stats(tokens, example_rng(0, "key"), config, SPECIAL)
    # [CLS] 5 6 7 EOS 8 9 10 11 [SEP] PAD PAD: 7 candidates -> round_half_up(3.5) = 4 selected;
    # split of 4 at floor([3.2, 3.6] + u) with u < 0.4 -> 3 masks, 0 random, 1 kept (position 8, id 11).
    assert example["input_ids"].tolist() == [3, 2, 6, 7, 1, 2, 2, 10, 11, 4, 0, 0]
    assert example["labels"].tolist() == [-100, 5, -100, -100, -100, 8, 9, -100, 11, -100, -100, -100]
    assert counters == {
        "examples": 1,
        "tokens": 10,
        "padding_tokens": 2,
        "maskable_tokens": 7,
        "selected": 4,
        "masked": 3,
        "random": 0,
        "kept": 1,
    }


def test_golden_whole_word():
    tokens = np.arange(10, 20, dtype=np.int32)
    word_starts = np.array([1, 0, 0, 1, 1, 0, 1, 0, 0, 0], dtype=bool)  # words of 3, 1, 2, 4 tokens
    config = MLMConfig(seq_len=10, mlm_probability=0.5, whole_word_mask=True)
    example, counters = mlm_with_stats(tokens, example_rng(0, "key"), config, SPECIAL, word_starts)
    # budget 5; word order [3, 0, 2, 1]: word 3 (4 tokens) fits, word 0 (3) and word 2 (2)
    # would overflow and are skipped, word 1 (1 token) fills the budget.
    assert example_rng(0, "key").permutation(4).tolist() == [3, 0, 2, 1]
    assert example["labels"].tolist() == [-100, -100, -100, 13, -100, -100, 16, 17, 18, 19]
    # split of 5 at floor([4, 4.5] + u), u < 0.5 -> 4 masks, 1 kept (id 17).
    assert example["input_ids"].tolist() == [10, 11, 12, 2, 14, 15, 2, 17, 2, 2]
    assert (counters["selected"], counters["masked"], counters["random"], counters["kept"]) == (5, 4, 0, 1)


def test_exact_split_is_exact_and_unbiased():
    rng = np.random.default_rng(0)
    parts = np.array([exact_split(77, (0.8, 0.1, 0.1), rng) for _ in range(4000)])
    assert (parts.sum(axis=1) == 77).all()
    assert (np.abs(parts - 77 * np.array([0.8, 0.1, 0.1])) < 1).all()
    assert np.allclose(parts.mean(axis=0), [61.6, 7.7, 7.7], atol=0.05)
    assert exact_split(5, (0.0, 0.0, 1.0), rng).tolist() == [0, 0, 5]


def test_round_half_up():
    assert [round_half_up(x) for x in (0.5, 1.5, 2.5, 10 * 0.15, 76.8, 2.4999)] == [1, 2, 3, 2, 77, 2]


def test_draw_non_special_is_uniform_over_non_special_ids():
    special = SpecialIds(vocab_size=12, pad=0, eos=5, mask=11, all_special=frozenset({6, 7}))
    draws = draw_non_special(np.random.default_rng(0), special, 60_000)
    allowed = special.non_special_ids()
    assert set(np.unique(draws).tolist()) == set(allowed.tolist())
    counts = np.bincount(draws, minlength=12)[allowed]
    assert np.allclose(counts / draws.size, 1 / allowed.size, atol=0.01)


@st.composite
def chunks(draw):
    frame = draw(st.booleans())
    whole_word = draw(st.booleans())
    seq_len = draw(st.integers(3, 64))
    vocab = draw(st.integers(12, 200))
    raw = seq_len - 2 if frame else seq_len
    length = draw(st.integers(0, raw))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tokens = rng.integers(0, vocab, size=length).astype(np.int32)  # ids 0..4 are special
    word_starts = rng.random(length) < draw(st.floats(0.1, 1.0))
    ratios = rng.dirichlet([1, 1, 1])
    ratios[2] = 1.0 - ratios[0] - ratios[1]
    config = MLMConfig(
        seq_len=seq_len,
        mlm_probability=draw(st.floats(0.01, 0.99)),
        mask_ratio=float(ratios[0]),
        random_ratio=float(ratios[1]),
        keep_ratio=float(ratios[2]),
        whole_word_mask=whole_word,
        frame=frame,
    )
    special = SpecialIds(vocab_size=vocab, pad=0, eos=1, mask=2, cls=3, sep=4)
    return tokens, word_starts, config, special, draw(st.text(max_size=8))


@settings(max_examples=300, deadline=None)
@given(chunks())
def test_properties(case):
    tokens, word_starts, config, special, key = case
    example, counters = mlm_with_stats(tokens, example_rng(7, key), config, special, word_starts)
    input_ids, labels = example["input_ids"], example["labels"]
    assert input_ids.dtype == labels.dtype == np.int32
    assert input_ids.shape == labels.shape == (config.seq_len,)

    framed = np.concatenate([[special.cls], tokens, [special.sep]]) if config.frame else tokens
    expected = np.full(config.seq_len, special.pad)
    expected[: framed.size] = framed
    selected = labels != IGNORE_INDEX
    # labels restore the chunk; nothing outside the selection changes
    assert (np.where(selected, labels, input_ids) == expected).all()
    is_special = np.isin(expected, special.special_array())
    is_special[framed.size :] = True
    assert not (selected & is_special).any()
    # replacements are the mask or non-special ids, never another special token
    replaced = input_ids[selected]
    assert (np.isin(replaced, special.non_special_ids()) | (replaced == special.mask)).all()

    n = int((~is_special).sum())
    budget = min(n, max(1, round_half_up(n * config.mlm_probability))) if n else 0
    if config.whole_word_mask:
        assert counters["selected"] <= budget
    else:
        assert counters["selected"] == budget
    assert counters["selected"] == int(selected.sum())
    assert counters["masked"] + counters["random"] + counters["kept"] == counters["selected"]
    assert counters["masked"] == int((input_ids[selected] == special.mask).sum())
    for name, ratio in (("masked", config.mask_ratio), ("random", config.random_ratio), ("kept", config.keep_ratio)):
        assert abs(counters[name] - counters["selected"] * ratio) < 1 + 1e-9
    assert counters["tokens"] == framed.size and counters["padding_tokens"] == config.seq_len - framed.size
    # determinism: same key, same example
    again = mlm(tokens, example_rng(7, key), config, special, word_starts)
    assert all((again[k] == example[k]).all() for k in example)


@settings(max_examples=200, deadline=None)
@given(chunks())
def test_whole_words_are_taken_whole(case):
    tokens, word_starts, config, special, key = case
    if not config.whole_word_mask:
        config = MLMConfig(**{**config.__dict__, "whole_word_mask": True})
    labels = mlm(tokens, example_rng(3, key), config, special, word_starts)["labels"]
    offset = 1 if config.frame else 0
    selected = labels[offset : offset + tokens.size] != IGNORE_INDEX
    non_special = ~np.isin(tokens, special.special_array())
    # a word = a run of non-special tokens cut at word starts and at special tokens
    starts = word_starts | ~non_special | np.concatenate([[True], ~non_special[:-1]])
    word_of = np.cumsum(starts)
    for word in np.unique(word_of[non_special]):
        members = selected[(word_of == word) & non_special]
        assert members.all() or not members.any()


def test_statistics_80_10_10_over_10000_examples():
    config = MLMConfig(seq_len=128)
    special = SpecialIds(vocab_size=1000, pad=0, eos=1, mask=2, cls=3, sep=4, unk=5)
    data = np.random.default_rng(11)
    totals = {"selected": 0, "masked": 0, "random": 0, "kept": 0}
    for i in range(10_000):
        tokens = data.integers(0, 1000, size=128).astype(np.int32)
        example, counters = mlm_with_stats(tokens, example_rng(1, f"ex{i}"), config, special)
        n = int((~np.isin(tokens, special.special_array())).sum())
        assert counters["selected"] == max(1, round_half_up(n * 0.15))  # exact, every example
        for name in totals:
            totals[name] += counters[name]
    shares = {name: totals[name] / totals["selected"] for name in ("masked", "random", "kept")}
    assert abs(shares["masked"] - 0.8) < 0.01
    assert abs(shares["random"] - 0.1) < 0.01
    assert abs(shares["kept"] - 0.1) < 0.01


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mlm_probability": 0.0}, "mlm_probability"),
        ({"mlm_probability": 1.0}, "mlm_probability"),
        ({"mask_ratio": 0.7}, "mask_ratio + random_ratio + keep_ratio"),
        ({"random_ratio": -0.1, "keep_ratio": 0.3}, "random_ratio"),
        ({"seq_len": 2, "frame": True}, "seq_len"),
        ({"seq_len": 0}, "seq_len"),
    ],
)
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field.replace("+", r"\+")):
        MLMConfig(**kwargs)


def test_bad_input():
    config = MLMConfig(seq_len=8, whole_word_mask=True)
    tokens = np.arange(5, 10, dtype=np.int32)
    with pytest.raises(ValueError, match="word_starts"):
        mlm(tokens, example_rng(0, "k"), config, SPECIAL)
    with pytest.raises(ValueError, match="shape"):
        mlm(tokens, example_rng(0, "k"), config, SPECIAL, np.ones(3, bool))
    with pytest.raises(ValueError, match="raw length"):
        mlm(np.arange(5, 15), example_rng(0, "k"), MLMConfig(seq_len=8), SPECIAL)
    with pytest.raises(ValueError, match="token ids"):
        mlm(np.array([5, 99]), example_rng(0, "k"), MLMConfig(seq_len=8), SPECIAL)
    with pytest.raises(ValueError, match="cls"):
        mlm(
            tokens,
            example_rng(0, "k"),
            MLMConfig(seq_len=8, frame=True),
            SpecialIds(vocab_size=30, pad=0, eos=1, mask=2),
        )
    with pytest.raises(ValueError, match="mask"):
        mlm(tokens, example_rng(0, "k"), MLMConfig(seq_len=8), SpecialIds(vocab_size=30, pad=0, eos=1))


def test_objective_class():
    objective = MLM(MLMConfig(seq_len=16, whole_word_mask=True, frame=True))
    assert (objective.name, objective.family) == ("mlm", "encoder")
    assert objective.features == {"word_starts"}
    assert objective.required_specials == {"mask", "pad", "cls", "sep"}
    assert MLM().features == frozenset() and MLM().required_specials == {"mask", "pad"}
    assert objective.plan_chunk(example_rng(0, "k")) == (14, 0)
    tokens = np.arange(5, 19, dtype=np.int32)
    features = {"word_starts": np.ones(14, bool), "doc_lengths": np.array([14])}
    example = objective.build(tokens, example_rng(0, "k"), 0, SPECIAL, features)
    stats = objective.stats(example)
    assert stats == example[STATS_KEY] and all(isinstance(v, int) for v in stats.values())
    assert objective.stats({k: v for k, v in example.items() if k != STATS_KEY}) == {
        "examples": 1,
        "selected": stats["selected"],
    }
    schema = example_schema(objective.family, **objective.schema_kwargs())
    assert schema.fixed_length("input_ids") == schema.fixed_length("labels") == 16
    assert objective.max_sentinels() == 0
    assert objective.params()["whole_word_mask"] is True


def test_imports_only_numpy_and_stdlib():
    code = (
        "import sys, transforms.objectives.mlm, transforms.objectives.bart;"
        "bad = [m for m in ('apache_beam', 'torch', 'pyarrow', 'tokenizers') if m in sys.modules];"
        "sys.exit(str(bad) if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[3])


# --- the block path -------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    seq_len=st.sampled_from([4, 16, 128]),
    options=st.sampled_from([{}, {"whole_word_mask": True}, {"frame": True}, {"mlm_probability": 0.5}]),
    rows=st.lists(st.floats(0.0, 1.0), max_size=10),
    seed=st.integers(0, 2**32 - 1),
)
def test_build_many_equals_build_and_stats_row_by_row(seq_len, options, rows, seed):
    """Full and short chunks with special ids among their tokens: the columns and counters of
    MLM.build + stats one example at a time."""
    from schemas.examples import example_schema
    from transforms.objectives.common import example_rngs
    from transforms.objectives.counters import add_counters
    from transforms.objectives.mlm import MLM, MLMConfig
    from transforms.objectives.packing import Piece
    from transforms.shard_format import ExampleColumns

    special = SpecialIds(vocab_size=60, pad=1, eos=2, mask=3, cls=4, sep=5)
    objective = MLM(MLMConfig(seq_len=seq_len, **options))
    rng = np.random.default_rng(seed)
    pieces, keys = [], []
    for index, fraction in enumerate(rows):
        length = max(1, int(objective.config.raw_length * fraction))
        tokens = rng.integers(6, 60, length).astype(np.int32)
        tokens[rng.random(length) < 0.1] = special.eos
        pieces.append(Piece(tokens, np.array([length], np.int32), {"word_starts": rng.random(length) < 0.6}))
        keys.append(f"k{index}")
    arrays, scalars, strings, counters = objective.build_many(pieces, [0] * len(keys), example_rngs(6, keys), special)
    assert scalars == {} and strings == {}
    schema = example_schema(objective.family, **objective.schema_kwargs())
    examples, summed = [], {}
    for piece, key in zip(pieces, keys):
        example = objective.build(piece.tokens, example_rng(6, key), 0, special, dict(piece.features))
        add_counters(summed, objective.stats(example))
        examples.append({"key": key, "input_ids": example["input_ids"], "labels": example["labels"]})
    expected = ExampleColumns.from_examples(examples, schema)
    assert ExampleColumns(schema, len(keys), arrays, {}, {"key": keys}).encode() == expected.encode()
    assert counters == summed
