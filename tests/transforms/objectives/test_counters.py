"""Tests of transforms/objectives/counters.py: exact merges in any order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from transforms.objectives.counters import length_counters, sum_counters


def log2_bin(length: int) -> int:
    """Histogram bin of a length, one at a time: 0 for 0, else floor(log2(length)) + 1 (the
    ``len_hist_NN`` bins of :func:`length_counters`)."""
    return int(length).bit_length()


def test_log2_bin():
    assert [log2_bin(n) for n in (0, 1, 2, 3, 4, 7, 8, 1023, 1024)] == [0, 1, 2, 2, 3, 3, 4, 10, 11]
    assert log2_bin(np.int64(5)) == 3


def test_sum_counters_sum_min_max():
    a = {"docs": 3, "len_min": 4, "len_max": 9, "len_hist_03": 2, "only_a": 1}
    b = {"docs": 2, "len_min": 2, "len_max": 7, "len_hist_03": 5, "only_b_max": 8}
    merged = sum_counters([a, b])
    assert merged == {
        "docs": 5,
        "len_min": 2,
        "len_max": 9,
        "len_hist_03": 7,
        "only_a": 1,
        "only_b_max": 8,
    }
    # Inputs are not modified.
    assert a == {"docs": 3, "len_min": 4, "len_max": 9, "len_hist_03": 2, "only_a": 1}
    assert sum_counters([{}, {}]) == {}
    assert type(sum_counters([{}, {"x": np.int64(3)}])["x"]) is int


def test_length_counters_exact():
    counters = length_counters("doc", np.array([0, 1, 2, 3, 4, 1000]))
    assert counters == {
        "doc_count": 6,
        "doc_sum": 1010,
        "doc_min": 0,
        "doc_max": 1000,
        "doc_hist_00": 1,
        "doc_hist_01": 1,
        "doc_hist_02": 2,
        "doc_hist_03": 1,
        "doc_hist_10": 1,
    }
    assert all(type(v) is int for v in counters.values())
    assert length_counters("doc", np.zeros(0, np.int64)) == {}
    assert length_counters("x", [5]) == {"x_count": 1, "x_sum": 5, "x_min": 5, "x_max": 5, "x_hist_03": 1}


_LENGTHS = st.lists(st.integers(0, 5000), max_size=30)


@settings(max_examples=150, deadline=None)
@given(parts=st.lists(_LENGTHS, min_size=1, max_size=6), order=st.randoms(use_true_random=False))
def test_merged_parts_equal_whole_in_any_order(parts, order):
    whole = length_counters("len", np.array([x for part in parts for x in part], dtype=np.int64))
    partials = [length_counters("len", np.array(part, dtype=np.int64)) for part in parts]
    assert sum_counters(partials) == whole
    shuffled = list(partials)
    order.shuffle(shuffled)
    assert sum_counters(shuffled) == whole
    # Tree-shaped combination (as a combiner would) gives the same result.
    while len(shuffled) > 1:
        shuffled = [
            sum_counters(shuffled[i : i + 2]) if i + 1 < len(shuffled) else shuffled[i]
            for i in range(0, len(shuffled), 2)
        ]
    assert shuffled[0] == whole


def test_sum_counters_combines_parts_sums_and_nothing():
    parts = [{"n": 2, "len_min": 5, "len_max": 9}, {"n": 1, "len_min": 3}, {"len_max": 12, "b": 0}]
    whole = {"b": 0, "len_max": 12, "len_min": 3, "n": 3}
    assert sum_counters(parts) == whole and list(sum_counters(parts)) == sorted(whole)
    assert sum_counters([sum_counters(parts[:2]), parts[2]]) == whole  # partial sums combine again
    assert sum_counters([]) == {}


def test_sum_counters_is_the_beam_combiner_of_every_stats_stream():
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    # More elements per key than Beam's buffer of a callable combiner (10): partial sums are combined again.
    elements = [("train", {"tokens": i, "len_max": i}) for i in range(40)] + [("validation", {"tokens": 7})]
    with TestPipeline(runner="FnApiRunner") as p:
        summed = p | beam.Create(elements) | beam.CombinePerKey(sum_counters)
        assert_that(summed, equal_to([("train", {"len_max": 39, "tokens": 780}), ("validation", {"tokens": 7})]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 5000), st.sampled_from([0, 1, 2**31 - 1, 2**31, 2**40 - 1, 2**40])),
                min_size=1, max_size=40))
def test_length_histogram_bins_are_bit_lengths(lengths):
    counters = length_counters("len", np.array(lengths, dtype=np.int64))
    expected: dict[str, int] = {}
    for length in lengths:
        name = f"len_hist_{log2_bin(length):02d}"
        expected[name] = expected.get(name, 0) + 1
    assert {k: v for k, v in counters.items() if "_hist_" in k} == expected
