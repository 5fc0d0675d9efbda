"""The objectives' fast paths against the plain formulations they replace.

Each fast path must give the same values from the same draws: seeding by one packed int,
composition bounds gathered without a noise mask, the sentinel-range histogram, the float
80/10/10 split, the per-id special table, BART's sentence order and span cover.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.objectives import bart as bart_module
from transforms.objectives.common import (
    LazyGenerator,
    SpecialIds,
    _entropy,
    _SeedSequence,
    digest_u64,
    example_rng,
    example_rngs,
    first_uniforms,
    generator_of,
)
from transforms.objectives.mlm import _cumulative_ratios, _split_counts, draw_non_special, exact_split
from transforms.objectives.span_corruption import (
    apply_noise_mask,
    corrupt_spans,
    random_spans_noise_mask,
    span_length_histogram,
    special_span_histogram,
)

_MASK64 = (1 << 64) - 1


# --- seeding --------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    seed=st.one_of(st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**64 - 1, 2**64 + 5]), st.integers(0, 2**70)),
    key=st.one_of(st.text(max_size=12), st.binary(max_size=12)),
    extra=st.lists(st.one_of(st.sampled_from([0, 1, -1, 2**32, 2**64]), st.integers(-(2**65), 2**65)), max_size=3),
)
def test_example_rng_is_default_rng_of_the_documented_list(seed, key, extra):
    entropy = [seed & _MASK64, digest_u64(key, salt=b"lmshards-rng"), *(e & _MASK64 for e in extra)]
    expected = np.random.default_rng(entropy).bit_generator.random_raw(4).tolist()
    assert example_rng(seed, key, *extra).bit_generator.random_raw(4).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(
    seed=st.one_of(st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**64 - 1]), st.integers(0, 2**70)),
    keys=st.lists(st.one_of(st.text(max_size=12), st.binary(max_size=12)), max_size=12),
    extra=st.lists(st.integers(-(2**65), 2**65), max_size=2),
)
def test_generators_seeded_together_are_the_example_generators(seed, keys, extra):
    together = example_rngs(seed, keys, *extra)
    assert len(together) == len(keys)
    for key, generator in zip(keys, together):
        expected = example_rng(seed, key, *extra)
        assert generator.bit_generator.random_raw(3).tolist() == expected.bit_generator.random_raw(3).tolist()
        assert generator.random() == expected.random()  # a Generator whose state goes on like the other's
    assert first_uniforms(seed, keys, *extra).tolist() == [example_rng(seed, key, *extra).random() for key in keys]


def test_generators_seeded_together_include_keys_with_a_one_word_digest(monkeypatch):
    """About one key in 2**32 has a digest below 2**32 (one seed word): it is seeded on its own."""
    from transforms.objectives import common

    digests = {"low": 12345, "high": 2**63 + 7}
    monkeypatch.setattr(common, "_key_u64", lambda key: digests[key])
    plain = [np.random.default_rng([3, digests[k]]).bit_generator.random_raw(2).tolist() for k in ("low", "high")]
    assert [g.bit_generator.random_raw(2).tolist() for g in example_rngs(3, ["low", "high"])] == plain


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**64 - 1]), st.integers(0, 2**80)), min_size=1))
def test_packed_entropy_seeds_like_the_list(values):
    expected = np.random.SeedSequence(values).generate_state(8).tolist()
    assert np.random.SeedSequence(_entropy(values)).generate_state(8).tolist() == expected


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.integers(0, 2**200), st.lists(st.integers(0, 2**70), min_size=1, max_size=6)))
def test_seed_sequence_state_equals_numpy(entropy):
    fast, plain = _SeedSequence(entropy), np.random.SeedSequence(entropy)
    assert fast.generate_state(4, np.uint64).tolist() == plain.generate_state(4, np.uint64).tolist()
    assert fast.generate_state(5).tolist() == plain.generate_state(5).tolist()
    assert fast.generate_state(3, np.uint64).tolist() == plain.generate_state(3, np.uint64).tolist()
    ours = np.random.Generator(np.random.PCG64(fast))
    reference = np.random.Generator(np.random.PCG64(plain))
    assert ours.bit_generator.state == reference.bit_generator.state
    assert [child.random() for child in ours.spawn(2)] == [child.random() for child in reference.spawn(2)]


def test_lazy_generator_unwraps_to_the_same_stream():
    lazy = LazyGenerator(3, "k", 7)
    assert generator_of(lazy).random() == example_rng(3, "k", 7).random()
    assert generator_of(lazy) is generator_of(lazy)
    plain = np.random.default_rng(0)
    assert generator_of(plain) is plain


# --- span corruption ------------------------------------------------------------------------

SENTINEL_LAYOUTS = {
    "ascending": tuple(900 + k for k in range(300)),
    "descending": tuple(1199 - k for k in range(300)),
    "gaps": tuple(900 + 2 * k for k in range(300)),
}


@settings(max_examples=400, deadline=None)
@given(
    length=st.integers(0, 700),
    density=st.sampled_from([0.05, 0.15, 0.3, 0.5, 0.8]),
    mu=st.sampled_from([1.0, 2.5, 3.0, 8.0, 64.0]),
    layout=st.sampled_from(sorted(SENTINEL_LAYOUTS)),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from([np.int32, np.int64]),
)
def test_corrupt_spans_equals_mask_then_apply(length, density, mu, layout, seed, dtype):
    special = SpecialIds(vocab_size=1300, pad=0, eos=1, sentinels=SENTINEL_LAYOUTS[layout])
    tokens = np.random.default_rng(seed).integers(2, 900, size=length).astype(dtype)
    mask = random_spans_noise_mask(length, density, mu, np.random.default_rng([seed, 1]))
    num_spans = int(np.count_nonzero(mask & ~np.concatenate([[False], mask[:-1]])))
    if num_spans > len(special.sentinels):
        return
    inputs, targets = apply_noise_mask(tokens, mask, np.asarray(special.sentinels[:num_spans]), special.eos)
    fast_inputs, fast_targets = corrupt_spans(tokens, np.random.default_rng([seed, 1]), density, mu, special)
    assert fast_inputs.dtype == inputs.dtype and fast_targets.dtype == targets.dtype
    assert fast_inputs.tolist() == inputs.tolist() and fast_targets.tolist() == targets.tolist()
    lead_inputs, lead_targets = corrupt_spans(tokens, np.random.default_rng([seed, 1]), density, mu, special, lead=1)
    assert lead_inputs[1:].tolist() == inputs.tolist() and lead_targets.tolist() == targets.tolist()


@settings(max_examples=400, deadline=None)
@given(
    layout=st.sampled_from(["ascending", "descending", "gaps", "repeated", "empty", "single"]),
    body=st.lists(st.integers(0, 40), max_size=80),
)
def test_special_span_histogram_equals_span_length_histogram(layout, body):
    sentinels = {
        "ascending": (10, 11, 12, 13),
        "descending": (13, 12, 11, 10),
        "gaps": (10, 12, 14),
        "repeated": (10, 11, 11, 12),
        "empty": (),
        "single": (11,),
    }[layout]
    special = SpecialIds(vocab_size=50, pad=0, eos=1, sentinels=sentinels)
    targets = np.array([*body, 1], dtype=np.int32)
    expected = span_length_histogram(targets, np.asarray(sentinels))
    buckets = special_span_histogram(targets, special)
    assert {f"span_len_hist_{k}": count for k, count in enumerate(buckets) if count} == expected


# --- mlm ------------------------------------------------------------------------------------


class _FixedDraw:
    def __init__(self, u: float):
        self.u = u

    def random(self) -> float:
        return self.u


@settings(max_examples=1000, deadline=None)
@given(
    count=st.integers(0, 5000),
    ratios=st.one_of(
        st.sampled_from([(0.8, 0.1, 0.1), (0.5, 0.3, 0.2), (1 / 3, 1 / 3, 1 / 3), (0.0, 0.0, 1.0), (0.7, 0.2, 0.1)]),
        st.tuples(st.floats(0, 1), st.floats(0, 1)).map(lambda p: (min(p), max(p) - min(p), 1 - max(p))),
    ),
    u=st.one_of(st.floats(0, 1, exclude_max=True), st.sampled_from([0.0, 0.5, 0.2, 0.8, 1 - 2**-53])),
)
def test_split_counts_equals_exact_split(count, ratios, u):
    expected = exact_split(count, ratios, _FixedDraw(u)).tolist()
    assert _split_counts(count, _cumulative_ratios(*ratios), u) == expected


def test_split_counts_on_many_draws():
    rng = np.random.default_rng(0)
    for _ in range(20_000):
        count = int(rng.integers(0, 2000))
        ratios = (0.8, 0.1, 0.1) if rng.random() < 0.5 else tuple(rng.dirichlet([1, 1, 1]).tolist())
        u = float(rng.random())
        assert (
            _split_counts(count, _cumulative_ratios(*ratios), u) == exact_split(count, ratios, _FixedDraw(u)).tolist()
        )


@settings(max_examples=200, deadline=None)
@given(
    vocab=st.integers(2, 300),
    specials=st.lists(st.integers(-1, 320), max_size=20),
    seed=st.integers(0, 2**32 - 1),
)
def test_special_tables(vocab, specials, seed):
    special = SpecialIds(vocab_size=vocab, pad=0, eos=vocab - 1, all_special=frozenset(specials))
    ids = np.arange(vocab)
    assert special.special_flags().tolist() == np.isin(ids, special.special_array()).tolist()
    free = special.non_special_ids()
    if free.size:
        for size in (0, 1, 2, 3, 4, 5, 50):  # scalar draws for a few ids, one vector draw for more
            draws = draw_non_special(np.random.default_rng(seed), special, size)
            ranks = np.random.default_rng(seed).integers(0, free.size, size=size)
            assert draws.dtype == np.int32 and draws.tolist() == free[ranks].tolist()


# --- bart -----------------------------------------------------------------------------------


@settings(max_examples=1000, deadline=None)
@given(
    st.one_of(
        st.floats(0, 1e6),
        st.tuples(st.integers(0, 10**6), st.floats(-3e-9, 3e-9)).map(lambda p: p[0] + p[1]),
        st.tuples(st.integers(0, 5000), st.sampled_from([0.1, 0.2, 0.3, 0.35, 0.5, 0.7, 1.0, 1 / 3])).map(
            lambda p: p[0] * p[1]
        ),
    )
)
def test_ceil_equals_ceil_of_rounded(value):
    assert bart_module._ceil(value) == math.ceil(round(value, 9))


def test_insert_of_one_token_draws_like_choice():
    special = SpecialIds(vocab_size=50, pad=1, eos=2, bos=0, mask=3)
    for size in (3, 4, 10, 513, 20_000):
        config = bart_module.BartConfig(seq_len=size, mask_random=0.5)
        ids = np.arange(size - 1, dtype=np.int32) % 40 + 4
        for seed in range(40):
            rng, reference = np.random.default_rng([seed, size]), np.random.default_rng([seed, size])
            src = bart_module._Noisy(ids.copy(), np.ones(size - 1, bool), np.zeros(size - 1, bool))
            bart_module._insert(src, 1, config, special, rng, {"inserted": 0, "random_tokens": 0})
            # the plain formulation: choice of one position, a coin, a random id when it says so
            position = int(reference.choice(size - 2, size=1, replace=False)[0]) + 1
            token = draw_non_special(reference, special, 1)[0] if reference.random(1)[0] < 0.5 else special.mask
            assert src.ids.tolist() == [*ids[:position].tolist(), token, *ids[position:].tolist()]
            assert rng.bit_generator.state == reference.bit_generator.state


def _reference_sentence_order(size, sentence_starts, p, rng):
    """The plain formulation: union with 0, permute, re-gather token by token."""
    starts = np.flatnonzero(sentence_starts) if sentence_starts is not None else np.zeros(0, np.int64)
    starts = np.union1d([0], starts) if size else starts
    n = starts.size
    if n < 2:
        return None, n
    k = bart_module._ceil(n * p)
    chosen = rng.permutation(n)[:k]
    ordering = np.arange(n)
    ordering[chosen] = chosen[rng.permutation(k)]
    lengths = np.diff(starts, append=size)[ordering]
    offsets = np.cumsum(lengths) - lengths
    return np.arange(size) - np.repeat(offsets, lengths) + np.repeat(starts[ordering], lengths), n


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(0, 80),
    share=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
    present=st.booleans(),
    p=st.sampled_from([0.1, 0.5, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_sentence_order_equals_reference(size, share, present, p, seed):
    flags = np.random.default_rng(seed).random(size) < share if present else None
    expected, n = _reference_sentence_order(size, flags, p, np.random.default_rng([seed, 2]))
    counters: dict[str, int] = {}
    index = bart_module._sentence_order(size, flags, p, np.random.default_rng([seed, 2]), counters)
    assert counters["sentences"] == n
    assert (index is None) == (expected is None)
    if index is not None:
        assert index.tolist() == expected.tolist()


def _reference_union(size, first, last):
    depth = np.zeros(size + 1, dtype=np.int64)
    np.add.at(depth, first, 1)
    np.add.at(depth, last, -1)
    return np.cumsum(depth[:-1]) > 0


class _Draws:
    """Scripted generator for ``_mask_spans``: starts, coins and random-id ranks."""

    def __init__(self, starts, coins):
        self.starts, self.coins = starts, coins

    def choice(self, pool, size, replace):
        return np.array(self.starts[:size], dtype=np.int64)

    def random(self, size):
        return np.array(self.coins[:size])

    def integers(self, low, high, size):
        return np.arange(size, dtype=np.int64) % high


@settings(max_examples=400, deadline=None)
@given(size=st.integers(3, 60), replace_length=st.sampled_from([-1, 0, 1]), seed=st.integers(0, 2**32 - 1))
def test_mask_spans_cover_keep_and_random_flags_equal_reference(size, replace_length, seed):
    rng = np.random.default_rng(seed)
    special = SpecialIds(vocab_size=50, pad=1, eos=2, bos=0, mask=3)
    ids = rng.integers(4, 50, size=size).astype(np.int32)
    ids[0], ids[-1] = special.bos, special.eos
    word_start = rng.random(size) < 0.6
    barrier = rng.random(size) < 0.1
    barrier[[0, -1]] = True
    pool = np.flatnonzero(word_start & ~barrier)
    count = int(rng.integers(0, pool.size + 1))
    starts = rng.permutation(pool)[:count]
    lengths = rng.integers(1, 6, size=count)
    coins = rng.random(count)
    config = bart_module.BartConfig(seq_len=max(size, 3), mask_random=0.5)

    # reference: union by np.add.at, random flags painted span by span, latest start first
    ends = bart_module._span_ends(word_start, barrier, starts, lengths)
    covered = _reference_union(size, starts, ends)
    is_random = coins < 0.5
    expected = ids.copy()
    expected_barrier = barrier.copy()
    if replace_length == 0:
        keep = ~covered
    elif replace_length == 1:
        expected[starts] = special.mask
        random_positions = starts[is_random]
        keep = ~_reference_union(size, starts + 1, ends)
        expected_barrier[starts] = True
    else:
        expected[covered] = special.mask
        flag = np.zeros(size, dtype=bool)
        for first in np.argsort(starts)[::-1]:
            flag[starts[first] : ends[first]] = is_random[first]
        random_positions = np.flatnonzero(flag)
        keep = np.ones(size, dtype=bool)
        expected_barrier[covered] = True
    if replace_length != 0:
        free = special.non_special_ids()
        expected[random_positions] = free[np.arange(random_positions.size) % free.size]
    expected_random = int(keep[random_positions].sum()) if replace_length != 0 else 0

    src = bart_module._Noisy(ids.copy(), word_start.copy(), barrier.copy())
    counters = {"random_tokens": 0}
    bart_module._mask_spans(src, lengths, replace_length, config, special, _Draws(starts.tolist(), coins), counters)
    assert src.ids.tolist() == expected[keep].tolist()
    assert src.word_start.tolist() == word_start[keep].tolist()
    assert src.barrier.tolist() == expected_barrier[keep].tolist()
    assert counters["masked_tokens"] == int(covered.sum())
    assert counters["masked_words"] == int((covered & word_start).sum())
    assert counters["random_tokens"] == expected_random


# --- clm's block build ----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 40), st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=6), min_size=0, max_size=12),
       st.integers(0, 2**32 - 1))
def test_clm_build_block_equals_build_and_stats_per_chunk(seq_len, segment_lists, seed):
    from schemas.examples import example_schema
    from transforms.objectives.clm import CLM, CLMConfig
    from transforms.shard_format import ExampleColumns

    clm = CLM(CLMConfig(seq_len=seq_len))
    special = SpecialIds(pad=0, eos=1, vocab_size=1000)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(2, 1000, (len(segment_lists), seq_len), dtype=np.int32)
    doc_lengths = [np.array(s, dtype=np.int32) for s in segment_lists]  # any lengths: block copies them as build does
    columns, stats = clm.build_block(tokens, doc_lengths)
    examples = [clm.build(row, LazyGenerator(0, "k"), 0, special, {"doc_lengths": lengths})
                for row, lengths in zip(tokens, doc_lengths)]
    expected = ExampleColumns.from_examples([{**e, "key": "k"} for e in examples],
                                            example_schema("decoder", seq_len=seq_len))
    for name in ("input_ids", "doc_lengths"):
        flat, offsets = columns[name]
        assert flat.dtype == np.int32 and offsets.dtype == np.int64
        np.testing.assert_array_equal(flat, expected.arrays[name][0])
        np.testing.assert_array_equal(offsets, expected.arrays[name][1])
    summed = {}
    for example in examples:
        for name, value in clm.stats(example).items():
            summed[name] = summed.get(name, 0) + value
    assert stats == (summed or {"examples": 0, "tokens": 0, "padding_tokens": 0, "documents_segments": 0})
