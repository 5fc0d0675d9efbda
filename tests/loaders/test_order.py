"""The epoch order is a bijection, a pure function of (rows, seed, epoch), and block-local."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.streaming.order import DEFAULT_MIN_BLOCK, EpochOrder, default_block_size

shard_rows = st.lists(st.integers(0, 40), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(rows=shard_rows, seed=st.integers(0, 2**63), epoch=st.integers(0, 1000), block=st.integers(1, 120),
       shuffle=st.booleans())
def test_locate_is_a_bijection_and_positions_of_shard_inverts_it(rows, seed, epoch, block, shuffle):
    order = EpochOrder(rows, seed, epoch, shuffle=shuffle, block_size=block)
    n = sum(rows)
    assert len(order) == n
    shards, local = order.locate(np.arange(n))
    pairs = set(zip(shards.tolist(), local.tolist(), strict=True))
    assert pairs == {(s, r) for s, count in enumerate(rows) for r in range(count)}
    for shard in range(len(rows)):
        positions, found_rows = order.positions_of_shard(shard)
        assert np.all(np.diff(positions) > 0)
        np.testing.assert_array_equal(shards[positions], shard)
        np.testing.assert_array_equal(local[positions], found_rows)


@settings(max_examples=60, deadline=None)
@given(rows=shard_rows, seed=st.integers(0, 1000), block=st.integers(1, 64))
def test_each_block_is_a_permutation_of_a_contiguous_virtual_range(rows, seed, block):
    order = EpochOrder(rows, seed, 3, block_size=block)
    n = sum(rows)
    virtual = order.virtual(np.arange(n))
    for start in range(0, n, order.block_size):
        stop = min(start + order.block_size, n)
        assert sorted(virtual[start:stop].tolist()) == list(range(start, stop))


def test_order_is_pure_and_changes_with_seed_and_epoch():
    rows = [100, 80, 120, 90]
    positions = np.arange(390)
    a = EpochOrder(rows, 7, 2, block_size=150).locate(positions)
    b = EpochOrder(rows, 7, 2, block_size=150).locate(positions[::-1])
    np.testing.assert_array_equal(a[0], b[0][::-1])  # independent of query order or history
    np.testing.assert_array_equal(a[1], b[1][::-1])
    for other in (EpochOrder(rows, 7, 3, block_size=150), EpochOrder(rows, 8, 2, block_size=150)):
        assert not np.array_equal(other.locate(positions)[1], a[1])


def test_stored_order_without_shuffle():
    order = EpochOrder([2, 0, 3], 5, 9, shuffle=False)
    shards, rows = order.locate(np.arange(5))
    assert shards.tolist() == [0, 0, 2, 2, 2]
    assert rows.tolist() == [0, 1, 0, 1, 2]


def test_blocks_mix_several_shards_and_memory_stays_bounded():
    rows = [1000] * 20
    order = EpochOrder(rows, 0, 0, block_size=4000)
    shards, _ = order.locate(np.arange(4000))
    assert len(np.unique(shards)) == 4  # a block spans four shards...
    assert len(np.unique(shards[:100])) == 4  # ...and its first rows already mix them
    for start in range(0, 20000, 997):
        order.locate(np.arange(start, min(start + 64, 20000)))
    assert len(order._blocks) <= 2  # at most two block permutations are held


def test_default_block_size_and_validation():
    assert default_block_size([10, 20]) == DEFAULT_MIN_BLOCK
    assert default_block_size([100_000]) == 400_000
    assert EpochOrder([10, 20], 0, 0).block_size == 30  # capped at the epoch size
    with pytest.raises(ValueError, match="seed"):
        EpochOrder([1], -1, 0)
    with pytest.raises(ValueError, match="block_size"):
        EpochOrder([1], 0, 0, block_size=0)
    with pytest.raises(ValueError, match="positions"):
        EpochOrder([3], 0, 0).locate(np.array([3]))
