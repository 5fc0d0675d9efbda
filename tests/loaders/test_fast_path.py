"""The columnar fast path (ExampleBatch gathers) and batch groups give exactly the batches of the
per-example path, in the same order, and resume exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TOKENIZER, expected_keys, write_dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders import (
    CausalCollator,
    ExampleBatch,
    MLMCollator,
    PrefixLMCollator,
    Ragged,
    Seq2SeqCollator,
    ShardedDataset,
    StackCollator,
    make_dataloader,
)
from loaders.access.segment_table import SegmentTable
from loaders.streaming.state import RankSchedule, samples_per_rank

BLOCK = 64


def plain_rows(examples):
    """Per-example collate: copies of every value (module level: picklable)."""
    return [{k: (np.array(v) if isinstance(v, np.ndarray) else v) for k, v in e.items()} for e in examples]


class ColumnarRows:
    """The same, declared columnar: receives ExampleBatch objects on the fast path."""

    accepts_example_batch = True

    def __init__(self):
        self.kinds = set()

    def __call__(self, examples):
        self.kinds.add(type(examples).__name__)
        return plain_rows(examples)


def same_rows(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], np.ndarray):
                assert x[key].dtype == y[key].dtype and np.array_equal(x[key], y[key]), key
            else:
                assert type(x[key]) is type(y[key]) and x[key] == y[key], key


def same_tensors(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.fixture(scope="module", params=["decoder", "encoder", "seq2seq"])
def family_dataset(request, tmp_path_factory):
    rows = [37, 0, 50, 23, 41]
    path = write_dataset(tmp_path_factory.mktemp(request.param), rows, family=request.param, seq_len=8,
                         formats=("arrow",), tokenizer=TOKENIZER)
    return path, rows, request.param


def batches(path, collate, *, world=1, rank=0, workers=0, batch=4, group=8, state=None, epoch=0, **kw):
    ds = ShardedDataset(path, batch_size=batch, seed=5, shuffle_block_size=BLOCK, rank=rank, world_size=world, **kw)
    loader = make_dataloader(ds, collate_fn=collate, num_workers=workers, group_batches=group)
    if state is not None:
        loader.load_state_dict(state)
    loader.set_epoch(epoch)
    return loader, list(loader)


@pytest.mark.parametrize("world,workers,group", [(1, 0, 8), (1, 2, 3), (2, 1, 1), (3, 2, 8)])
def test_columnar_batches_equal_per_example_batches(family_dataset, world, workers, group):
    path, rows, _ = family_dataset
    for rank in range(world):
        for uneven in ("drop", "wrap"):
            columnar = ColumnarRows()
            _, fast = batches(path, columnar, world=world, rank=rank, workers=workers, group=group, uneven=uneven,
                              epoch=1)
            _, slow = batches(path, plain_rows, world=world, rank=rank, workers=workers, group=1, uneven=uneven,
                              epoch=1)
            assert len(fast) == len(slow) > 0
            for a, b in zip(fast, slow, strict=True):
                same_rows(a, b)
            if workers == 0:  # the collate function ran here: it saw column batches
                assert columnar.kinds == {"ExampleBatch"}


def test_columnar_stream_is_the_epoch_order(small_dataset):
    path, rows = small_dataset
    full = expected_keys(rows, seed=5, epoch=2, block_size=BLOCK)
    _, got = batches(path, ColumnarRows(), batch=5, epoch=2, workers=2, group=2)
    assert [e["key"] for b in got for e in b] == full


def test_columns_subset_and_dynamic_fall_back(small_dataset):
    path, _ = small_dataset
    _, fast = batches(path, ColumnarRows(), columns=["input_ids"])
    _, slow = batches(path, plain_rows, columns=["input_ids"], group=1)
    assert all(list(e) == ["input_ids"] for b in fast for e in b)
    for a, b in zip(fast, slow, strict=True):
        same_rows(a, b)
    wds, arrow = ColumnarRows(), ColumnarRows()
    _, tar = batches(path, wds, fmt="webdataset")  # no column gathers from tars: lists, the same stream
    _, columns = batches(path, arrow)
    assert wds.kinds == {"list"} and arrow.kinds == {"ExampleBatch"}
    for a, b in zip(tar, columns, strict=True):
        same_rows(a, b)


@pytest.mark.parametrize("stop_workers,resume_workers,world", [(2, 0, 1), (0, 2, 1), (1, 2, 2)])
def test_columnar_resume_is_exact(small_dataset, stop_workers, resume_workers, world):
    path, _ = small_dataset

    def keys(workers, state=None, steps=None):
        streams, states = [], []
        for rank in range(world):
            ds = ShardedDataset(path, batch_size=3, seed=5, shuffle_block_size=BLOCK, rank=rank, world_size=world)
            loader = make_dataloader(ds, collate_fn=StackKeys(), num_workers=workers, group_batches=4)
            if state is not None:
                loader.load_state_dict(state)
            it = iter(loader)
            got = [next(it) for _ in range(steps)] if steps is not None else list(it)
            streams.append([k for b in got for k in b])
            states.append(loader.state_dict())
        return streams, states

    full, _ = keys(0)
    head, states = keys(stop_workers, steps=5)
    assert all(s == states[0] for s in states)
    tail, _ = keys(resume_workers, state=states[0])
    assert [h + t for h, t in zip(head, tail, strict=True)] == full


class StackKeys:
    """Keys only, through the columnar path (module level: picklable)."""

    accepts_example_batch = True

    def __call__(self, examples):
        if isinstance(examples, ExampleBatch):
            return list(examples.column("key"))
        return [e["key"] for e in examples]


def test_collators_give_the_same_tensors_from_columns(family_dataset):
    path, _, family = family_dataset
    if family == "decoder":
        collators = [CausalCollator(0), CausalCollator(0, documents="position_ids", flash_attention_kwargs=True),
                     CausalCollator(0, documents="none"), CausalCollator(0, pad_to_multiple_of=16, shift_labels=True),
                     PrefixLMCollator(0, return_prefix_length=True),
                     StackCollator(["input_ids", "doc_lengths"], pad_id=0)]
    elif family == "encoder":
        collators = [MLMCollator(0), MLMCollator(0, pad_to_multiple_of=12), StackCollator(["input_ids", "labels"])]
    else:
        collators = [Seq2SeqCollator(0), Seq2SeqCollator(0, inputs_length=10, targets_length=6),
                     StackCollator(["inputs", "targets", "key"], pad_id=0)]
    for collate in collators:
        _, fast = batches(path, collate, batch=5)
        _, slow = batches(path, lambda examples, c=collate: c(list(examples)), batch=5)
        assert len(fast) == len(slow)
        for a, b in zip(fast, slow, strict=True):
            same_tensors(a, b)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), width=st.integers(1, 9), size=st.integers(1, 6), multiple=st.sampled_from([None, 4]))
def test_causal_document_segments_match_the_row_loop(data, width, size, multiple):
    """Ragged doc_lengths (with empty documents and padding): the vectorised segments are the loop's."""
    rows, docs = [], []
    for _ in range(size):
        real = data.draw(st.integers(0, width))
        cuts = sorted(data.draw(st.lists(st.integers(0, real), max_size=3)))
        lengths = np.diff([0, *cuts, real]).astype(np.int32)
        rows.append(np.arange(width, dtype=np.int32) + 5)
        docs.append(lengths)
    examples = [{"input_ids": r, "doc_lengths": d} for r, d in zip(rows, docs, strict=True)]
    column = ExampleBatch({"input_ids": np.stack(rows), "doc_lengths": Ragged.from_rows(docs, np.int32)}, size)
    for documents in ("position_ids", "mask", "none"):
        for shift in (True, False):
            collate = CausalCollator(0, documents=documents, shift_labels=shift, pad_to_multiple_of=multiple,
                                     flash_attention_kwargs=documents == "position_ids")
            same_tensors(collate(column), collate(examples))
    prefix = ExampleBatch({"input_ids": np.stack(rows), "prefix_length": np.arange(size, dtype=np.int32)}, size)
    same_tensors(PrefixLMCollator(0)(prefix), PrefixLMCollator(0)(list(prefix)))
    # packed prefix-LM: a prefix per document (empty documents' prefixes 0)
    prefixes = [np.array([data.draw(st.integers(0 if d == 0 else 1, max(d - 1, 1))) for d in row], np.int32)
                for row in docs]
    packed = ExampleBatch({"input_ids": np.stack(rows), "doc_lengths": Ragged.from_rows(docs, np.int32),
                           "prefix_lengths": Ragged.from_rows(prefixes, np.int32)}, size)
    for shift in (True, False):
        collate = PrefixLMCollator(0, shift_labels=shift, pad_to_multiple_of=multiple, return_prefix_length=True)
        same_tensors(collate(packed), collate(list(packed)))


def test_example_batch_is_a_sequence_of_examples():
    batch = ExampleBatch({"input_ids": np.arange(6, dtype=np.int32).reshape(3, 2), "prefix_length": np.array([1, 2, 3]),
                          "doc_lengths": Ragged.from_rows([np.array([2]), np.array([], np.int32), np.array([1, 1])]),
                          "key": ["a", "b", "c"]}, 3)
    assert len(batch) == 3 and batch.column("key") == ["a", "b", "c"]
    last = batch[-1]
    assert last["key"] == "c" and last["prefix_length"] == 3 and type(last["prefix_length"]) is int
    assert last["input_ids"].tolist() == [4, 5] and last["doc_lengths"].tolist() == [1, 1]
    assert batch[1]["doc_lengths"].tolist() == []
    assert [e["key"] for e in batch[1:]] == ["b", "c"] and [e["key"] for e in batch] == ["a", "b", "c"]
    assert list(batch)[0]["input_ids"].tolist() == [0, 1]
    with pytest.raises(IndexError):
        batch[3]
    assert batch.column("doc_lengths").lengths().tolist() == [1, 0, 2]


def test_stack_collator():
    examples = [{"input_ids": np.array([1, 2, 3], np.int32), "n": 4, "labels": np.array([7], np.int32)},
                {"input_ids": np.array([4, 5, 6], np.int32), "n": 5, "labels": np.array([8, 9], np.int32)}]
    out = StackCollator(["input_ids", "n", "labels"], pad_id=-1)(examples)
    assert out["input_ids"].dtype == torch.int32 and out["input_ids"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert out["n"].dtype == torch.int64 and out["n"].tolist() == [4, 5]
    assert out["labels"].tolist() == [[7, -1], [8, 9]]
    with pytest.raises(ValueError, match="no pad_id"):
        StackCollator(["labels"])(examples)
    with pytest.raises(Exception, match="missing"):
        StackCollator(["nope"])(examples)


def test_segment_table_row_by_row_fallback_is_the_same(small_dataset):
    """The strided window and the row-by-row copy (chosen with ``strided``) gather the same examples."""
    path, _ = small_dataset
    shards = ShardedDataset(path, seed=5).shards
    g = np.random.default_rng(0)
    ids = np.array([0, 2, 3, 4, 0, 4, 2, 3, 0], dtype=np.int64)
    rows = np.array([g.integers(0, n) for n in np.asarray(shards.rows)[ids]], dtype=np.int64)
    tables = [SegmentTable(len(shards.shards), strided=strided) for strided in (True, False)]
    for table in tables:
        for index in (3, 0, 4, 2):  # registered out of order: segments of different shards interleave
            table.register(index, shards.arrow(index))
    window, by_row = (t.gather(*t.locate(ids, rows), tuple(shards.columns)) for t in tables)
    assert tables[0]._window("input_ids") is not None and tables[1]._window("input_ids") is None
    same_rows(list(window), list(by_row))
    want = [shards.arrow(int(i)).take([int(r)])[0] for i, r in zip(ids, rows, strict=True)]
    same_rows(list(window), want)
    assert [e["key"] for e in window] == [f"s{i}-r{r}" for i, r in zip(ids, rows, strict=True)]


def test_workers_give_the_batches_of_the_main_process(small_dataset):
    path, _ = small_dataset
    collate = CausalCollator(0)
    _, here = batches(path, collate, workers=0, batch=3, group=1)
    _, workers = batches(path, collate, workers=2, batch=3, group=2)
    assert len(here) == len(workers) > 0
    for a, b in zip(workers, here, strict=True):
        same_tensors(a, b)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 200), world=st.integers(1, 4), batch=st.integers(1, 7), workers=st.integers(0, 3),
       group=st.integers(1, 5), uneven=st.sampled_from(["drop", "wrap"]), drop_last=st.booleans())
def test_worker_groups_partition_the_rank_batches(n, world, batch, workers, group, uneven, drop_last):
    for rank in range(world):
        schedule = RankSchedule(n, world, rank, batch, 0, uneven, drop_last, group)
        owned = []
        everything = np.arange(samples_per_rank(n, world, uneven) * world + world)
        for worker in range(max(workers, 1)):
            groups = list(schedule.worker_groups(worker, workers))
            assert all(0 < len(g) <= group for g in groups)
            mine = [b for g in groups for b in g]
            assert mine == list(schedule.worker_batches(worker, workers))
            owned += mine
            indices = [schedule.batch_stream_indices(b) for b in mine]
            flat = np.concatenate(indices) if indices else np.zeros(0, np.int64)
            assert np.array_equal(np.flatnonzero(schedule.owned_by(everything, worker, workers)), np.sort(flat))
            got, lengths = schedule.batches_stream_indices(mine)
            assert np.array_equal(got, flat) and lengths == [len(i) for i in indices]
        assert sorted(owned) == list(range(schedule.num_batches))


@pytest.mark.parametrize("group", [1, 3])
def test_a_workers_group_of_batches_crosses_as_one_storage_per_dtype(family_dataset, group):
    """Through workers a group's tensors are views of one storage per dtype (one shared-memory
    segment for the group, not one per batch), with the very values of the in-process batches."""
    path, _, family = family_dataset
    collate = {"decoder": CausalCollator, "encoder": MLMCollator, "seq2seq": Seq2SeqCollator}[family]
    _, here = batches(path, collate(pad_id=0), group=group)
    _, there = batches(path, collate(pad_id=0), workers=1, group=group)
    assert len(here) == len(there) > 1
    for a, b in zip(here, there, strict=True):
        same_tensors(a, b)
    for start in range(0, len(there), group):
        storages = {}
        for batch in there[start:start + group]:
            for value in batch.values():
                if isinstance(value, torch.Tensor):
                    storages.setdefault(value.dtype, set()).add(value.untyped_storage().data_ptr())
        assert storages and all(len(pointers) == 1 for pointers in storages.values()), storages


def test_packing_a_group_keeps_values_shapes_and_other_values():
    from loaders.streaming.dataloader import _one_storage_per_dtype

    first = {"a": torch.arange(6).view(2, 3), "b": torch.ones(4, dtype=torch.float32), "n": 7}
    second = {"a": torch.arange(4).view(2, 2) + 10, "b": torch.zeros(2, dtype=torch.float32), "n": 8}
    packed = _one_storage_per_dtype([first, second])
    for original, got in zip((first, second), packed, strict=True):
        same_tensors(original, got)
    assert packed[0]["a"].untyped_storage().data_ptr() == packed[1]["a"].untyped_storage().data_ptr()
    assert packed[0]["b"].untyped_storage().data_ptr() == packed[1]["b"].untyped_storage().data_ptr()
    assert _one_storage_per_dtype(["not a dict"]) == ["not a dict"]
