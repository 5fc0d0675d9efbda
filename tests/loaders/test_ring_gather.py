"""Batches gathered straight into a worker's shared-memory slot (RingSender.reserve/allocate), the
block layout the main process cuts tensors from, and the safety of both."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

import loaders.dataloader as dataloader_module
import loaders.stream as stream_module
from loaders import CausalCollator, ExampleBatch, ShardedDataset, StackCollator, make_dataloader, transport
from loaders.batch import keeps_no_examples
from loaders.shards import SegmentTable
from loaders.transport import RingReceiver, RingSender

BLOCK = 64


@pytest.fixture
def copies(monkeypatch):
    """Counts the tensors a RingSender copies into its slots."""
    count = [0]
    original = transport._as_bytes

    def counted(tensor):
        count[0] += 1
        return original(tensor)

    monkeypatch.setattr(transport, "_as_bytes", counted)
    return count


@pytest.fixture
def as_worker(monkeypatch):
    """Run the loader's worker side in this process: DataLoader worker 0 of ``num_workers``."""

    def enter(num_workers: int = 2, worker: int = 0):
        info = types.SimpleNamespace(id=worker, num_workers=num_workers)
        monkeypatch.setattr(dataloader_module, "get_worker_info", lambda: info)
        monkeypatch.setattr(stream_module, "get_worker_info", lambda: info)

    return enter


def check(got, want):
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for key in want:
            check(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for x, y in zip(got, want, strict=True):
            check(x, y)
    else:
        assert got == want


def gathered_group(sender, seed, batches=3):
    """A group whose int32 columns were gathered into the reserved slot (as SegmentTable.gather does)."""
    g = np.random.default_rng(seed)
    out = []
    for i in range(batches):
        values = g.integers(0, 1000, (4, 6)).astype(np.int32)
        target = sender.allocate(values.shape, values.dtype)
        if target is None:
            target = np.empty_like(values)
        target[...] = values
        tokens = torch.from_numpy(target)
        out.append({"input_ids": tokens, "labels": tokens.to(torch.int64) + i, "head": tokens[:, :2],
                    "rows": tokens[1:3], "same": tokens, "n": i, "empty": torch.zeros(0, dtype=torch.int16),
                    "scalar": torch.tensor(seed + i, dtype=torch.float32)})
    return out


def cloned(group):
    return [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()} for batch in group]


def test_tensors_gathered_into_the_slot_travel_without_a_copy(copies):
    sender, receiver = RingSender(worker=0, slots=3), RingReceiver()
    sender.reserve()  # no arena yet: nothing to allocate, the first group sizes the slots
    first = gathered_group(sender, 0)
    item = sender.pack(first)
    assert item[0] == "ring" and copies[0] == 3 * 7  # every tensor copied (empty ones too)
    check(receiver.unpack(item), cloned(first))
    for seed in range(1, 6):
        sender.reserve()
        group = gathered_group(sender, seed)
        want = cloned(group)
        copies[0] = 0
        item = sender.pack(group)
        assert item[0] == "ring"
        # input_ids, same and rows lie in the slot as they are; labels, head (not contiguous),
        # empty and scalar are copied in behind them
        assert copies[0] == 3 * 4
        got = receiver.unpack(item)
        check(got, want)
        # a column of the group is one block: the batches' input_ids are views of one tensor
        assert got[0]["input_ids"].untyped_storage().data_ptr() == got[2]["input_ids"].untyped_storage().data_ptr()
        del got
    assert receiver.stats == {"ring": 6, "plain": 0}


def test_a_reserved_slot_is_never_one_the_trainer_holds():
    sender, receiver = RingSender(worker=0, slots=2), RingReceiver()
    sender.reserve()
    receiver.unpack(sender.pack(gathered_group(sender, 0)))  # released at once (not kept)
    held, wants = [], []
    for seed in range(1, 5):
        sender.reserve()
        group = gathered_group(sender, seed)
        wants.append(cloned(group))
        item = sender.pack(group)
        held.append(receiver.unpack(item))
        if seed >= 3:  # both slots held: nothing could be reserved; the gathers went elsewhere
            assert item[0] == "plain"
            arena = sender.arena.numpy()
            low, high = arena.__array_interface__["data"][0], arena.__array_interface__["data"][0] + arena.nbytes
            assert all(not low <= v.data_ptr() < high for b in held[-1] for v in b.values()
                       if isinstance(v, torch.Tensor) and v.numel())
    for got, want in zip(held, wants, strict=True):
        check(got, want)


def test_a_group_that_outgrows_its_slot_goes_the_torch_way_with_its_own_copies():
    sender, receiver = RingSender(worker=0, slots=2), RingReceiver()
    sender.reserve()
    receiver.unpack(sender.pack(gathered_group(sender, 0, batches=1)))
    sender.reserve()
    group = gathered_group(sender, 1, batches=1)
    group[0]["big"] = torch.ones(sender.slot_bytes)  # cannot fit behind the gathered rows
    want = cloned(group)
    item = sender.pack(group)
    assert item[0] == "plain"
    arena = sender.arena.numpy()
    low = arena.__array_interface__["data"][0]
    assert all(not low <= v.data_ptr() < low + arena.nbytes for v in item[1][0].values()
               if isinstance(v, torch.Tensor) and v.numel())
    sender.reserve()  # the slot is free again and is written over
    overwrite = gathered_group(sender, 2, batches=1)
    receiver.unpack(sender.pack(overwrite))
    check(receiver.unpack(item), want)


def test_segment_table_gathers_into_given_memory(small_dataset, monkeypatch):
    path, _ = small_dataset
    ds = ShardedDataset(path, batch_size=5, seed=5, shuffle_block_size=BLOCK)
    shards = ds.shards
    g = np.random.default_rng(0)
    ids = np.array([0, 2, 3, 4, 0, 4, 2], dtype=np.int64)
    rows = np.array([g.integers(0, n) for n in np.asarray(shards.rows)[ids]], dtype=np.int64)
    segments, local = shards.segments(ids, rows)
    columns = tuple(shards.columns)
    want = shards.gather(segments, local, columns)
    memory = []

    def allocate(shape, dtype):
        memory.append(np.full(shape, -1, dtype=dtype))
        return memory[-1]

    def same(a: ExampleBatch, b: ExampleBatch):
        assert a.columns.keys() == b.columns.keys()
        for name in a.columns:
            x, y = a.columns[name], b.columns[name]
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype and np.array_equal(x, y), name
            elif isinstance(x, list):
                assert x == y
            else:
                assert np.array_equal(x.offsets, y.offsets) and np.array_equal(x.values, y.values)

    got = shards.gather(segments, local, columns, allocate)
    same(got, want)
    assert len(memory) == 1 and got.column("input_ids") is memory[0]  # the fixed-length column
    monkeypatch.setattr("loaders.shards._TORCH_GATHER_DTYPES", frozenset())  # numpy's way into the memory
    shards._table._torch_windows.clear()
    same(shards.gather(segments, local, columns, allocate), want)
    monkeypatch.setattr(SegmentTable, "_window", lambda self, name: None)  # row by row into the memory
    same(shards.gather(segments, local, columns, allocate), want)
    same(shards.gather(segments, local, columns, lambda shape, dtype: None), want)  # no room: new arrays


def test_only_collators_that_keep_no_examples_get_them_in_shared_memory():
    assert keeps_no_examples(StackCollator()) and keeps_no_examples(CausalCollator(0))
    assert not keeps_no_examples(lambda examples: examples)

    class Keeps:
        accepts_example_batch = True

    assert not keeps_no_examples(Keeps())


class HoldsRows:
    """A columnar collator that keeps the batches it was given (as a carry-over would): they must not
    change under it (it is not declared ``retains_examples = False``)."""

    accepts_example_batch = True

    def __init__(self):
        self.seen = []

    def __call__(self, examples):
        for batch, copy in self.seen:
            assert np.array_equal(batch.column("input_ids"), copy)
        ids = examples.column("input_ids")
        self.seen.append((examples, np.array(ids)))
        return {"ids": torch.from_numpy(ids)}


@pytest.mark.parametrize("collate", [StackCollator(["input_ids", "doc_lengths"], pad_id=0), CausalCollator(0),
                                     CausalCollator(0, documents="position_ids", flash_attention_kwargs=True),
                                     HoldsRows()], ids=["stack", "causal", "causal-flash", "holds-rows"])
@pytest.mark.parametrize("keep", [False, True], ids=["drop", "keep"])
def test_worker_side_ring_gives_the_batches_of_the_plain_path(small_dataset, as_worker, copies, collate, keep):
    """The worker's items (gathered into the slots) unpacked here equal the batches a loader without
    workers yields, whether the trainer drops each batch or keeps them all (the ring then fills)."""
    path, _ = small_dataset
    reference = ShardedDataset(path, batch_size=4, seed=5, shuffle_block_size=BLOCK)
    plain = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
             for b in make_dataloader(reference, collate_fn=collate, num_workers=0, group_batches=1)]
    for worker in range(2):
        want = [b for g in range(worker, -(-len(plain) // 3), 2) for b in plain[g * 3 : g * 3 + 3]]
        ds = ShardedDataset(path, batch_size=4, seed=5, shuffle_block_size=BLOCK)
        loader = make_dataloader(ds, collate_fn=collate, num_workers=2, group_batches=3)
        as_worker(num_workers=2, worker=worker)
        if isinstance(collate, HoldsRows):
            collate.seen = []
        receiver, got, kept = RingReceiver(), [], []
        copies[0] = 0
        for item in loader._inner.dataset:
            batches = receiver.unpack(item)
            got += [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in batches]
            if keep:
                kept += batches
        assert len(got) == len(want) > 0
        for a, b in zip(got, want, strict=True):
            check(a, b)
        if keep:
            for a, b in zip(kept, want, strict=True):  # what the trainer kept was never written over
                check(a, b)
            assert receiver.stats["plain"] > 0
        else:
            assert receiver.stats["plain"] == 0
            if isinstance(collate, StackCollator):  # input_ids gathered into the slot: only doc_lengths copied
                groups = receiver.stats["ring"]
                assert groups > 1 and copies[0] == len(got) + 3  # (the first group, before the ring, copies both)
            if isinstance(collate, CausalCollator) and collate.flash_attention_kwargs:
                # built in the slot but cu_seq_lens_q/k, which are copied there (the first group copies all 5)
                assert receiver.stats["ring"] > 1 and copies[0] == 2 * len(got) + 3 * 3
            elif isinstance(collate, CausalCollator):  # every tensor (the 4-D mask too) built in the slot
                assert receiver.stats["ring"] > 1 and copies[0] == 4 * 3
