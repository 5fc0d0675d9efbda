"""Tests of T5 span corruption: T5's golden lengths, hand-checked layouts, properties, statistics."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.objectives.common import SpecialIds, example_rng
from transforms.objectives.span_corruption import (
    SPAN_LENGTH_HISTOGRAM_CAP,
    SpanCorruption,
    SpanCorruptionConfig,
    apply_noise_mask,
    encoded_lengths,
    fit_raw_length,
    noise_counts,
    random_spans_helper,
    random_spans_noise_mask,
    raw_length_from_encoded,
    span_corruption,
)

# T5's layout: pad 0, EOS 1, <extra_id_k> = 32099 - k (ids run downward from vocab_size - 1).
EOS = 1
SENTINELS = tuple(32099 - k for k in range(600))
SPECIAL = SpecialIds(vocab_size=32100, pad=0, eos=EOS, unk=2, sentinels=SENTINELS)
X0, X1 = SENTINELS[0], SENTINELS[1]


def reassemble(inputs: np.ndarray, targets: np.ndarray, sentinels: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Interleave the non-noise runs of inputs with the noise runs of targets at the sentinels.

    Returns the reassembled chunk and the sentinels met in inputs, checking that targets
    use the same sentinels in the same order (a plain-Python reading of the layout).
    """
    assert inputs[-1] == EOS and targets[-1] == EOS
    sentinel_set = set(sentinels)
    noise_runs: dict[int, list[int]] = {}
    current = None
    target_order = []
    for token in targets[:-1].tolist():
        if token in sentinel_set:
            current = token
            target_order.append(token)
            noise_runs[token] = []
        else:
            assert current is not None, "targets must start with a sentinel"
            noise_runs[current].append(token)
    chunk: list[int] = []
    input_order = []
    for token in inputs[:-1].tolist():
        if token in sentinel_set:
            input_order.append(token)
            chunk.extend(noise_runs[token])
        else:
            chunk.append(token)
    assert input_order == target_order
    return chunk, input_order


# --- random_spans_helper: T5's table (raw T / targets / spans) ------------------------------------------------

T5_TABLE = [
    # (mu, r, inputs_length, raw, targets, spans), from t5_ul2_seqio.md section 1.3.
    (3, 0.15, 512, 568, 114, 28),
    (3, 0.15, 1024, 1137, 229, 57),
    (3, 0.15, 2048, 2274, 456, 114),
    (8, 0.15, 512, 588, 100, 11),
    (8, 0.15, 1024, 1178, 200, 22),
    (8, 0.15, 2048, 2357, 399, 44),
    (3, 0.5, 512, 766, 512, 128),
    (3, 0.5, 1024, 1534, 1024, 256),
    (3, 0.5, 2048, 3070, 2048, 512),
    (8, 0.5, 512, 908, 512, 57),
    (8, 0.5, 1024, 1818, 1024, 114),
    (8, 0.5, 2048, 3638, 2048, 227),
    (64, 0.15, 512, 600, 92, 1),
    (64, 0.15, 1024, 1200, 184, 3),
    (64, 0.15, 2048, 2401, 367, 6),
    (64, 0.5, 512, 1006, 512, 8),
    (64, 0.5, 1024, 2014, 1024, 16),
    (64, 0.5, 2048, 4030, 2048, 31),
    (32, 0.15, 512, 598, 94, 3),
    (32, 0.15, 1024, 1197, 187, 6),
    (32, 0.15, 2048, 2395, 371, 11),
]


@pytest.mark.parametrize(("mu", "r", "inputs_length", "raw", "targets", "spans"), T5_TABLE)
def test_random_spans_helper_matches_t5_table(mu, r, inputs_length, raw, targets, spans):
    assert random_spans_helper(inputs_length, r, mu) == (raw, targets)
    assert fit_raw_length(inputs_length, r, mu) == raw
    assert noise_counts(raw, r, mu)[1] == spans
    config = SpanCorruptionConfig(inputs_length, r, mu)
    assert config.raw_length == raw
    assert config.targets_length == targets


def test_helper_worked_example_by_hand():
    # T=568: n = round(85.2) = 85, s = round(28.33) = 28 -> inputs 483 + 28 + 1 = 512, targets 85 + 28 + 1 = 114.
    # T=569: n = round(85.35) = 85, s = 28 -> inputs 513 > 512, so 568 is the largest fitting length.
    assert encoded_lengths(568, 0.15, 3.0) == (512, 114)
    assert encoded_lengths(569, 0.15, 3.0) == (513, 114)


def test_helper_half_point_five_hack():
    # (8, .5, 2048): T=3639 gives n = round(1819.5) = 1820 (half to even), s = round(227.5) = 228,
    # inputs 1819 + 228 + 1 = 2048 and targets 2049 > inputs, so T5 steps back to T=3638, targets 2048.
    assert encoded_lengths(3639, 0.5, 8.0) == (2048, 2049)
    assert random_spans_helper(2048, 0.5, 8.0) == (3638, 2048)
    # The hack leaves one slot unused: a full chunk of 3638 really gives 2047 / 2047.
    assert SpanCorruptionConfig(2048, 0.5, 8.0).full_lengths() == (2047, 2047, 227)
    assert SpanCorruption(SpanCorruptionConfig(2048, 0.5, 8.0)).schema_kwargs() == {
        "inputs_length": 2048,
        "targets_length": 2048,
    }


def test_helper_extra_tokens_per_span():
    def inputs_and_targets(raw: int) -> tuple[int, int]:
        n = round(raw * 0.15)
        s = round(n / 3)
        return raw - n + 2 * s + 1, n + 2 * s + 1

    # With two tokens per span on each side, 512 inputs hold fewer raw tokens than 568.
    raw, targets = random_spans_helper(512, 0.15, 3.0, 2, 2)
    assert inputs_and_targets(raw)[0] <= 512 < inputs_and_targets(raw + 1)[0]
    assert targets == inputs_and_targets(raw)[1]
    assert raw < 568


def test_noise_counts_rounding_and_guards():
    assert noise_counts(568, 0.15, 3.0) == (85, 28)
    assert noise_counts(3637, 0.5, 8.0) == (1818, 227)  # 1818.5 rounds half to even
    assert noise_counts(20, 0.5, 4.0) == (10, 2)  # 10 / 4 = 2.5 rounds half to even
    assert noise_counts(10, 0.01, 3.0) == (1, 1)  # at least one noise token and one span
    assert noise_counts(10, 0.8, 1.0) == (8, 2)  # 8 spans capped at the 2 non-noise tokens
    assert noise_counts(2, 0.15, 3.0) == (1, 1)
    assert noise_counts(1, 0.15, 3.0) == (0, 0)  # T5 computes at length 2 and cuts the noise off
    assert noise_counts(0, 0.15, 3.0) == (0, 0)
    assert noise_counts(100, 0.0, 3.0) == (0, 0)


# --- hand-checked layouts --------------------------------------------------------------------------------------


def test_single_span_layout_is_fixed_by_the_counts():
    # L=20, r=.15, mu=3: n = 3, s = 1, so the only mask is 17 clean tokens then 3 noise tokens, whatever the seed.
    tokens = np.arange(100, 120)
    config = SpanCorruptionConfig(inputs_length=32)
    for key in ("a", "b"):
        example = span_corruption(tokens, example_rng(0, key), config, SPECIAL)
        assert example["inputs"].tolist() == [*range(100, 117), X0, EOS]
        assert example["targets"].tolist() == [X0, 117, 118, 119, EOS]
        assert example["inputs"].dtype == np.int32 and example["targets"].dtype == np.int32


def test_alternating_layout_is_fixed_by_the_counts():
    # L=4, r=.5, mu=1: n = 2, s = 2 and 2 clean tokens, so the mask can only be clean, noise, clean, noise.
    example = span_corruption(
        np.array([10, 11, 12, 13]), example_rng(0, "k"), SpanCorruptionConfig(8, 0.5, 1.0), SPECIAL
    )
    assert example["inputs"].tolist() == [10, X0, 12, X1, EOS]
    assert example["targets"].tolist() == [X0, 11, X1, 13, EOS]


def test_seeded_golden():
    # L=12, r=.25, mu=1.5: n = 3 noise tokens in s = 2 spans, 9 clean tokens in 2 runs.
    rng = example_rng(0, "k")
    # The mask draws the noise composition first: one cut among the 2 gaps of 3 noise tokens,
    # then one cut among the 8 gaps of the 9 clean tokens.
    assert rng.choice(2, size=1, replace=False, shuffle=False).tolist() == [0]  # noise runs [1, 2]
    assert rng.choice(8, size=1, replace=False, shuffle=False).tolist() == [5]  # clean runs [6, 3]
    mask = random_spans_noise_mask(12, 0.25, 1.5, example_rng(0, "k"))
    # clean 100..105, noise 106, clean 107..109, noise 110 111
    assert mask.astype(int).tolist() == [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1]
    example = span_corruption(np.arange(100, 112), example_rng(0, "k"), SpanCorruptionConfig(16, 0.25, 1.5), SPECIAL)
    assert example["inputs"].tolist() == [100, 101, 102, 103, 104, 105, X0, 107, 108, 109, X1, EOS]
    assert example["targets"].tolist() == [X0, 106, X1, 110, 111, EOS]


def test_capped_spans_keep_every_clean_run_non_empty():
    # L=10, r=.8, mu=1: T5 would ask for 8 spans with only 2 clean tokens; the cap gives 2 spans.
    tokens = np.arange(50, 60)
    example = span_corruption(tokens, example_rng(1, "cap"), SpanCorruptionConfig(8, 0.8, 1.0), SPECIAL)
    inputs = example["inputs"].tolist()
    assert len(inputs) == 5 and inputs[0] == 50 and inputs[1] == X0 and inputs[3] == X1 and inputs[4] == EOS
    chunk, _ = reassemble(example["inputs"], example["targets"], SENTINELS)
    assert chunk == tokens.tolist()


@pytest.mark.parametrize(
    ("tokens", "inputs", "targets"),
    [
        ([], [EOS], [EOS]),
        ([7], [7, EOS], [EOS]),  # T5: mask computed at length 2 ([clean, noise]) and cut to [clean]
        ([7, 8], [7, X0, EOS], [X0, 8, EOS]),
    ],
)
def test_tiny_chunks_like_t5(tokens, inputs, targets):
    example = span_corruption(np.array(tokens, dtype=np.int32), example_rng(0, "t"), SpanCorruptionConfig(), SPECIAL)
    assert example["inputs"].tolist() == inputs
    assert example["targets"].tolist() == targets


def test_apply_noise_mask_general_mask():
    tokens = np.array([5, 6, 7, 8, 9, 10])
    mask = np.array([True, True, False, True, False, False])
    inputs, targets = apply_noise_mask(tokens, mask, np.array([90, 91]), EOS)
    assert inputs.tolist() == [90, 7, 91, 9, 10, EOS]
    assert targets.tolist() == [90, 5, 6, 91, 8, EOS]


# --- validation and errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"inputs_length": 2}, "inputs_length"),
        ({"inputs_length": 512.0}, "inputs_length"),
        ({"noise_density": 0.0}, "noise_density"),
        ({"noise_density": 1.0}, "noise_density"),
        ({"noise_density": -0.1}, "noise_density"),
        ({"mean_noise_span_length": 0.5}, "mean_noise_span_length"),
    ],
)
def test_config_validation_names_field_and_value(kwargs, field):
    with pytest.raises(ValueError, match=field) as info:
        SpanCorruptionConfig(**kwargs)
    assert repr(next(iter(kwargs.values()))) in str(info.value)


def test_helper_and_mask_reject_bad_arguments():
    with pytest.raises(ValueError, match="inputs_length"):
        random_spans_helper(1, 0.15, 3.0)
    with pytest.raises(ValueError, match="noise_density"):
        random_spans_noise_mask(10, 1.5, 3.0, example_rng(0, "x"))
    with pytest.raises(ValueError, match="length"):
        noise_counts(-1, 0.15, 3.0)


def test_not_enough_sentinels_is_a_clear_error():
    few = SpecialIds(vocab_size=32100, pad=0, eos=EOS, sentinels=SENTINELS[:10])
    with pytest.raises(ValueError, match=r"needs 28 sentinel ids .* provides 10"):
        span_corruption(np.arange(3, 571), example_rng(0, "k"), SpanCorruptionConfig(), few)


def test_objective_rejects_too_long_chunk():
    with pytest.raises(ValueError, match="raw_length 568"):
        SpanCorruption().build(np.arange(3, 572), example_rng(0, "k"), 0, SPECIAL, {})


# --- the Objective -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("mu", "r", "inputs_length", "raw", "targets", "spans"), T5_TABLE[:4] + T5_TABLE[6:7])
def test_full_chunk_fills_both_budgets_exactly(mu, r, inputs_length, raw, targets, spans):
    objective = SpanCorruption(SpanCorruptionConfig(inputs_length, r, mu))
    assert objective.plan_chunk(example_rng(0, "p")) == (raw, 0)
    assert objective.schema_kwargs() == {"inputs_length": inputs_length, "targets_length": targets}
    assert objective.max_sentinels() == spans
    tokens = np.random.default_rng(0).integers(3, 31000, size=raw)
    example = objective.build(tokens, example_rng(0, "full"), 0, SPECIAL, {})
    assert len(example["inputs"]) == inputs_length
    assert len(example["targets"]) == targets
    counters = objective.stats(example)
    assert counters == {
        "examples": 1,
        "partial_examples": 0,
        "raw_tokens": raw,
        "noise_tokens": round(raw * r),
        "noise_spans": spans,
        "inputs_tokens": inputs_length,
        "targets_tokens": targets,
    }


def test_x_denoiser_full_chunk():
    objective = SpanCorruption(SpanCorruptionConfig(512, 0.5, 64.0))
    example = objective.build(np.arange(3, 3 + 1006), example_rng(0, "x"), 0, SPECIAL, {})
    assert (len(example["inputs"]), len(example["targets"]), objective.max_sentinels()) == (512, 512, 8)


def test_partial_chunk_is_shorter_and_counted():
    objective = SpanCorruption()
    tokens = np.arange(3, 103)
    example = objective.build(tokens, example_rng(0, "tail"), 0, SPECIAL, {})
    # 100 tokens: n = 15, s = 5 -> inputs 85 + 5 + 1, targets 15 + 5 + 1; the writer pads them to 512 / 114.
    assert (len(example["inputs"]), len(example["targets"])) == (91, 21)
    counters = objective.stats(example, SPECIAL)
    assert counters["partial_examples"] == 1 and counters["raw_tokens"] == 100
    assert counters["noise_tokens"] == 15 and counters["noise_spans"] == 5
    assert sum(v for k, v in counters.items() if k.startswith("span_len_hist_")) == 5
    assert reassemble(example["inputs"], example["targets"], SENTINELS)[0] == tokens.tolist()


def test_params_and_protocol_attributes():
    objective = SpanCorruption()
    assert (objective.name, objective.family) == ("span_corruption", "seq2seq")
    assert {"eos", "sentinels"} <= objective.required_specials
    assert objective.params()["raw_length"] == 568
    example = objective.build(np.arange(3, 571), example_rng(0, "q"), 0, SPECIAL, {})
    assert all(type(value) is int for value in objective.stats(example, SPECIAL).values())


def test_raw_length_from_encoded_rejects_foreign_lengths():
    with pytest.raises(ValueError, match="no raw length"):
        raw_length_from_encoded(512, 113, 0.15, 3.0, 568)


# --- properties --------------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(0, 400),
    noise_density=st.floats(0.01, 0.95),
    mean_noise_span_length=st.floats(1.0, 12.0),
    seed=st.integers(0, 2**32),
)
def test_inputs_and_targets_give_back_the_chunk(length, noise_density, mean_noise_span_length, seed):
    tokens = np.random.default_rng(seed).integers(3, 31000, size=length)
    config = SpanCorruptionConfig(3, noise_density, mean_noise_span_length)
    example = span_corruption(tokens, example_rng(seed, "prop"), config, SPECIAL)
    inputs, targets = example["inputs"], example["targets"]
    chunk, used = reassemble(inputs, targets, SENTINELS)
    assert chunk == tokens.tolist()
    num_noise, num_spans = noise_counts(length, noise_density, mean_noise_span_length)
    # Sentinels are <extra_id_0>, <extra_id_1>, ... in order, each used once, nowhere else; EOS only at the end.
    assert used == list(SENTINELS[:num_spans])
    assert np.isin(inputs, SENTINELS).sum() == num_spans == np.isin(targets, SENTINELS).sum()
    assert EOS not in inputs[:-1].tolist() and EOS not in targets[:-1].tolist()
    assert (len(inputs), len(targets)) == encoded_lengths(length, noise_density, mean_noise_span_length)
    assert len(targets) - 1 - num_spans == num_noise
    if num_spans:
        # non-noise first, noise last, every run non-empty: no sentinel first or adjacent in inputs,
        # a sentinel just before EOS; in targets a sentinel first and never two in a row.
        is_sentinel = np.isin(inputs[:-1], SENTINELS)
        assert not is_sentinel[0] and is_sentinel[-1] and not (is_sentinel[1:] & is_sentinel[:-1]).any()
        in_targets = np.isin(targets[:-1], SENTINELS)
        assert in_targets[0] and not in_targets[-1] and not (in_targets[1:] & in_targets[:-1]).any()


@settings(max_examples=150, deadline=None)
@given(
    inputs_length=st.integers(3, 2048),
    noise_density=st.floats(0.01, 0.95),
    mean_noise_span_length=st.floats(1.0, 64.0),
    fraction=st.floats(0.0, 1.0),
)
def test_lengths_never_exceed_budgets(inputs_length, noise_density, mean_noise_span_length, fraction):
    config = SpanCorruptionConfig(inputs_length, noise_density, mean_noise_span_length)
    raw = config.raw_length
    assert raw >= 2
    length = round(raw * fraction)
    inputs, targets = encoded_lengths(length, noise_density, mean_noise_span_length)
    assert inputs <= config.inputs_length and targets <= config.targets_length
    assert raw_length_from_encoded(inputs, targets, noise_density, mean_noise_span_length, raw) == length


# --- statistics over many examples ------------------------------------------------------------------------------


def _uniform_composition_part_pmf(total: int, parts: int) -> np.ndarray:
    """P(a given part = j) for a uniformly random composition of ``total`` into ``parts`` positive parts."""
    return np.array([comb(total - j - 1, parts - 2) / comb(total - 1, parts - 1) for j in range(1, total - parts + 2)])


def test_statistics_of_10000_t5_examples():
    objective = SpanCorruption()
    totals: dict[str, int] = {}
    first_clean_run = []
    base = np.arange(3, 571, dtype=np.int32)
    for i in range(10_000):
        example = objective.build(base, example_rng(7, f"ex{i}"), 0, SPECIAL, {})
        for name, value in objective.stats(example, SPECIAL).items():
            totals[name] = totals.get(name, 0) + value
        first_clean_run.append(int(np.argmax(np.isin(example["inputs"], SENTINELS))))
    assert totals["examples"] == 10_000
    # Measured as the manifest does: noise density and mean span length from integer counters.
    assert abs(totals["noise_tokens"] / totals["raw_tokens"] - 0.15) < 0.005
    mean_span = totals["noise_tokens"] / totals["noise_spans"]
    assert abs(mean_span - 85 / 28) / (85 / 28) < 0.05 and abs(mean_span - 3.0) / 3.0 < 0.05
    histogram = {int(k.rsplit("_", 1)[1]): v for k, v in totals.items() if k.startswith("span_len_hist_")}
    assert max(histogram) < SPAN_LENGTH_HISTOGRAM_CAP
    assert sum(histogram.values()) == totals["noise_spans"] == 28 * 10_000
    assert sum(k * v for k, v in histogram.items()) == totals["noise_tokens"]
    # Every composition equally likely: span lengths follow the exact part distribution of 85 into 28.
    pmf = _uniform_composition_part_pmf(85, 28)
    empirical = np.zeros_like(pmf)
    for k, v in histogram.items():
        empirical[k - 1] = v / totals["noise_spans"]
    assert 0.5 * np.abs(empirical - pmf).sum() < 0.01
    # The first clean run is a part of 483 into 28: mean 483 / 28.
    assert abs(np.mean(first_clean_run) - 483 / 28) / (483 / 28) < 0.05


def test_noise_is_spread_evenly_over_positions():
    masks = np.stack([random_spans_noise_mask(568, 0.15, 3.0, example_rng(3, f"m{i}")) for i in range(10_000)])
    assert (masks.sum(axis=1) == 85).all()
    assert not masks[:, 0].any() and masks[:, -1].all()  # clean first, noise last, as T5
    middle = masks[:, 50:-50].mean(axis=0)
    # The last span is pinned to the end, so the interior rate sits ~.0034 below 85/568 (T5 alike).
    assert abs(middle.mean() - 85 / 568) < 0.005
    assert np.abs(middle - middle.mean()).max() < 0.015  # flat: per-position sd is ~.0035


def test_density_over_partial_lengths():
    rng = np.random.default_rng(11)
    lengths = rng.integers(2, 569, size=10_000)
    noise = 0
    for i, length in enumerate(lengths):
        mask = random_spans_noise_mask(int(length), 0.15, 3.0, example_rng(5, f"p{i}"))
        assert mask.sum() == min(max(round(length * 0.15), 1), length - 1)
        noise += int(mask.sum())
    expected = sum(min(max(round(length * 0.15), 1), length - 1) for length in lengths.tolist())
    assert noise == expected
    assert abs(noise / lengths.sum() - 0.15) < 0.005


# --- the block path -------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    inputs_length=st.sampled_from([8, 64, 512]),
    noise=st.sampled_from([(0.15, 3.0), (0.5, 3.0), (0.15, 8.0), (0.5, 64.0)]),
    rows=st.lists(st.tuples(st.floats(0.0, 1.0), st.booleans()), max_size=10),
    seed=st.integers(0, 2**32 - 1),
)
def test_build_many_equals_build_stats_and_padding_row_by_row(inputs_length, noise, rows, seed):
    """Full and short chunks (padded rows, partial examples), some with sentinel ids among their
    tokens: the padded columns and the counters (with padding_tokens) of one at a time."""
    from schemas.examples import example_schema
    from transforms.objectives.common import example_rngs
    from transforms.objectives.counters import add_counters
    from transforms.objectives.packing import Piece
    from transforms.shard_format import ExampleColumns

    objective = SpanCorruption(SpanCorruptionConfig(inputs_length, *noise))
    rng = np.random.default_rng(seed)
    pieces, keys = [], []
    for index, (fraction, with_sentinels) in enumerate(rows):
        length = max(1, int(objective.raw_length * fraction))
        tokens = rng.integers(3, 32000, length).astype(np.int32)
        if with_sentinels:
            tokens[rng.random(length) < 0.1] = SENTINELS[0]
        pieces.append(Piece(tokens, np.array([length], np.int32)))
        keys.append(f"k{index}")
    arrays, scalars, strings, counters = objective.build_many(pieces, [0] * len(keys), example_rngs(4, keys), SPECIAL)
    assert scalars == {} and strings == {}
    schema = example_schema(objective.family, **objective.schema_kwargs())
    examples, summed = [], {}
    for piece, key in zip(pieces, keys):
        example = objective.build(piece.tokens, example_rng(4, key), 0, SPECIAL, {})
        add_counters(summed, objective.stats(example, SPECIAL))
        padded = {"key": key}
        for name, width in (("inputs", objective.inputs_length), ("targets", objective.targets_length)):
            values = np.full(width, SPECIAL.pad, dtype=np.int32)
            values[: len(example[name])] = example[name]
            if width > len(example[name]):
                summed["padding_tokens"] = summed.get("padding_tokens", 0) + width - len(example[name])
            padded[name] = values
        examples.append(padded)
    expected = ExampleColumns.from_examples(examples, schema)
    got = ExampleColumns(schema, len(keys), arrays, {}, {"key": keys})
    assert got.encode() == expected.encode()
    assert counters == summed
