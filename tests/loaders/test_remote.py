"""Remote datasets (any fsspec URL): shards cached locally, verified while they download."""

from __future__ import annotations

import os

import fsspec
import pytest
from conftest import write_dataset

from loaders import ShardedDataset, ShardIntegrityError


def upload(local, url):
    fs = fsspec.filesystem("memory")
    for dirpath, _, names in os.walk(local):
        for name in names:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, local)
            with open(path, "rb") as handle:
                fs.pipe(f"{url}/{rel}", handle.read())
    return fs


def test_remote_dataset_reads_like_the_local_one(tmp_path):
    local = write_dataset(tmp_path / "local", [6, 5])
    upload(local, "memory://bucket/ds")
    remote = ShardedDataset("memory://bucket/ds", cache_dir=str(tmp_path / "cache"), batch_size=2)
    assert [e["key"] for e in remote] == [e["key"] for e in ShardedDataset(local, batch_size=2)]
    cached = [os.path.join(d, n) for d, _, names in os.walk(tmp_path / "cache") for n in names]
    assert len(cached) == 2 and all(p.endswith(".arrow") for p in cached)
    tar = ShardedDataset("memory://bucket/ds", cache_dir=str(tmp_path / "cache"), fmt="webdataset")
    assert sorted(e["key"] for e in tar) == sorted(e["key"] for e in remote)


def test_corrupt_download_is_refused_and_not_cached(tmp_path):
    local = write_dataset(tmp_path / "local", [4])
    fs = upload(local, "memory://bucket/bad")
    name = "train/arrow/data-00000-of-00001.arrow"
    data = bytearray(fs.cat_file(f"memory://bucket/bad/{name}"))
    data[-100] ^= 0xFF
    fs.pipe(f"memory://bucket/bad/{name}", bytes(data))
    with pytest.raises(ShardIntegrityError, match=f"shard {name} downloaded from .*sha256"):
        list(ShardedDataset("memory://bucket/bad", cache_dir=str(tmp_path / "cache")))
    assert not any(n.endswith(".arrow") for _, _, names in os.walk(tmp_path / "cache") for n in names)


def test_remote_without_manifest(tmp_path):
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        ShardedDataset("memory://bucket/absent", cache_dir=str(tmp_path))
