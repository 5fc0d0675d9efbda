"""Tests of the UL2 mixture of denoisers: presets, budgets, layouts, mixture shares."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.objectives.common import SpecialIds, example_rng
from transforms.objectives.span_corruption import noise_counts
from transforms.objectives.ul2 import PRESETS, UL2, Denoiser, UL2Config, denoiser_lengths, parse_mixture

PAD, EOS = 0, 1
SENTINELS = tuple(32099 - k for k in range(200))
MODES = {"[R]": 32200, "[S]": 32201, "[X]": 32202, "[NLU]": 32203, "[NLG]": 32204, "[S2S]": 32205}
SPECIAL = SpecialIds(vocab_size=32206, pad=PAD, eos=EOS, sentinels=SENTINELS, mode_tokens=MODES)
RESERVED = set(SENTINELS) | set(MODES.values()) | {PAD, EOS}

DEFAULT = UL2()
DECODER = UL2(UL2Config(layout="decoder"))


def reassemble(inputs: list[int], targets: list[int]) -> list[int]:
    """Chunk from span-corrupted inputs/targets (mode token and EOS already removed)."""
    runs: dict[int, list[int]] = {}
    for token in targets:
        if token in SENTINELS:
            current = runs.setdefault(token, [])
        else:
            current.append(token)
    chunk: list[int] = []
    for token in inputs:
        chunk.extend(runs[token] if token in SENTINELS else [token])
    return chunk


def check_example(objective: UL2, plan: int, tokens: np.ndarray, example: dict) -> tuple[list[int], list[int]]:
    """Check one example against the layout and the budgets; return its (inputs, targets)."""
    denoiser, lengths = objective.denoisers[plan], objective.lengths[plan]
    assert example["denoiser"] == denoiser.name
    if objective.config.layout == "decoder":
        row = example["input_ids"]
        total = int(example["doc_lengths"].sum())
        assert row.dtype == np.int32 and len(row) == objective.seq_len and total <= objective.seq_len
        assert (row[total:] == PAD).all()
        inputs, targets = row[: example["prefix_length"]].tolist(), row[example["prefix_length"] : total].tolist()
    else:
        assert example["inputs"].dtype == np.int32 and example["targets"].dtype == np.int32
        inputs, targets = example["inputs"].tolist(), example["targets"].tolist()
    assert len(inputs) <= lengths.max_inputs <= objective.config.inputs_length
    assert len(targets) <= lengths.max_targets
    # The mode token comes first and nowhere else; EOS ends both parts.
    assert inputs[0] == MODES[denoiser.mode_token] and inputs[-1] == EOS and targets[-1] == EOS
    body, target_body = inputs[1:-1], targets[:-1]
    assert not set(body + target_body) & set(MODES.values())
    if denoiser.kind == "span":
        num_noise, num_spans = noise_counts(len(tokens), denoiser.noise_density, denoiser.mean_noise_span_length)
        used = [token for token in body if token in SENTINELS]
        assert used == list(SENTINELS[:num_spans]) == [token for token in target_body if token in SENTINELS]
        assert len(target_body) == num_noise + num_spans
        assert reassemble(body, target_body) == tokens.tolist()
    else:
        assert not set(body + target_body) & set(SENTINELS)
        assert body + target_body == tokens.tolist()
        assert len(body) >= min(1, len(tokens)) and len(target_body) >= min(1, len(tokens) - 1)
    return inputs, targets


# --- presets and lengths ------------------------------------------------------------------------------------------


def test_default_preset_weights_and_tokens():
    mixture = PRESETS["default"]
    shares: dict[str, float] = {}
    for denoiser in mixture:
        shares[denoiser.mode_token] = shares.get(denoiser.mode_token, 0) + denoiser.weight
    assert shares == {"[R]": 0.5, "[S]": 0.25, "[X]": 0.25}
    spans = {(d.mean_noise_span_length, d.noise_density) for d in mixture if d.kind == "span"}
    assert spans == {(3, 0.15), (8, 0.15), (3, 0.5), (8, 0.5), (64, 0.15), (64, 0.5)}
    assert [d.kind for d in mixture if d.mode_token == "[S]"] == ["prefix"]
    assert mixture[0].name == "R(mu=3,r=0.15)" and mixture[-1].name == "X(mu=64,r=0.5)"
    assert DEFAULT.mode_tokens == ("[R]", "[S]", "[X]")


def test_paper_preset_is_seven_uniform_denoisers():
    mixture = parse_mixture("paper")
    assert len(mixture) == 7 and len({d.weight for d in mixture}) == 1
    tokens = {d.name: d.mode_token for d in mixture}
    assert tokens["R(mu=3,r=0.15)"] == tokens["R(mu=8,r=0.15)"] == "[NLU]"
    assert {tokens[n] for n in tokens if n.startswith("X")} == {"[NLG]"}
    assert tokens["S"] == "[S2S]"


def test_lengths_at_512_count_the_mode_token():
    by_name = {d.name: lengths for d, lengths in zip(DEFAULT.denoisers, DEFAULT.lengths, strict=True)}
    # Span denoisers size their chunk for 511 tokens (T5 helper at I - 1), then the mode token makes 512.
    assert (by_name["R(mu=3,r=0.15)"].raw_length, by_name["R(mu=3,r=0.15)"].max_targets) == (567, 114)
    assert by_name["R(mu=3,r=0.15)"].max_inputs == 512
    assert (by_name["X(mu=3,r=0.5)"].raw_length, by_name["X(mu=3,r=0.5)"].max_spans) == (765, 127)
    assert (by_name["X(mu=64,r=0.5)"].raw_length, by_name["X(mu=64,r=0.5)"].max_targets) == (1004, 511)
    # S: 511 raw tokens; [S] + prefix + </s> <= 512, suffix + </s> <= 511, total always 514.
    s = by_name["S"]
    assert (s.raw_length, s.max_inputs, s.max_targets, s.max_total) == (511, 512, 511, 514)
    assert DEFAULT.max_sentinels() == 127
    assert DEFAULT.schema_kwargs() == {"inputs_length": None, "targets_length": None, "denoiser": True}
    assert DEFAULT.family == "seq2seq" and DECODER.family == "decoder"
    # Decoder rows hold the longest inputs + targets: 512 + 511 (X(mu=8,r=0.5) and X(mu=64,r=0.5)).
    assert DECODER.seq_len == 1023
    assert DECODER.schema_kwargs() == {"seq_len": 1023, "prefix_length": True, "denoiser": True}


@pytest.mark.parametrize("plan", range(7))
def test_full_chunk_of_each_denoiser(plan):
    lengths = DEFAULT.lengths[plan]
    tokens = np.random.default_rng(plan).integers(3, 31000, size=lengths.raw_length)
    example = DEFAULT.build(tokens, example_rng(0, f"full{plan}"), plan, SPECIAL, {})
    inputs, targets = check_example(DEFAULT, plan, tokens, example)
    if DEFAULT.denoisers[plan].kind == "span":
        assert (len(inputs), len(targets)) == (512, lengths.max_targets)
    else:
        assert len(inputs) + len(targets) == 514
    counters = DEFAULT.stats(example)
    name = DEFAULT.denoisers[plan].name
    assert counters["examples"] == counters[f"denoiser/{name}/examples"] == 1
    assert counters["raw_tokens"] == counters[f"denoiser/{name}/raw_tokens"] == lengths.raw_length
    assert all(type(value) is int for value in counters.values())


def test_golden_s_denoiser():
    # S on 6 tokens: suffix length = integers(1, 6) (U[1, 5]); [S] prefix </s> | suffix </s>.
    objective = UL2(UL2Config(inputs_length=7, mixture=[{"mode_token": "[S]", "kind": "prefix"}]))
    assert objective.lengths[0].raw_length == 6
    suffix = int(example_rng(0, "s").integers(1, 6))
    example = objective.build(np.arange(10, 16), example_rng(0, "s"), 0, SPECIAL, {})
    split = 6 - suffix
    assert example["inputs"].tolist() == [MODES["[S]"], *range(10, 10 + split), EOS]
    assert example["targets"].tolist() == [*range(10 + split, 16), EOS]
    assert example["denoiser"] == "S"


def test_golden_span_denoiser_single_span():
    # R(mu=3, r=.15) at inputs 22: the chunk is sized for 21 inputs. T5's helper: T=22 gives
    # n = round(3.3) = 3, s = 1, inputs 22 - 3 + 1 + 1 = 21; T=23 gives n = round(3.45) = 3 and 22 > 21.
    # So 22 raw tokens: 19 clean tokens then one 3-token span at the end, and [R] makes 22 inputs.
    objective = UL2(
        UL2Config(
            inputs_length=22,
            mixture=[{"mode_token": "[R]", "mean_noise_span_length": 3, "noise_density": 0.15}],
        )
    )
    assert objective.denoisers[0].name == "R(mu=3,r=0.15)"
    assert objective.lengths[0].raw_length == 22
    example = objective.build(np.arange(100, 122), example_rng(0, "r"), 0, SPECIAL, {})
    assert example["inputs"].tolist() == [MODES["[R]"], *range(100, 119), SENTINELS[0], EOS]
    assert example["targets"].tolist() == [SENTINELS[0], 119, 120, 121, EOS]
    assert len(example["inputs"]) == 22


def test_decoder_layout_concatenates_and_pads():
    tokens = np.arange(3, 3 + DEFAULT.lengths[0].raw_length)
    encoder_decoder = DEFAULT.build(tokens, example_rng(4, "same"), 0, SPECIAL, {})
    decoder = DECODER.build(tokens, example_rng(4, "same"), 0, SPECIAL, {})
    joined = encoder_decoder["inputs"].tolist() + encoder_decoder["targets"].tolist()
    assert decoder["prefix_length"] == 512
    assert decoder["doc_lengths"].tolist() == [len(joined)] == [626]
    assert decoder["input_ids"].tolist() == joined + [PAD] * (1023 - 626)
    counters = DECODER.stats(decoder)
    assert counters.pop("padding_tokens") == 1023 - 626
    assert counters == DEFAULT.stats(encoder_decoder)


# --- custom mixtures and validation --------------------------------------------------------------------------------


def test_custom_mixture_from_dicts():
    config = UL2Config(
        inputs_length=128,
        mixture=[
            {"mode_token": "[R]", "mean_noise_span_length": 3, "noise_density": 0.15, "weight": 3},
            {"name": "long", "mode_token": "[X]", "mean_noise_span_length": 32, "noise_density": 0.5},
            {"mode_token": "[S]", "kind": "prefix"},
        ],
    )
    assert [d.name for d in config.mixture] == ["R(mu=3,r=0.15)", "long", "S"]
    assert config.mixture[0] == Denoiser("R(mu=3,r=0.15)", "[R]", "span", 3, 0.15, 3)
    assert Denoiser.from_dict(config.mixture[1].to_dict()) == config.mixture[1]
    assert parse_mixture(list(config.mixture)) == config.mixture
    assert UL2(config).params()["mixture"][0]["raw_length"] == denoiser_lengths(config.mixture[0], 128, None).raw_length


@pytest.mark.parametrize(
    ("mixture", "message"),
    [
        ("nope", "unknown UL2 mixture preset 'nope'"),
        ([], "non-empty list"),
        ({"mode_token": "[R]"}, "non-empty list"),
        ([{"mode_token": "[R]", "mu": 3}], r"unknown denoiser keys \['mu'\]"),
        ([{"kind": "prefix"}], "needs a mode_token"),
        ([{"mode_token": "[S]", "kind": "suffix"}], "kind must be one of .* got 'suffix'"),
        ([{"mode_token": "[S]", "kind": "prefix", "weight": 0}], "weight must be .* got 0"),
        ([{"mode_token": "[S]", "kind": "prefix", "noise_density": 0.5}], "noise_density is not used .* got 0.5"),
        (
            [{"mode_token": "[R]", "mean_noise_span_length": 0.5, "noise_density": 0.15}],
            "mean_noise_span_length .* 0.5",
        ),
        ([{"mode_token": "[R]", "mean_noise_span_length": 3, "noise_density": 1.0}], "noise_density .* got 1.0"),
        ([{"mode_token": "[R]", "mean_noise_span_length": 3}], "noise_density .* got None"),
        ([{"mode_token": "[S]", "kind": "prefix"}, {"mode_token": "[S]", "kind": "prefix"}], r"duplicates \['S'\]"),
    ],
)
def test_bad_mixtures(mixture, message):
    with pytest.raises(ValueError, match=message):
        UL2Config(mixture=mixture)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"inputs_length": 3}, "inputs_length must be an int >= 4, got 3"),
        ({"targets_length": 1}, "targets_length must be None or an int >= 2, got 1"),
        ({"layout": "encoder"}, "layout must be one of .* got 'encoder'"),
        ({"targets_length": 114}, r"targets_length 114 is too small for denoiser 'X\(mu=3,r=0.5\)', which needs 510"),
    ],
)
def test_bad_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        UL2Config(**kwargs)


def test_targets_budget_caps_the_s_suffix():
    config = UL2Config(
        inputs_length=64,
        targets_length=16,
        mixture=[
            {"mode_token": "[S]", "kind": "prefix"},
            {"mode_token": "[R]", "mean_noise_span_length": 3, "noise_density": 0.15},
        ],
    )
    objective = UL2(config)
    assert objective.lengths[0].max_suffix == 15 and objective.lengths[1].max_targets <= 16
    suffixes = []
    for i in range(3000):
        example = objective.build(np.arange(3, 66), example_rng(0, f"cap{i}"), 0, SPECIAL, {})
        check_example(objective, 0, np.arange(3, 66), example)
        suffixes.append(len(example["targets"]) - 1)
    assert min(suffixes) == 1 and max(suffixes) == 15


def test_runtime_errors():
    tokens = np.arange(3, 3 + 567)
    with pytest.raises(ValueError, match="mode token '\\[R\\]'"):
        DEFAULT.build(
            tokens, example_rng(0, "e"), 0, SpecialIds(vocab_size=32100, pad=0, eos=1, sentinels=SENTINELS), {}
        )
    with pytest.raises(ValueError, match="denoiser index in \\[0, 7\\), got 7"):
        DEFAULT.build(tokens, example_rng(0, "e"), 7, SPECIAL, {})
    with pytest.raises(ValueError, match="at most 567 tokens"):
        DEFAULT.build(np.arange(3, 3 + 568), example_rng(0, "e"), 0, SPECIAL, {})
    few = SpecialIds(vocab_size=32206, pad=0, eos=1, sentinels=SENTINELS[:100], mode_tokens=MODES)
    with pytest.raises(ValueError, match="needs 127 sentinel ids"):
        DEFAULT.build(np.arange(3, 3 + 765), example_rng(0, "e"), 3, few, {})


# --- properties and statistics ---------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    plan=st.integers(0, 6),
    fraction=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32),
    decoder=st.booleans(),
)
def test_any_chunk_fits_its_budget(plan, fraction, seed, decoder):
    objective = DECODER if decoder else DEFAULT
    length = round(objective.lengths[plan].raw_length * fraction)
    tokens = np.random.default_rng(seed).integers(3, 31000, size=length)
    example = objective.build(tokens, example_rng(seed, "prop"), plan, SPECIAL, {})
    check_example(objective, plan, tokens, example)
    assert objective.stats(example)["raw_tokens"] == length


@pytest.mark.parametrize("preset", ["default", "paper"])
def test_mixture_shares_by_example(preset):
    objective = UL2(UL2Config(mixture=preset))
    weights = np.array([d.weight for d in objective.denoisers])
    plans = [objective.plan_chunk(example_rng(9, f"chunk{i}"))[1] for i in range(40_000)]
    shares = np.bincount(plans, minlength=len(weights)) / len(plans)
    assert np.abs(shares - weights / weights.sum()).max() < 0.01


def test_statistics_of_10000_ul2_examples():
    totals: dict[str, int] = {}
    base = np.arange(3, 3 + 1004, dtype=np.int32)
    for i in range(10_000):
        rng = example_rng(13, f"ul2-{i}")
        raw_length, plan = DEFAULT.plan_chunk(rng)
        example = DEFAULT.build(base[:raw_length], rng, plan, SPECIAL, {})
        for name, value in DEFAULT.stats(example).items():
            totals[name] = totals.get(name, 0) + value
    assert totals["examples"] == 10_000
    weights = np.array([d.weight for d in DEFAULT.denoisers])
    for denoiser, weight in zip(DEFAULT.denoisers, weights / weights.sum(), strict=True):
        prefix = f"denoiser/{denoiser.name}/"
        examples = totals[prefix + "examples"]
        assert abs(examples / 10_000 - weight) < 0.01
        density = totals[prefix + "noise_tokens"] / totals[prefix + "raw_tokens"]
        if denoiser.kind == "span":
            assert abs(density - denoiser.noise_density) < 0.005
            raw = DEFAULT.lengths[DEFAULT.denoisers.index(denoiser)].raw_length
            num_noise, num_spans = noise_counts(raw, denoiser.noise_density, denoiser.mean_noise_span_length)
            mean_span = totals[prefix + "noise_tokens"] / totals[prefix + "noise_spans"]
            assert abs(mean_span - num_noise / num_spans) / (num_noise / num_spans) < 0.05
        else:
            # S: suffix ~ U[1, 510] of 511 raw tokens, so about half the chunk goes to the targets.
            assert abs(density - 255.5 / 511) < 0.02
    assert sum(totals[f"denoiser/{d.name}/raw_tokens"] for d in DEFAULT.denoisers) == totals["raw_tokens"]


@pytest.mark.parametrize("preset", ["default", "paper"])
def test_planning_in_blocks_equals_planning_each_chunk(preset):
    """The packer plans UL2 chunks in blocks from worked-out first draws; the plans and
    lengths are those of plan_chunk with each chunk's own plan generator."""
    from transforms.objectives.layout import plan_rng
    from transforms.pack import _Planner

    objective = UL2(UL2Config(mixture=preset))
    planner = _Planner(objective, 17, "train-b00003")
    lengths = [planner(index) for index in range(700)]  # crosses blocks of 128, 128, 256, 512
    expected = [objective.plan_chunk(plan_rng(17, planner.key(index))) for index in range(700)]
    assert list(zip(lengths, planner.plans)) == expected
    assert len(set(planner.plans)) == len(objective.denoisers)
    # Knowing the tokens to cut: a first block of 32, then blocks sized to what is left; the
    # same plans, and not many more planned than the chunks that fit.
    total = sum(lengths[:500]) + 1
    sized = _Planner(objective, 17, "train-b00003", total=total)
    cut = 0
    while True:
        length = sized(len(sized.plans))
        if cut + length > total:
            break
        cut += length
    assert list(zip(lengths, planner.plans))[: len(sized.plans)] == list(
        zip([length for length, _ in expected], sized.plans))
    assert len(sized.plans) == 501
    assert 501 <= len(sized._planned) <= 1.1 * 501 + 80


# --- the block path -------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    preset=st.sampled_from(["default", "paper"]),
    layout=st.sampled_from(["encoder_decoder", "decoder"]),
    inputs_length=st.sampled_from([16, 64, 512]),
    rows=st.lists(st.tuples(st.integers(0, 6), st.floats(0.0, 1.0), st.booleans()), min_size=0, max_size=10),
    seed=st.integers(0, 2**32 - 1),
)
def test_build_many_equals_build_and_stats_row_by_row(preset, layout, inputs_length, rows, seed):
    """Full and short chunks of every denoiser, some with sentinel ids among their tokens (the
    loader may hand raw ids): the rows, the columns and the summed counters of one at a time."""
    from schemas.examples import example_schema
    from transforms.objectives.common import example_rngs
    from transforms.objectives.counters import add_counters
    from transforms.objectives.packing import Piece
    from transforms.shard_format import ExampleColumns

    objective = UL2(UL2Config(inputs_length=inputs_length, mixture=preset, layout=layout))
    rng = np.random.default_rng(seed)
    pieces, plans, keys = [], [], []
    for index, (plan, fraction, with_sentinels) in enumerate(rows):
        plan %= len(objective.denoisers)
        length = max(1, int(objective.lengths[plan].raw_length * fraction))
        tokens = rng.integers(2, 32000, length).astype(np.int32)
        if with_sentinels:
            tokens[rng.random(length) < 0.1] = SENTINELS[0]
        pieces.append(Piece(tokens, np.array([length], np.int32)))
        plans.append(plan)
        keys.append(f"k{index}")
    arrays, scalars, strings, counters = objective.build_many(pieces, plans, example_rngs(4, keys), SPECIAL)
    schema = example_schema(objective.family, **objective.schema_kwargs())
    got = ExampleColumns(schema, len(keys), arrays, scalars, {"key": keys, **strings})
    examples, summed = [], {}
    for piece, plan, key in zip(pieces, plans, keys):
        example = objective.build(piece.tokens, example_rng(4, key), plan, SPECIAL, {})
        add_counters(summed, objective.stats(example, SPECIAL))
        examples.append({**example, "key": key})
    expected = ExampleColumns.from_examples(examples, schema)
    assert got.encode() == expected.encode()
    for name, (flat, offsets) in got.arrays.items():
        assert flat.dtype == np.int32 and offsets.dtype == np.int64, name
    assert counters == summed


def test_build_many_refuses_an_unknown_plan():
    from transforms.objectives.common import example_rngs
    from transforms.objectives.packing import Piece

    with pytest.raises(ValueError, match=r"denoiser index in \[0, 7\), got 7"):
        DEFAULT.build_many([Piece(np.arange(2, 40, dtype=np.int32), np.array([38]))], [7], example_rngs(0, ["k"]),
                           SPECIAL)
