"""Stop after k global steps, resume (same or other workers, other world size), compare streams."""

from __future__ import annotations

import pytest
from conftest import batch_keys, expected_keys

from loaders import ShardedDataset, make_dataloader

BLOCK = 64
SEED = 11


def make_loaders(path, world, batch, workers, *, state=None, epoch=0, fmt="arrow", uneven="wrap"):
    loaders = []
    for rank in range(world):
        ds = ShardedDataset(path, batch_size=batch, seed=SEED, shuffle_block_size=BLOCK, rank=rank, world_size=world,
                            uneven=uneven, fmt=fmt)
        loader = make_dataloader(ds, collate_fn=batch_keys, num_workers=workers)
        if state is not None:
            loader.load_state_dict(state)
        loader.set_epoch(epoch)  # a training loop's set_epoch keeps a mid-epoch resume point
        loaders.append(loader)
    return loaders


def run_steps(loaders, steps=None):
    """Global stream of ``steps`` lockstep steps (all, when None) and the common state after them."""
    iterators = [iter(loader) for loader in loaders]
    world = len(loaders)
    stream, step = [], 0
    while steps is None or step < steps:
        batches = [next(it, None) for it in iterators]
        if all(b is None for b in batches):
            break
        assert all(b is not None for b in batches), "ranks ran out at different steps"
        step += 1
        for j in range(len(batches[0])):  # rank r's j-th sample of the step is global index ... + r + j*W
            stream.extend(batches[rank][j] for rank in range(world))
    states = [loader.state_dict() for loader in loaders]
    assert all(s["samples"] == states[0]["samples"] and s["epoch"] == states[0]["epoch"] for s in states)
    return stream, states[0]


@pytest.mark.parametrize(
    "before, after",
    [
        ((2, 4, 0), (2, 4, 0)),  # (world, per-rank batch, workers): same topology
        ((2, 4, 2), (2, 4, 1)),  # other worker count
        ((1, 6, 0), (3, 2, 2)),  # 1 -> 3 ranks, global batch 6 kept
        ((3, 2, 1), (2, 3, 0)),  # 3 -> 2 ranks
    ],
)
def test_resume_mid_epoch_equals_uninterrupted(small_dataset, before, after):
    path, rows = small_dataset
    world, batch, workers = before
    order = expected_keys(rows, SEED, 0, BLOCK)
    full, _ = run_steps(make_loaders(path, world, batch, workers))
    assert full == (order * 2)[: len(full)] and len(order) <= len(full) < len(order) + world
    head, state = run_steps(make_loaders(path, world, batch, workers), steps=5)
    assert state["samples"] == 5 * world * batch
    tail, end_state = run_steps(make_loaders(path, *after, state=state))
    resumed = head + tail
    # the same global stream; only the wrapped tail's length depends on the final world size
    assert resumed == (order * 2)[: len(resumed)] and len(order) <= len(resumed) < len(order) + after[0]
    assert end_state["epoch"] == 1 and end_state["samples"] == 0


def test_repeated_resumes_and_epoch_boundary(small_dataset):
    path, rows = small_dataset
    reference = []
    for epoch in range(2):
        part, _ = run_steps(make_loaders(path, 2, 4, 0, epoch=epoch))
        reference.extend(part)
    stream, state = [], None
    for steps, topology in [(3, (2, 4, 1)), (4, (1, 8, 2)), (100, (4, 2, 0)), (2, (2, 4, 2)), (None, (2, 4, 0))]:
        epoch = state["epoch"] if state else 0
        part, state = run_steps(make_loaders(path, *topology, state=state, epoch=epoch), steps=steps)
        stream.extend(part)
        if state["epoch"] == 2:
            break
    # the 100-step leg stopped exactly at the end of epoch 0; epoch 1 continued from its start
    assert stream == reference


def test_resume_with_webdataset_shards(small_dataset):
    path, rows = small_dataset
    order = expected_keys(rows, SEED, 0, BLOCK)
    head, state = run_steps(make_loaders(path, 2, 3, 2, fmt="webdataset"), steps=4)
    tail, _ = run_steps(make_loaders(path, 3, 2, 1, fmt="webdataset", state=state))
    assert head + tail == (order * 2)[: len(head) + len(tail)] and len(head) + len(tail) == 153


def test_direct_iteration_counts_what_it_yields(small_dataset):
    path, rows = small_dataset
    ds = ShardedDataset(path, batch_size=5, seed=SEED, shuffle_block_size=BLOCK)
    it = iter(ds)
    head = [next(it)["key"] for _ in range(10)]
    state = ds.state_dict()
    assert state["samples"] == 10
    ds2 = ShardedDataset(path, batch_size=5, seed=SEED, shuffle_block_size=BLOCK)
    ds2.load_state_dict(state)
    assert head + [e["key"] for e in ds2] == expected_keys(rows, SEED, 0, BLOCK)


def test_bad_states_are_refused(small_dataset, tmp_path):
    path, _ = small_dataset
    ds = ShardedDataset(path, batch_size=4, seed=SEED, shuffle_block_size=BLOCK)
    state = {**ds.state_dict(), "samples": 8}
    with pytest.raises(ValueError, match="seed"):
        ShardedDataset(path, batch_size=4, seed=SEED + 1, shuffle_block_size=BLOCK).load_state_dict(state)
    with pytest.raises(ValueError, match="fingerprint"):
        ShardedDataset(path, batch_size=4, seed=SEED, shuffle_block_size=BLOCK + 1).load_state_dict(state)
    with pytest.raises(ValueError, match="global batch size"):
        ShardedDataset(path, batch_size=4, seed=SEED, shuffle_block_size=BLOCK, rank=0,
                       world_size=3).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        ds.load_state_dict({"epoch": 0})


def test_state_after_the_last_batch_is_the_next_epoch(small_dataset):
    path, rows = small_dataset
    ds = ShardedDataset(path, batch_size=50, seed=SEED, shuffle_block_size=BLOCK)
    loader = make_dataloader(ds, collate_fn=batch_keys, num_workers=1)
    batches = [batch for _, batch in zip(range(4), loader, strict=False)]  # stops right at the last batch
    assert len(batches) == 4 and loader.state_dict()["epoch"] == 1 and loader.state_dict()["samples"] == 0
    assert [k for b in loader for k in b] == expected_keys(rows, SEED, 1, BLOCK)
