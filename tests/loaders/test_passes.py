"""Passes and epochs as training loops meet them: epochs advance through plain DataLoaders with
workers, a fresh ``iter()`` restarts the epoch unless a state was loaded, and torchdata's
``StatefulDataLoader`` resumes exactly with workers (per-worker states)."""

from __future__ import annotations

import itertools

import pytest
from conftest import batch_keys, expected_keys
from torch.utils.data import DataLoader

from loaders import ShardedDataset, make_dataloader

BLOCK = 64
SEED = 3


def dataset(path, batch=4, **kw):
    return ShardedDataset(path, batch_size=batch, seed=SEED, shuffle_block_size=BLOCK, uneven="drop", **kw)


def keys(loader, limit=None):
    """The keys of a pass (of its first ``limit`` batches: the loop then stops, as after a ``break``)."""
    return [key for batch in itertools.islice(loader, limit) for key in batch]


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_plain_dataloader_advances_epochs_without_set_epoch(small_dataset, workers, persistent):
    path, rows = small_dataset
    ds = dataset(path)
    loader = DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=batch_keys, persistent_workers=persistent)
    for epoch in range(3):
        assert keys(loader) == expected_keys(rows, SEED, epoch, BLOCK)  # each epoch's own order, in full
    assert ds.epoch == 3 and ds.state_dict()["epoch"] == 3 and ds.state_dict()["samples"] == 0
    ds.set_epoch(1)
    assert keys(loader) == expected_keys(rows, SEED, 1, BLOCK)


@pytest.mark.parametrize("workers", [0, 2])
def test_fresh_iteration_restarts_the_epoch(small_dataset, workers):
    path, rows = small_dataset
    order = expected_keys(rows, SEED, 0, BLOCK)
    ours = make_dataloader(dataset(path), collate_fn=batch_keys, num_workers=workers)
    plain_ds = dataset(path)
    plain = DataLoader(plain_ds, batch_size=4, num_workers=workers, collate_fn=batch_keys)
    for loader in (ours, plain):
        for _ in range(2):  # an evaluation loop that stops early sees the same batches each time
            assert keys(loader, limit=3) == order[:12]
    state = ours.state_dict()  # ... while the state still says where the trainer stopped
    assert (state["epoch"], state["samples"]) == (0, 12)
    assert keys(ours) == order and ours.state_dict()["epoch"] == 1
    ours.load_state_dict(state)  # a loaded state is where the next pass resumes, once
    assert keys(ours) == order[12:] and keys(ours) == expected_keys(rows, SEED, 1, BLOCK)
    direct = dataset(path)
    head = [e["key"] for _, e in zip(range(5), direct, strict=False)]
    assert head == order[:5] and [e["key"] for e in direct] == order  # direct iteration too


def test_plain_dataloader_with_workers_refuses_a_state_it_cannot_know(small_dataset):
    path, _ = small_dataset
    ds = dataset(path)
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=batch_keys)
    it = iter(loader)
    next(it)
    with pytest.raises(ValueError, match="make_dataloader"):
        ds.state_dict()
    del it
    keys(loader)  # a full pass: its end is known
    assert (ds.state_dict()["epoch"], ds.state_dict()["samples"]) == (1, 0)


@pytest.mark.parametrize("workers, snapshot_every", [(2, 1), (2, 3), (0, 1)])
def test_stateful_dataloader_resumes_exactly(small_dataset, workers, snapshot_every):
    from torchdata.stateful_dataloader import StatefulDataLoader

    path, rows = small_dataset

    def loader(ds):
        return StatefulDataLoader(ds, batch_size=4, num_workers=workers, collate_fn=batch_keys,
                                  snapshot_every_n_steps=snapshot_every)

    full = keys(loader(dataset(path)))
    assert full == expected_keys(rows, SEED, 0, BLOCK)
    for stop in (1, 5, 7):
        first = loader(dataset(path))
        it = iter(first)
        head = [k for _ in range(stop) for k in next(it)]
        state = first.state_dict()
        del it
        resumed = loader(dataset(path))  # a new process would build everything anew
        resumed.load_state_dict(state)
        tail = keys(resumed)
        assert head + tail == full, stop
        assert keys(resumed) == expected_keys(rows, SEED, 1, BLOCK)  # and then the next epoch


def test_stateful_dataloader_saved_at_an_epoch_end_resumes_with_the_next_epoch(small_dataset):
    from torchdata.stateful_dataloader import StatefulDataLoader

    path, rows = small_dataset
    first = StatefulDataLoader(dataset(path), batch_size=4, num_workers=2, collate_fn=batch_keys)
    assert keys(first) == expected_keys(rows, SEED, 0, BLOCK)
    state = first.state_dict()
    resumed = StatefulDataLoader(dataset(path), batch_size=4, num_workers=2, collate_fn=batch_keys)
    resumed.load_state_dict(state)
    assert keys(resumed) == expected_keys(rows, SEED, 1, BLOCK)


def test_worker_states_name_their_worker(small_dataset):
    from torchdata.stateful_dataloader import StatefulDataLoader

    path, _ = small_dataset
    first = StatefulDataLoader(dataset(path), batch_size=4, num_workers=2, collate_fn=batch_keys)
    it = iter(first)
    next(it)
    state = first.state_dict()
    del it
    worker_state = state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    assert worker_state["worker"] == {"id": 0, "num_workers": 2, "examples": 4}
    with pytest.raises(ValueError, match="same num_workers"):
        dataset(path).load_state_dict(worker_state)  # a worker's state is not the main process's


def test_lightning_sets_the_loader_epoch_through_its_sampler(small_dataset):
    """Lightning calls set_epoch on a loader's sampler at each epoch (lightning's own helper here),
    so with limit_train_batches each epoch reads its own first batches."""
    from lightning.fabric.utilities.data import _set_sampler_epoch

    path, rows = small_dataset
    loader = make_dataloader(dataset(path), collate_fn=batch_keys, num_workers=0)
    for epoch in range(3):
        _set_sampler_epoch(loader, epoch)
        assert keys(loader, limit=2) == expected_keys(rows, SEED, epoch, BLOCK)[:8]
    assert loader.stream.epoch == 2
