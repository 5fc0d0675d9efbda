"""ShardedDataset through real DataLoaders: the split over ranks and workers, formats, epochs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import batch_keys, expected_keys

from loaders import ShardedDataset, make_dataloader
from loaders.access.reader import iter_examples

BLOCK = 64  # several blocks in the 151-row synthetic dataset


def rank_streams(path, world, workers, *, batch=4, epoch=0, fmt="arrow", uneven="drop", **kw):
    """Each rank's keys for one epoch, through make_dataloader."""
    streams = []
    for rank in range(world):
        ds = ShardedDataset(path, batch_size=batch, seed=3, shuffle_block_size=BLOCK, fmt=fmt, rank=rank,
                            world_size=world, uneven=uneven, **kw)
        ds.set_epoch(epoch)
        loader = make_dataloader(ds, collate_fn=batch_keys, num_workers=workers)
        streams.append([key for batch_ in loader for key in batch_])
    return streams


def interleave(streams):
    """The global stream: rank r's j-th sample is global index r + j*W."""
    world = len(streams)
    out = [None] * (len(streams[0]) * world)
    for rank, stream in enumerate(streams):
        out[rank::world] = stream
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_ranks_and_workers_partition_the_epoch(small_dataset, world, workers):
    path, rows = small_dataset
    full = expected_keys(rows, seed=3, epoch=1, block_size=BLOCK)
    streams = rank_streams(path, world, workers, epoch=1, uneven="drop")
    assert len({len(s) for s in streams}) == 1  # equal counts
    merged = interleave(streams)
    assert merged == full[: len(merged)]  # exactly the epoch's order, no overlap
    assert len(merged) == len(full) - len(full) % world
    wrapped = interleave(rank_streams(path, world, workers, epoch=1, uneven="wrap"))
    assert wrapped == (full + full)[: len(wrapped)] and len(wrapped) == -(-len(full) // world) * world


def test_arrow_and_webdataset_give_the_same_stream(small_dataset):
    path, _ = small_dataset
    for world, workers in [(1, 0), (2, 2)]:
        arrow = rank_streams(path, world, workers, batch=3, uneven="wrap", fmt="arrow")
        tar = rank_streams(path, world, workers, batch=3, uneven="wrap", fmt="webdataset")
        assert arrow == tar


def test_examples_match_the_stored_rows(clm_dataset):
    stored = {e["key"]: e for e in iter_examples(clm_dataset)}
    ds = ShardedDataset(clm_dataset, batch_size=16, seed=1)
    seen = []
    for example in ds:
        np.testing.assert_array_equal(example["input_ids"], stored[example["key"]]["input_ids"])
        np.testing.assert_array_equal(example["doc_lengths"], stored[example["key"]]["doc_lengths"])
        seen.append(example["key"])
    assert sorted(seen) == sorted(stored)
    assert seen != list(stored)  # shuffled
    # zero-copy: rows are read-only views into the memory map
    assert not example["input_ids"].flags.writeable and example["input_ids"].base is not None


def test_dataloader_batches_and_epochs(clm_dataset):
    ds = ShardedDataset(clm_dataset, batch_size=32, seed=0)
    loader = make_dataloader(ds, num_workers=2)
    assert len(loader) == -(-2162 // 32)
    first = [b["input_ids"] for b in loader]
    assert first[0].shape == (32, 128) and first[0].dtype == torch.int64 and first[-1].shape == (2162 % 32, 128)
    assert ds.epoch == 1 and ds.samples_consumed == 0  # a finished epoch moves to the next
    second = [b["input_ids"] for b in loader]
    assert not torch.equal(first[0], second[0])  # a new order each epoch
    loader.set_epoch(0)
    assert torch.equal(next(iter(loader))["input_ids"], first[0])  # epochs are reproducible


def test_shuffle_off_and_validation_split(clm_dataset):
    stored = [e["key"] for e in iter_examples(clm_dataset, split="validation")]
    ds = ShardedDataset(clm_dataset, "validation", shuffle=False, batch_size=7)
    assert [e["key"] for e in ds] == stored


def test_persistent_workers_follow_set_epoch_and_resume(small_dataset):
    path, rows = small_dataset
    ds = ShardedDataset(path, batch_size=4, seed=3, shuffle_block_size=BLOCK, uneven="drop")
    loader = make_dataloader(ds, collate_fn=batch_keys, num_workers=2, persistent_workers=True)
    epoch0 = [k for b in loader for k in b]
    epoch1 = [k for b in loader for k in b]
    assert epoch0 == expected_keys(rows, 3, 0, BLOCK) and epoch1 == expected_keys(rows, 3, 1, BLOCK)
    loader.set_epoch(0)
    it = iter(loader)
    head = [k for _ in range(3) for k in next(it)]
    state = loader.state_dict()
    del it
    loader.load_state_dict(state)
    tail = [k for b in loader for k in b]
    assert head + tail == epoch0


def test_empty_split_yields_nothing_and_ends_the_epoch(tmp_path):
    from conftest import write_dataset

    path = write_dataset(tmp_path / "empty", [0, 0])
    ds = ShardedDataset(path, batch_size=2, rank=1, world_size=2)
    assert list(ds) == [] and len(ds) == 0 and ds.epoch == 1
    loader = make_dataloader(ds, num_workers=1)
    assert list(loader) == [] and ds.epoch == 2


def test_dataset_pickles_without_open_shards(small_dataset):
    import pickle

    path, rows = small_dataset
    ds = ShardedDataset(path, batch_size=4, seed=3, shuffle_block_size=BLOCK, fmt="webdataset")
    it = iter(ds)
    head = [next(it)["key"] for _ in range(5)]
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.shards._open == {} and copy._tar_rows == {}
    assert copy.state_dict() == ds.state_dict() and copy.samples_consumed == 5
    # a fresh pass starts the epoch again; a loaded state resumes where the original stood
    assert [e["key"] for e in copy] == expected_keys(rows, 3, 0, BLOCK) and copy.epoch == 1
    copy.load_state_dict(ds.state_dict())
    assert head + [e["key"] for e in copy] == expected_keys(rows, 3, 0, BLOCK)
    assert ds.samples_consumed == 5  # the copy's progress is its own
