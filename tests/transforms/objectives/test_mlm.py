"""Tests of transforms/objectives/mlm.py: BERT's selection size, golden examples, a per-example
oracle (HF's whole-word scan), properties and 80/10/10 statistics."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from objective_oracles import assert_fits

from schemas.examples import example_schema
from transforms.objectives.base import Block, build_example
from transforms.objectives.common import SpecialIds
from transforms.objectives.layout import example_digests, example_randoms
from transforms.objectives.mlm import (
    IDS_STREAM,
    IGNORE_INDEX,
    MLM,
    ORDER_STREAM,
    SELECT_STREAM,
    SPLIT_STREAM,
    MLMConfig,
    exact_split,
    selection_budget,
)
from transforms.objectives.randoms import first_distinct, random_ids


def round_half_up(value: float) -> int:
    """Round to the nearest integer, ties up, after dropping float noise below 1e-9 (the
    rounding of MLM's selection budget, one value at a time)."""
    return math.floor(round(value, 9) + 0.5)

# ids 0..4 special, 5..29 ordinary
SPECIAL = SpecialIds(vocab_size=30, pad=0, eos=1, mask=2, cls=3, sep=4)


def masked(tokens, key: str = "key", special: SpecialIds = SPECIAL, word_starts=None, **config):
    objective = MLM(MLMConfig(**config))
    features = {} if word_starts is None else {"word_starts": np.asarray(word_starts, dtype=bool)}
    return build_example(objective, np.asarray(tokens, dtype=np.int32), special, example_randoms(0, [key]),
                         features=features)


def oracle(tokens: np.ndarray, word_starts: np.ndarray | None, randoms, config: MLMConfig,
           special: SpecialIds) -> tuple[list[int], list[int]]:
    """BERT's masking of one chunk, by hand from the documented draws of its row."""
    sequence = tokens.tolist()
    starts = None if word_starts is None else word_starts.tolist()
    if config.frame:
        sequence = [special.cls, *sequence, special.sep]
        starts = None if starts is None else [False, *starts, False]
    specials = set(special.special_array().tolist())
    candidates = [i for i, token in enumerate(sequence) if token not in specials]
    budget = min(len(candidates), max(1, round_half_up(len(sequence) * config.mlm_probability))) if candidates else 0
    if config.max_predictions is not None:
        budget = min(budget, config.max_predictions)
    if not config.whole_word_mask:
        sample, _ = first_distinct(randoms, SELECT_STREAM, len(candidates), budget)
        selected = [candidates[i] for i in sample.tolist()]
    else:
        words: list[list[int]] = []
        for position in candidates:
            if not words or starts[position] or words[-1][-1] != position - 1:
                words.append([position])
            else:
                words[-1].append(position)
        order, _ = first_distinct(randoms, SELECT_STREAM, len(words), len(words))
        picked: list[int] = []
        for index in order.tolist():  # HF's DataCollatorForWholeWordMask scan
            if len(picked) >= budget:
                break
            if len(picked) + len(words[index]) > budget:
                continue
            picked += words[index]
        picked.sort()
        shuffled, _ = first_distinct(randoms, ORDER_STREAM, len(picked), len(picked))
        selected = [picked[i] for i in shuffled.tolist()]
    parts = exact_split(np.array([len(selected)]), (config.mask_ratio, config.random_ratio, config.keep_ratio),
                        randoms.uniforms(SPLIT_STREAM, 1))[0].tolist()
    ids = random_ids(randoms, IDS_STREAM, np.array([parts[1]]), special).tolist()
    input_ids = sequence + [special.pad] * (config.seq_len - len(sequence))
    labels = [IGNORE_INDEX] * config.seq_len
    for rank, position in enumerate(selected):
        labels[position] = sequence[position]
        if rank < parts[0]:
            input_ids[position] = special.mask
        elif rank < parts[0] + parts[1]:
            input_ids[position] = ids[rank - parts[0]]
    return input_ids, labels


def test_selection_size_is_berts():
    # BERT: round(len(tokens) * p) with [CLS] and [SEP] counted. A framed 512 with one EOS
    # inside selects 77 (the non-special count, 509, would give 76).
    config = MLMConfig(seq_len=512, frame=True)
    assert selection_budget(np.array([512]), np.array([509]), config).tolist() == [77]
    tokens = np.full(510, 7, dtype=np.int32)
    tokens[200] = SPECIAL.eos
    example, counters = masked(tokens, seq_len=512, frame=True)
    assert counters["selected"] == 77 and counters["maskable_tokens"] == 509 and counters["tokens"] == 512
    # unframed: the sequence is the chunk (an EOS between documents counts like BERT's [SEP])
    assert selection_budget(np.array([128]), np.array([120]), MLMConfig(seq_len=128)).tolist() == [19]
    # at least 1, at most the candidates, and the optional max_predictions_per_seq cap
    assert selection_budget(np.array([3, 40, 40]), np.array([1, 0, 40]), MLMConfig()).tolist() == [1, 0, 6]
    capped = MLMConfig(seq_len=512, max_predictions=20)
    assert selection_budget(np.array([512]), np.array([512]), capped).tolist() == [20]
    assert masked(np.arange(5, 29).repeat(21)[:512], seq_len=512, max_predictions=20)[1]["selected"] == 20
    # ties round up, as BERT did under Python 2 (30 * .15 = 4.5 -> 5; Python 3 and HF: 4)
    assert selection_budget(np.array([30, 10]), np.array([30, 10]), MLMConfig()).tolist() == [5, 2]


def test_golden_plain():
    tokens = np.arange(5, 25, dtype=np.int32)
    example, counters = masked(tokens, seq_len=20, mlm_probability=0.3)
    randoms = example_randoms(0, ["key"])
    chosen = first_distinct(randoms, SELECT_STREAM, 20, 6)[0].tolist()
    u = float(randoms.uniforms(SPLIT_STREAM, 1)[0, 0])
    n_mask = int(np.floor(round(6 * 0.8, 9) + u))  # 4.8 + u
    n_random = int(np.floor(round(6 * 0.9, 9) + u)) - n_mask
    expected = tokens.tolist()
    for position in chosen[:n_mask]:
        expected[position] = SPECIAL.mask
    ids = random_ids(randoms, IDS_STREAM, np.array([n_random]), SPECIAL).tolist()
    for position, value in zip(chosen[n_mask: n_mask + n_random], ids):
        expected[position] = value
    assert example["input_ids"].tolist() == expected
    assert example["labels"].tolist() == [int(t) if i in chosen else IGNORE_INDEX for i, t in enumerate(tokens)]
    assert counters == {"examples": 1, "tokens": 20, "padding_tokens": 0, "maskable_tokens": 20, "selected": 6,
                        "masked": n_mask, "random": n_random, "kept": 6 - n_mask - n_random}


def test_golden_framed_with_inner_special_and_padding():
    tokens = np.array([5, 6, 7, 1, 8, 9, 10, 11], dtype=np.int32)  # EOS (1) between two documents
    example, counters = masked(tokens, seq_len=12, mlm_probability=0.5, frame=True)
    # [CLS] 5 6 7 EOS 8 9 10 11 [SEP] PAD PAD: 10 tokens -> round(5.0) = 5 of the 7 candidates
    assert example["input_ids"][[0, 4, 9, 10, 11]].tolist() == [3, 1, 4, 0, 0]
    labels = example["labels"]
    assert (labels[[0, 4, 9, 10, 11]] == IGNORE_INDEX).all() and int((labels != IGNORE_INDEX).sum()) == 5
    assert counters["tokens"] == 10 and counters["padding_tokens"] == 2 and counters["maskable_tokens"] == 7
    assert counters["selected"] == 5 and counters["masked"] + counters["random"] + counters["kept"] == 5


def test_golden_whole_word():
    tokens = np.arange(10, 20, dtype=np.int32)
    word_starts = np.array([1, 0, 0, 1, 1, 0, 1, 0, 0, 0], dtype=bool)  # words of 3, 1, 2, 4 tokens
    example, counters = masked(tokens, word_starts=word_starts, seq_len=10, mlm_probability=0.5, whole_word_mask=True)
    order = first_distinct(example_randoms(0, ["key"]), SELECT_STREAM, 4, 4)[0].tolist()
    lengths, budget, taken = [3, 1, 2, 4], 5, []
    for word in order:  # HF: skip a word that would overflow, go on scanning
        if sum(lengths[w] for w in taken) + lengths[word] <= budget:
            taken.append(word)
    words = [[0, 1, 2], [3], [4, 5], [6, 7, 8, 9]]
    selected = sorted(p for w in taken for p in words[w])
    assert np.flatnonzero(example["labels"] != IGNORE_INDEX).tolist() == selected
    assert counters["selected"] == len(selected) <= 5


def test_exact_split_is_exact_and_unbiased():
    uniforms = np.random.default_rng(0).random(4000)
    parts = exact_split(np.full(4000, 77), (0.8, 0.1, 0.1), uniforms)
    assert (parts.sum(axis=1) == 77).all()
    assert (np.abs(parts - 77 * np.array([0.8, 0.1, 0.1])) < 1).all()
    assert np.allclose(parts.mean(axis=0), [61.6, 7.7, 7.7], atol=0.05)
    assert exact_split(np.array([5]), (0.0, 0.0, 1.0), np.array([0.3])).tolist() == [[0, 0, 5]]


def test_round_half_up():
    assert [round_half_up(x) for x in (0.5, 1.5, 2.5, 10 * 0.15, 76.8, 2.4999)] == [1, 2, 3, 2, 77, 2]


@st.composite
def blocks(draw):
    frame = draw(st.booleans())
    whole_word = draw(st.booleans())
    seq_len = draw(st.integers(3, 64))
    vocab = draw(st.integers(12, 200))
    raw = seq_len - 2 if frame else seq_len
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ratios = rng.dirichlet([1, 1, 1])
    config = MLMConfig(seq_len=seq_len, mlm_probability=draw(st.floats(0.01, 0.99)), mask_ratio=float(ratios[0]),
                       random_ratio=float(ratios[1]), keep_ratio=float(1.0 - ratios[0] - ratios[1]),
                       whole_word_mask=whole_word, frame=frame,
                       max_predictions=draw(st.one_of(st.none(), st.integers(1, 10))))
    special = SpecialIds(vocab_size=vocab, pad=0, eos=1, mask=2, cls=3, sep=4)
    rows = []
    for _ in range(draw(st.integers(1, 8))):
        length = int(rng.integers(0, raw + 1))
        rows.append((rng.integers(0, vocab, size=length).astype(np.int32),  # ids 0..4 are special
                     rng.random(length) < draw(st.floats(0.1, 1.0))))
    return rows, config, special


@settings(max_examples=250)
@given(blocks(), st.integers(0, 1000))
def test_every_row_of_a_block_is_the_oracles_example(case, seed):
    rows, config, special = case
    keys = [f"k{i}" for i in range(len(rows))]
    randoms = example_digests(seed, keys).randoms
    lengths = np.array([len(tokens) for tokens, _ in rows])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    block = Block(np.concatenate([t for t, _ in rows]).astype(np.int32), offsets, lengths.astype(np.int32),
                  np.arange(len(rows) + 1), {"word_starts": np.concatenate([w for _, w in rows]).astype(bool)},
                  np.zeros(len(rows), np.int64), randoms)
    built = MLM(config).build(block, special)
    input_ids = built.arrays["input_ids"][0].reshape(len(rows), config.seq_len)
    labels = built.arrays["labels"][0].reshape(len(rows), config.seq_len)
    selected = 0
    for row, (tokens, word_starts) in enumerate(rows):
        want_ids, want_labels = oracle(tokens, word_starts if config.whole_word_mask else None, randoms.rows([row]),
                                       config, special)
        assert input_ids[row].tolist() == want_ids and labels[row].tolist() == want_labels
        selected += sum(label != IGNORE_INDEX for label in want_labels)
        # replacements are the mask or non-special ids, never another special token
        replaced = input_ids[row][labels[row] != IGNORE_INDEX]
        assert (np.isin(replaced, special.non_special_ids()) | (replaced == special.mask)).all()
    counters = built.counters
    assert counters["selected"] == selected == counters["masked"] + counters["random"] + counters["kept"]
    assert counters["tokens"] + counters["padding_tokens"] == len(rows) * config.seq_len


def test_statistics_over_10000_examples():
    """Exact counts on every example; 80/10/10 shares and uniform selection over positions."""
    config = MLMConfig(seq_len=128)
    special = SpecialIds(vocab_size=1000, pad=0, eos=1, mask=2, cls=3, sep=4, unk=5)
    count = 10_000
    tokens = np.random.default_rng(11).integers(5, 1000, size=(count, 128)).astype(np.int32)
    keys = [f"ex{i}" for i in range(count)]
    block = Block(tokens.reshape(-1), np.arange(count + 1) * 128, np.full(count, 128, np.int32),
                  np.arange(count + 1), {}, np.zeros(count, np.int64), example_digests(1, keys).randoms)
    built = MLM(config).build(block, special)
    labels = built.arrays["labels"][0].reshape(count, 128)
    selected = labels != IGNORE_INDEX
    assert (selected.sum(axis=1) == 19).all()  # round(128 * .15) = 19, every example
    counters = built.counters
    shares = [counters[name] / counters["selected"] for name in ("masked", "random", "kept")]
    assert np.allclose(shares, [0.8, 0.1, 0.1], atol=0.004)  # sd of a share: about .0007
    assert_fits(selected.sum(axis=0), [1 / 128] * 128, "selected positions")
    ids = built.arrays["input_ids"][0].reshape(count, 128)
    random = selected & (ids != special.mask) & (ids != labels)
    # ids 5..999 are the non-special ones: 45 in the first bucket of 50, 50 in each other
    assert_fits(np.bincount(ids[random] // 50, minlength=20), [45 / 995] + [50 / 995] * 19, "random ids")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mlm_probability": 0.0}, "mlm_probability"),
        ({"mlm_probability": 1.0}, "mlm_probability"),
        ({"mask_ratio": 0.7}, "mask_ratio + random_ratio + keep_ratio"),
        ({"random_ratio": -0.1, "keep_ratio": 0.3}, "random_ratio"),
        ({"seq_len": 2, "frame": True}, "seq_len"),
        ({"seq_len": 0}, "seq_len"),
        ({"max_predictions": 0}, "max_predictions"),
    ],
)
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=field.replace("+", r"\+")):
        MLMConfig(**kwargs)


def test_bad_input():
    tokens = np.arange(5, 10, dtype=np.int32)
    with pytest.raises(ValueError, match="word_starts"):
        masked(tokens, seq_len=8, whole_word_mask=True)
    with pytest.raises(ValueError, match="shape"):
        masked(tokens, word_starts=np.ones(3, bool), seq_len=8, whole_word_mask=True)
    with pytest.raises(ValueError, match="raw length"):
        masked(np.arange(5, 15), seq_len=8)
    with pytest.raises(ValueError, match="token ids"):
        masked(np.array([5, 99]), seq_len=8)
    with pytest.raises(ValueError, match="cls"):
        masked(tokens, special=SpecialIds(vocab_size=30, pad=0, eos=1, mask=2), seq_len=8, frame=True)
    with pytest.raises(ValueError, match="mask"):
        masked(tokens, special=SpecialIds(vocab_size=30, pad=0, eos=1), seq_len=8)


def test_objective_class():
    objective = MLM(MLMConfig(seq_len=16, whole_word_mask=True, frame=True))
    assert (objective.name, objective.family) == ("mlm", "encoder")
    assert objective.features == {"word_starts"}
    assert objective.required_specials == {"mask", "pad", "cls", "sep"}
    assert MLM().features == frozenset() and MLM().required_specials == {"mask", "pad"}
    assert objective.fixed_raw_length == 14 and objective.plan(np.zeros(3))[0].tolist() == [14, 14, 14]
    example, counters = masked(np.arange(5, 19), word_starts=np.ones(14, bool), seq_len=16, whole_word_mask=True,
                               frame=True)
    assert all(isinstance(v, int) for v in counters.values())
    schema = example_schema(objective.family, **objective.schema_kwargs())
    assert schema.fixed_length("input_ids") == schema.fixed_length("labels") == 16
    assert objective.max_sentinels() == 0
    assert objective.params()["whole_word_mask"] is True and objective.params()["max_predictions"] is None


def test_imports_only_numpy_and_stdlib():
    code = (
        "import sys, transforms.objectives.registry;"
        "bad = [m for m in ('apache_beam', 'torch', 'pyarrow', 'tokenizers') if m in sys.modules];"
        "sys.exit(str(bad) if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[3])
