"""Rank/worker split arithmetic and the state format (pure, no I/O)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.streaming.state import LoaderState, RankSchedule, samples_per_rank


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 300), world=st.integers(1, 5), batch=st.integers(1, 9), workers=st.integers(0, 4),
       uneven=st.sampled_from(["drop", "wrap"]), drop_last=st.booleans(), steps=st.integers(0, 20))
def test_ranks_and_workers_cover_the_global_stream(n, world, batch, workers, uneven, drop_last, steps):
    start = min(steps * batch * world, samples_per_rank(n, world, uneven) * world)
    start -= start % world
    per_rank, seen = [], []
    for rank in range(world):
        schedule = RankSchedule(n, world, rank, batch, start, uneven, drop_last)
        rank_indices = []
        for worker in range(max(workers, 1)):
            mine = list(schedule.iter_worker(worker, workers))
            assert all(len(b) <= batch for b in mine)
            for b in mine:
                assert schedule.owned_by(b, worker, workers).all()
            rank_indices.extend(np.concatenate(mine).tolist() if mine else [])
        per_rank.append(len(rank_indices))
        seen.extend(rank_indices)
        # owned_by is exactly the set of this rank's indices, split by worker
        everything = np.arange(0, schedule.total + 2 * world)
        owned = sum(schedule.owned_by(everything, w, workers).astype(int) for w in range(max(workers, 1)))
        assert owned.max(initial=0) <= 1
        assert sorted(everything[owned == 1].tolist()) == sorted(rank_indices)
    assert len(set(per_rank)) == 1  # equal counts: DDP never waits
    total = samples_per_rank(n, world, uneven) * world
    assert len(seen) == len(set(seen))
    if not drop_last:
        assert sorted(seen) == list(range(start, total))
    assert total <= n if uneven == "drop" else n <= total < n + world


def test_worker_batches_interleave_round_robin():
    schedule = RankSchedule(40, 2, 1, 3)
    assert [b.tolist() for b in schedule.iter_worker(0, 2)][:2] == [[1, 3, 5], [13, 15, 17]]
    assert [b.tolist() for b in schedule.iter_worker(1, 2)][:1] == [[7, 9, 11]]
    assert schedule.num_samples == 20 and schedule.num_batches == 7 and schedule.batch_length(6) == 2


def test_wrap_reads_the_first_positions_again():
    schedule = RankSchedule(5, 2, 1, 10, uneven="wrap")
    (indices,) = list(schedule.iter_worker(0, 1))
    assert indices.tolist() == [1, 3, 5] and schedule.positions(indices).tolist() == [1, 3, 0]


def test_resume_point_must_be_a_multiple_of_the_world_size():
    with pytest.raises(ValueError, match="global batch size"):
        RankSchedule(100, 3, 0, 4, start=8)


def test_state_round_trip_and_validation():
    state = LoaderState(2, 64, 7, "abc", "ShardedDataset", 4, 8)
    assert LoaderState.from_dict(state.to_dict()) == state
    with pytest.raises(ValueError, match="version"):
        LoaderState.from_dict({**state.to_dict(), "version": 99})
    with pytest.raises(ValueError, match="missing"):
        LoaderState.from_dict({"version": 1, "epoch": 0})
