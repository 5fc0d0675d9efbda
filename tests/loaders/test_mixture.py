"""Weighted mixtures: exact quotas, determinism, split over ranks/workers, resume."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
from conftest import TOKENIZER, batch_keys, write_dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders import MixtureDataset, ShardedDataset, make_dataloader
from loaders.collation.collate_decoder import PrefixLMCollator
from loaders.mixture import mixture_window


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    big = write_dataset(root / "big", [60, 40], formats=("arrow",), tokenizer=TOKENIZER)
    small = write_dataset(root / "small", [7, 5], seq_len=6, formats=("arrow",), tokenizer=TOKENIZER)
    return big, small


def mixture(paths, weights=(0.7, 0.3), *, rank=0, world=1, batch=4, samples=150, **kw):
    sources = [ShardedDataset(p, seed=i + 1, shuffle_block_size=32) for i, p in enumerate(paths)]
    return MixtureDataset(sources, weights, batch_size=batch, samples_per_epoch=samples, seed=4, window=20, rank=rank,
                          world_size=world, **kw)


def keyed(path_index, example):
    return f"{path_index}:{example['key']}"


@settings(max_examples=60, deadline=None)
@given(weights=st.lists(st.floats(0.01, 1.0), min_size=1, max_size=4), window=st.integers(1, 64),
       index=st.integers(0, 10_000))
def test_windows_hold_exact_quotas(weights, window, index):
    shares = [Fraction(w) / sum(Fraction(v) for v in weights) for w in weights]
    cumulative = list(np.cumsum(shares))
    window = max(window, math.ceil(2 / min(shares)))

    def quota(i, total):  # samples of source i among the first `total`
        end = total if i == len(shares) - 1 else math.floor(cumulative[i] * total)
        return end - (math.floor(cumulative[i - 1] * total) if i else 0)

    sources, counts = mixture_window(cumulative, window, 3, index)
    for i, share in enumerate(shares):
        mine = sorted(counts[sources == i].tolist())
        assert mine == list(range(quota(i, index * window), quota(i, (index + 1) * window)))
        assert abs(quota(i, (index + 1) * window) - share * (index + 1) * window) < 1


def test_mixture_proportions_and_reshuffled_passes(two_sources):
    ds = mixture(two_sources, samples=400)
    sources, counts = ds.locate(0, np.arange(400))
    assert np.count_nonzero(sources == 0) == 280 and np.count_nonzero(sources == 1) == 120
    keys = [e["key"] for e in ds]
    small = [k for k, s in zip(keys, sources.tolist(), strict=True) if s == 1]
    # the 12-row source is read ten times, each pass a full permutation in its own order
    passes = [small[i : i + 12] for i in range(0, 120, 12)]
    assert all(sorted(p) == sorted(passes[0]) for p in passes) and passes[0] != passes[1]


@pytest.mark.parametrize("world, workers", [(1, 0), (2, 2), (3, 1)])
def test_mixture_split_equals_single_process_stream(two_sources, world, workers):
    reference = [e["key"] for e in mixture(two_sources)]
    streams = []
    for rank in range(world):
        loader = make_dataloader(mixture(two_sources, rank=rank, world=world), collate_fn=batch_keys,
                                 num_workers=workers)
        streams.append([k for b in loader for k in b])
    assert len({len(s) for s in streams}) == 1
    merged = [None] * (len(streams[0]) * world)
    for rank, stream in enumerate(streams):
        merged[rank::world] = stream
    assert merged == (reference * 2)[: len(merged)]


def test_mixture_resume(two_sources):
    full = [k for b in make_dataloader(mixture(two_sources), collate_fn=batch_keys, num_workers=0) for k in b]
    loader = make_dataloader(mixture(two_sources), collate_fn=batch_keys, num_workers=2)
    it = iter(loader)
    head = [k for _ in range(7) for k in next(it)]
    state = loader.state_dict()
    assert state["samples"] == 28 and state["kind"] == "MixtureDataset"
    resumed = make_dataloader(mixture(two_sources, batch=2, world=2, rank=0), collate_fn=batch_keys, num_workers=1)
    other = make_dataloader(mixture(two_sources, batch=2, world=2, rank=1), collate_fn=batch_keys, num_workers=0)
    resumed.load_state_dict(state)
    other.load_state_dict(state)
    ranks = [[k for b in resumed for k in b], [k for b in other for k in b]]
    tail = [k for pair in zip(*ranks, strict=True) for k in pair]
    assert head + tail == full
    with pytest.raises(ValueError, match="fingerprint"):
        mixture(two_sources, weights=(0.6, 0.4)).load_state_dict(state)


def test_clm_and_prefix_lm_mix_in_one_batch(two_sources, clm_dataset):
    clm = ShardedDataset(clm_dataset)
    prefix = ShardedDataset(clm_dataset, objective="prefix_lm", objective_params={"seq_len": 128})
    ds = MixtureDataset([clm, prefix], [0.7, 0.3], batch_size=10, seed=1)
    loader = make_dataloader(ds, num_workers=0, return_prefix_length=True)
    assert type(loader.collate_fn) is PrefixLMCollator
    batch = next(iter(loader))
    sources, _ = ds.locate(0, np.arange(10))
    assert batch["attention_mask"].shape == (10, 1, 128, 128)
    assert torch.equal(batch["prefix_length"] == 0, torch.from_numpy(sources == 0))  # clm rows: plain causal
    assert 0 < (sources == 1).sum() < 10


def test_mixture_arguments_are_checked(two_sources, clm_dataset):
    big, small = two_sources
    with pytest.raises(ValueError, match="one weight per source"):
        MixtureDataset([ShardedDataset(big)], [0.5, 0.5])
    with pytest.raises(ValueError, match="> 0"):
        MixtureDataset([ShardedDataset(big), ShardedDataset(small)], [1.0, 0.0])
    with pytest.raises(ValueError, match="fmt='arrow'"):
        MixtureDataset([ShardedDataset(clm_dataset, fmt="webdataset")], [1.0])
    assert torch.is_tensor(next(iter(make_dataloader(mixture(two_sources), num_workers=0)))["input_ids"])
