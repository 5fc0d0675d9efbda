"""Tests of the UL2 mixture of denoisers: presets, budgets, layouts, the planned mixture shares,
and every row of a block against its denoiser applied alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from objective_oracles import assert_fits

from transforms.objectives.base import Block, build_example
from transforms.objectives.common import SpecialIds
from transforms.objectives.layout import example_digests, example_randoms, plan_uniforms
from transforms.objectives.span_corruption import SpanCorruption, SpanCorruptionConfig
from transforms.objectives.spans import noise_counts
from transforms.objectives.ul2 import SUFFIX_STREAM, UL2, UL2Config
from transforms.objectives.ul2_mixture import PRESETS, Denoiser, denoiser_lengths, parse_mixture

PAD, EOS = 0, 1
SENTINELS = tuple(32099 - k for k in range(200))
MODES = {"[R]": 32200, "[S]": 32201, "[X]": 32202, "[NLU]": 32203, "[NLG]": 32204, "[S2S]": 32205}
SPECIAL = SpecialIds(vocab_size=32206, pad=PAD, eos=EOS, sentinels=SENTINELS, mode_tokens=MODES)

DEFAULT = UL2()
DECODER = UL2(UL2Config(layout="decoder"))


def denoise(objective: UL2, tokens, plan: int, key: str = "k"):
    return build_example(objective, np.asarray(tokens, dtype=np.int32), SPECIAL, example_randoms(0, [key]), plan=plan)


def parts(objective: UL2, example: dict) -> tuple[list[int], list[int]]:
    """(inputs, targets) of an example in either layout."""
    if objective.config.layout == "decoder":
        row, (cut,) = example["input_ids"], example["prefix_lengths"].tolist()
        total = int(example["doc_lengths"].sum())
        assert len(row) == objective.seq_len and (row[total:] == PAD).all()
        return row[:cut].tolist(), row[cut:total].tolist()
    return example["inputs"].tolist(), example["targets"].tolist()


def oracle(objective: UL2, tokens: np.ndarray, plan: int, randoms) -> tuple[list[int], list[int]]:
    """The denoiser alone: T5 span corruption (its own objective) with the mode token in front,
    or the S split ``suffix = 1 + floor(u * min(L - 1, max_suffix))`` by hand."""
    denoiser, lengths = objective.denoisers[plan], objective.lengths[plan]
    mode = MODES[denoiser.mode_token]
    if denoiser.kind == "span":
        config = SpanCorruptionConfig(max(3, lengths.raw_length + 1), denoiser.noise_density,
                                      denoiser.mean_noise_span_length)
        span = SpanCorruption(config)
        span.raw_length = span.fixed_raw_length = lengths.raw_length  # the chunk UL2 sized, the same draws
        span.inputs_length, span.targets_length = 4 * lengths.raw_length + 8, 4 * lengths.raw_length + 8
        example, counters = build_example(span, tokens, SPECIAL, randoms)
        inputs = example["inputs"][: counters["inputs_tokens"]].tolist()
        return [mode, *inputs], example["targets"][: counters["targets_tokens"]].tolist()
    length = len(tokens)
    suffix = 0
    if length >= 2:
        suffix = 1 + int(randoms.uniforms(SUFFIX_STREAM, 1)[0, 0] * min(length - 1, lengths.max_suffix))
    split = length - suffix
    return [mode, *tokens[:split].tolist(), EOS], [*tokens[split:].tolist(), EOS]


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
    # show's legend names the mixture's own mode tokens, not the default preset's
    assert UL2(UL2Config(mixture="paper")).token_legend == ("[NLU] [NLG] [S2S]", "the UL2 mode token")
    assert DEFAULT.token_legend == ("[R] [S] [X]", "the UL2 mode token")


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
    assert DECODER.schema_kwargs() == {"seq_len": 1023, "prefix_lengths": True, "denoiser": True}


@pytest.mark.parametrize("plan", range(7))
def test_full_chunk_of_each_denoiser(plan):
    lengths = DEFAULT.lengths[plan]
    tokens = np.random.default_rng(plan).integers(3, 31000, size=lengths.raw_length)
    example, counters = denoise(DEFAULT, tokens, plan, f"full{plan}")
    inputs, targets = parts(DEFAULT, example)
    if DEFAULT.denoisers[plan].kind == "span":
        assert (len(inputs), len(targets)) == (512, lengths.max_targets)
    else:
        assert len(inputs) + len(targets) == 514
    name = DEFAULT.denoisers[plan].name
    assert example["denoiser"] == name
    assert counters["examples"] == counters[f"denoiser/{name}/examples"] == 1
    assert counters["raw_tokens"] == counters[f"denoiser/{name}/raw_tokens"] == lengths.raw_length
    assert all(type(value) is int for value in counters.values())


def test_golden_s_denoiser():
    # S on 6 tokens: suffix length 1 + floor(u * 5) (U[1, 5]); [S] prefix </s> | suffix </s>.
    objective = UL2(UL2Config(inputs_length=7, mixture=[{"mode_token": "[S]", "kind": "prefix"}]))
    assert objective.lengths[0].raw_length == 6 and objective.fixed_raw_length == 6
    suffix = 1 + int(example_randoms(0, ["s"]).uniforms(SUFFIX_STREAM, 1)[0, 0] * 5)
    example, _ = denoise(objective, np.arange(10, 16), 0, "s")
    split = 6 - suffix
    assert example["inputs"].tolist() == [MODES["[S]"], *range(10, 10 + split), EOS]
    assert example["targets"].tolist() == [*range(10 + split, 16), EOS]
    assert example["denoiser"] == "S"


def test_golden_span_denoiser_single_span():
    # R(mu=3, r=.15) at inputs 22: the chunk is sized for 21 inputs. T5's helper: T=22 gives
    # n = round(3.3) = 3, s = 1, inputs 22 - 3 + 1 + 1 = 21; T=23 gives n = round(3.45) = 3 and 22 > 21.
    # So 22 raw tokens: 19 clean tokens then one 3-token span at the end, and [R] makes 22 inputs.
    objective = UL2(UL2Config(inputs_length=22, mixture=[
        {"mode_token": "[R]", "mean_noise_span_length": 3, "noise_density": 0.15}]))
    assert objective.denoisers[0].name == "R(mu=3,r=0.15)" and objective.lengths[0].raw_length == 22
    example, _ = denoise(objective, np.arange(100, 122), 0, "r")
    assert example["inputs"].tolist() == [MODES["[R]"], *range(100, 119), SENTINELS[0], EOS]
    assert example["targets"].tolist() == [SENTINELS[0], 119, 120, 121, EOS]


def test_decoder_layout_concatenates_and_pads():
    tokens = np.arange(3, 3 + DEFAULT.lengths[0].raw_length)
    encoder_decoder, counters = denoise(DEFAULT, tokens, 0, "same")
    decoder, decoder_counters = denoise(DECODER, tokens, 0, "same")
    joined = encoder_decoder["inputs"].tolist() + encoder_decoder["targets"].tolist()
    assert decoder["prefix_lengths"].tolist() == [512]
    assert decoder["doc_lengths"].tolist() == [len(joined)] == [626]
    assert decoder["input_ids"].tolist() == joined + [PAD] * (1023 - 626)
    assert decoder_counters.pop("padding_tokens") == 1023 - 626
    assert decoder_counters == counters


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
    config = UL2Config(inputs_length=64, targets_length=16, mixture=[
        {"mode_token": "[S]", "kind": "prefix"},
        {"mode_token": "[R]", "mean_noise_span_length": 3, "noise_density": 0.15},
    ])
    objective = UL2(config)
    assert objective.lengths[0].max_suffix == 15 and objective.lengths[1].max_targets <= 16
    count = 3000
    tokens = np.tile(np.arange(3, 66, dtype=np.int32), count)
    block = Block(tokens, np.arange(count + 1) * 63, np.full(count, 63, np.int32), np.arange(count + 1), {},
                  np.zeros(count, np.int64), example_digests(0, [f"cap{i}" for i in range(count)]).randoms)
    suffixes = np.diff(objective.build(block, SPECIAL).arrays["targets"][1]) - 1
    assert suffixes.min() == 1 and suffixes.max() == 15
    assert_fits(np.bincount(suffixes, minlength=16)[1:], [1 / 15] * 15, "suffix lengths")


def test_runtime_errors():
    tokens = np.arange(3, 3 + 567)
    with pytest.raises(ValueError, match="mode token '\\[R\\]'"):
        build_example(DEFAULT, tokens, SpecialIds(vocab_size=32100, pad=0, eos=1, sentinels=SENTINELS),
                      example_randoms(0, ["e"]), plan=0)
    with pytest.raises(ValueError, match="denoiser index in \\[0, 7\\), got 7"):
        denoise(DEFAULT, tokens, 7)
    with pytest.raises(ValueError, match="1 to 567 tokens, got one of 568"):
        denoise(DEFAULT, np.arange(3, 3 + 568), 0)
    few = SpecialIds(vocab_size=32206, pad=0, eos=1, sentinels=SENTINELS[:100], mode_tokens=MODES)
    with pytest.raises(ValueError, match="needs 127 sentinel ids"):
        build_example(DEFAULT, np.arange(3, 3 + 765), few, example_randoms(0, ["e"]), plan=3)


# --- a block against each denoiser alone, and statistics -----------------------------------------------------


@settings(max_examples=100)
@given(shares=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=16), seed=st.integers(0, 1000),
       decoder=st.booleans(), preset=st.sampled_from(["default", "paper"]))
def test_every_row_of_a_block_is_its_denoiser_alone(shares, seed, decoder, preset):
    objective = UL2(UL2Config(inputs_length=64, mixture=preset, layout="decoder" if decoder else "encoder_decoder"))
    chunk_keys = [f"train-c{i}" for i in range(len(shares))]
    raw_lengths, plans = objective.plan(plan_uniforms(seed, chunk_keys))
    rng = np.random.default_rng(seed)
    chunks = [rng.integers(3, 31000, size=max(1, round(raw * share)) if share < 0.6 else raw).astype(np.int32)
              for raw, share in zip(raw_lengths.tolist(), shares)]
    randoms = example_digests(seed, [f"{key}-d0" for key in chunk_keys]).randoms
    lengths = np.array([len(c) for c in chunks])
    block = Block(np.concatenate(chunks), np.concatenate([[0], np.cumsum(lengths)]), lengths.astype(np.int32),
                  np.arange(len(chunks) + 1), {}, plans, randoms)
    built = objective.build(block, SPECIAL)
    assert built.strings["denoiser"] == [objective.denoisers[p].name for p in plans.tolist()]
    for row, (chunk, plan) in enumerate(zip(chunks, plans.tolist())):
        example = {name: values[offsets[row]: offsets[row + 1]] for name, (values, offsets) in built.arrays.items()}
        example.update({name: int(values[row]) for name, values in built.scalars.items()})
        assert parts(objective, example) == oracle(objective, chunk, plan, randoms.rows([row]))
    assert built.counters["raw_tokens"] == int(lengths.sum()) and built.counters["examples"] == len(chunks)


@pytest.mark.parametrize("preset", ["default", "paper"])
def test_mixture_shares_by_example_are_the_weights(preset):
    objective = UL2(UL2Config(mixture=preset))
    weights = np.array([d.weight for d in objective.denoisers])
    _, plans = objective.plan(plan_uniforms(9, [f"chunk{i}" for i in range(40_000)]))
    assert_fits(np.bincount(plans, minlength=len(weights)), weights / weights.sum(), f"{preset} mixture")


def test_statistics_of_10000_ul2_examples():
    count = 10_000
    chunk_keys = [f"ul2-{i}" for i in range(count)]
    raw_lengths, plans = DEFAULT.plan(plan_uniforms(13, chunk_keys))
    base = np.arange(3, 3 + 1004, dtype=np.int32)
    block = Block(np.concatenate([base[:n] for n in raw_lengths.tolist()]),
                  np.concatenate([[0], np.cumsum(raw_lengths)]), raw_lengths.astype(np.int32), np.arange(count + 1),
                  {}, plans, example_digests(13, chunk_keys).randoms)
    totals = DEFAULT.build(block, SPECIAL).counters
    assert totals["examples"] == count
    weights = np.array([d.weight for d in DEFAULT.denoisers])
    for index, denoiser in enumerate(DEFAULT.denoisers):
        prefix = f"denoiser/{denoiser.name}/"
        examples = totals[prefix + "examples"]
        assert abs(examples / count - weights[index] / weights.sum()) < 4 * np.sqrt(0.25 / count)
        raw = DEFAULT.lengths[index].raw_length
        if denoiser.kind == "span":
            num_noise, num_spans = noise_counts(raw, denoiser.noise_density, denoiser.mean_noise_span_length)
            assert totals[prefix + "noise_tokens"] == examples * num_noise  # exact: full chunks
            assert totals[prefix + "noise_spans"] == examples * num_spans
        else:
            # S: suffix ~ U[1, 510] of 511 raw tokens: mean 255.5, sd 147 / sqrt(examples)
            mean = totals[prefix + "noise_tokens"] / examples
            assert abs(mean - 255.5) < 4 * 147.2 / np.sqrt(examples)
    assert sum(totals[f"denoiser/{d.name}/raw_tokens"] for d in DEFAULT.denoisers) == totals["raw_tokens"]
