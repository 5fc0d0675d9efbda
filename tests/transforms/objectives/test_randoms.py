"""The counter-based generator (transforms/objectives/randoms.py): its definition, statistics,
and the samplers against their definitions."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from objective_oracles import assert_fits, chi_square, chi_square_bound

from transforms.objectives.common import SpecialIds
from transforms.objectives.layout import example_digests, example_randoms, plan_uniforms
from transforms.objectives.randoms import Randoms, compositions, first_distinct, mix64, random_ids, random_order

MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _word(key: int, stream: int, counter: int) -> int:
    """The documented word, in Python integers."""
    inner = _mix((0x9E3779B97F4A7C15 * ((stream << 32) + counter + 1)) & MASK)
    return _mix((key + inner) & MASK)


def _randoms(rows: int, salt: int = 0) -> Randoms:
    return example_digests(salt, [f"row-{i}" for i in range(rows)]).randoms


def test_mix64_is_splitmix64s_finalizer():
    # SplitMix64 seeded with 0: its first output is mix(0 + golden), a published value.
    assert _mix(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    values = np.array([0, 1, 0x9E3779B97F4A7C15, MASK], dtype=np.uint64)
    assert mix64(values.copy()).tolist() == [_mix(int(v)) for v in values]


@settings(max_examples=50)
@given(st.lists(st.integers(0, MASK), min_size=1, max_size=5), st.integers(0, 40), st.integers(1, 30))
def test_words_are_the_documented_function_of_key_stream_and_counter(keys, stream, count):
    words = Randoms(np.array(keys, dtype=np.uint64)).words(stream, count)
    assert words.tolist() == [[_word(key, stream, j) for j in range(count)] for key in keys]


def test_a_block_is_its_rows():
    randoms = _randoms(50)
    block = randoms.words(3, 20)
    for row in range(50):
        assert np.array_equal(randoms.rows([row]).words(3, 20)[0], block[row])
    assert np.array_equal(randoms.rows(slice(10, 20)).words(3, 5), block[10:20, :5])  # a prefix of the counters


def test_the_row_key_is_a_digest_of_seed_and_key_and_extra_ints_give_new_streams():
    assert np.array_equal(example_randoms(3, ["a", "b"]).keys, example_digests(3, ["a", "b"]).randoms.keys)
    assert not np.array_equal(example_randoms(3, ["a"]).keys, example_randoms(4, ["a"]).keys)
    epoch0, epoch1 = example_randoms(3, ["a"], 0).keys, example_randoms(3, ["a"], 1).keys
    assert len({int(epoch0[0]), int(epoch1[0]), int(example_randoms(3, ["a"]).keys[0])}) == 3
    # the plan of a chunk comes from its own digest, not from any example's
    assert plan_uniforms(3, ["a"])[0] != example_randoms(3, ["a"]).uniforms(0, 1)[0, 0]


def test_uniforms_fill_equal_buckets_and_bits_are_balanced():
    randoms = _randoms(2000)
    uniforms = randoms.uniforms(1, 100).reshape(-1)  # 200,000 numbers
    assert uniforms.min() >= 0 and uniforms.max() < 1
    assert_fits(np.bincount((uniforms * 256).astype(int), minlength=256), [1 / 256] * 256, "uniform buckets")
    words = randoms.words(2, 100).reshape(-1)
    ones = np.array([int(np.count_nonzero((words >> np.uint64(bit)) & np.uint64(1))) for bit in range(64)])
    # each bit is 1 with probability 1/2: within 4 sigma of 100,000 for 200,000 words
    assert np.abs(ones - words.size / 2).max() < 4 * math.sqrt(words.size / 4)


def test_pairs_are_independent_across_counters_rows_and_streams():
    randoms = _randoms(4000)
    uniforms = randoms.uniforms(1, 64)
    other_stream = randoms.uniforms(2, 64)
    pairs = {
        "counters j, j + 1": (uniforms[:, :-1], uniforms[:, 1:]),
        "rows r, r + 1": (uniforms[:-1], uniforms[1:]),
        "streams 1, 2": (uniforms, other_stream),
    }
    for what, (a, b) in pairs.items():
        cells = (a.reshape(-1) * 16).astype(int) * 16 + (b.reshape(-1) * 16).astype(int)
        assert_fits(np.bincount(cells, minlength=256), [1 / 256] * 256, f"16x16 grid of {what}")
        correlation = np.corrcoef(a.reshape(-1), b.reshape(-1))[0, 1]
        assert abs(correlation) < 4 / math.sqrt(a.size), (what, correlation)


def test_rows_with_nearby_keys_do_not_run_in_step():
    """SplitMix64 streams seeded GOLDEN apart are one stream shifted; the mixed counter avoids it."""
    keys = np.array([1000, 1000 + 0x9E3779B97F4A7C15], dtype=np.uint64)
    words = Randoms(keys).words(1, 200)
    assert not set(words[0].tolist()) & set(words[1].tolist())


def test_integers_cover_their_range_evenly():
    values = _randoms(3000).integers(4, 50, 7).reshape(-1)
    assert values.min() == 0 and values.max() == 6
    assert_fits(np.bincount(values, minlength=7), [1 / 7] * 7, "integers below 7")
    per_row = _randoms(3).integers(5, 1000, np.array([1, 2, 1000]))
    assert (per_row[0] == 0).all() and set(per_row[1].tolist()) == {0, 1} and per_row[2].max() >= 990


def _first_distinct_oracle(randoms: Randoms, stream: int, bound: int, count: int) -> list[int]:
    """The definition: walk the row's draws and keep each value the first time it appears."""
    if not count:
        return []
    if 2 * count > bound:  # the dense case: a random order of the whole range
        return random_order(randoms, stream, bound)[0, :count].tolist()
    draws = randoms.integers(stream, 20 * count + 50, bound)[0].tolist()
    seen, out = set(), []
    for value in draws:
        if value not in seen:
            seen.add(value)
            out.append(value)
            if len(out) == count:
                return out
    raise AssertionError("ran out of draws")


@settings(max_examples=60)
@given(st.lists(st.tuples(st.integers(1, 300), st.floats(0, 1)), min_size=1, max_size=12), st.integers(0, 9))
def test_first_distinct_is_the_first_distinct_draws(sizes, salt):
    bounds = np.array([bound for bound, _ in sizes])
    counts = np.array([int(share * bound) for bound, share in sizes])
    randoms = _randoms(len(sizes), salt)
    values, offsets = first_distinct(randoms, 7, bounds, counts)
    for row, (bound, count) in enumerate(zip(bounds.tolist(), counts.tolist())):
        expected = _first_distinct_oracle(randoms.rows([row]), 7, bound, count)
        assert values[offsets[row]: offsets[row + 1]].tolist() == expected
    # one size for all rows: the same numbers
    same, same_offsets = first_distinct(randoms, 7, int(bounds[0]), int(counts[0]))
    assert same.tolist() == [v for row in range(len(sizes)) for v in _first_distinct_oracle(
        randoms.rows([row]), 7, int(bounds[0]), int(counts[0]))]


def test_first_distinct_rows_that_need_more_draws():
    """A row whose draws repeat more than the first batch allows draws on: same sequence, longer."""
    randoms = _randoms(400)
    values, offsets = first_distinct(randoms, 1, 60, 30)  # 30 of 60: about 42 draws, often more
    for row in range(0, 400, 7):
        assert values[offsets[row]: offsets[row + 1]].tolist() == _first_distinct_oracle(randoms.rows([row]), 1, 60, 30)


def test_ordered_samples_are_uniform():
    """Every ordered 2-sample of 4 values (12 of them) equally likely, sparse and dense paths."""
    for count, bound in ((2, 4), (3, 4)):
        values, _ = first_distinct(_randoms(24000), 1, bound, count)
        tuples = Counter(map(tuple, values.reshape(-1, count).tolist()))
        outcomes = list(itertools.permutations(range(bound), count))
        assert set(tuples) == set(outcomes)
        assert_fits([tuples[o] for o in outcomes], [1 / len(outcomes)] * len(outcomes), f"{count} of {bound}")


@pytest.mark.parametrize(("total", "parts"), [(6, 3), (7, 5), (5, 5), (9, 2)])
def test_compositions_are_uniform(total, parts):
    result = compositions(_randoms(20000), 2, total, parts)
    assert (result.sum(axis=1) == total).all() and (result > 0).all()
    seen = Counter(map(tuple, result.tolist()))
    outcomes = [c for c in itertools.product(range(1, total + 1), repeat=parts) if sum(c) == total]
    assert len(outcomes) == math.comb(total - 1, parts - 1) and set(seen) <= set(outcomes)
    assert_fits([seen[o] for o in outcomes], [1 / len(outcomes)] * len(outcomes), f"{total} into {parts}")


def test_random_orders_are_permutations_and_uniform():
    orders = random_order(_randoms(12000), 3, 4)
    assert (np.sort(orders, axis=1) == np.arange(4)).all()
    seen = Counter(map(tuple, orders.tolist()))
    assert len(seen) == 24
    statistic, df = chi_square(list(seen.values()), [500.0] * 24)
    assert statistic < chi_square_bound(df)


def test_random_ids_are_uniform_over_non_special_ids():
    special = SpecialIds(vocab_size=12, pad=0, eos=5, mask=11, all_special=frozenset({6, 7}))
    draws = random_ids(example_digests(0, [f"r{i}" for i in range(2000)]).randoms, 9, np.full(2000, 30), special)
    allowed = special.non_special_ids()
    assert set(np.unique(draws).tolist()) == set(allowed.tolist())
    assert_fits(np.bincount(draws, minlength=12)[allowed], [1 / allowed.size] * allowed.size, "random ids")
