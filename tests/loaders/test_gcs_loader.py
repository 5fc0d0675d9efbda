"""The loader streaming a dataset from gs:// (a real local GCS server, through gcsfs) into a
size-bounded, checksum-verified local cache that prefetches the next shards.

The dataset is written to gs:// by the pipeline itself, with the arguments of the local
``clm_dataset`` fixture, so the remote stream must equal the local one exactly.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, SAMPLE_GLOB, TOKENIZER, batch_keys

from loaders import ShardedDataset, ShardIntegrityError, make_dataloader
from loaders.access.cache import ShardCache

BUCKET = "lmshards-loader"
# The arguments of the clm_dataset fixture (tests/loaders/conftest.py).
ARGS = ["--input", SAMPLE_GLOB, "--tokenizer", TOKENIZER, "--objective", "clm", "--seq-len", "128",
        "--formats", "arrow,webdataset", "--num-shards", "4", "--validation-fraction", "0.05"]
BLOCK = 64  # rows per shuffle block: a block spans at most two shards, so a small cache can work


@pytest.fixture(scope="module")
def gcs():
    from gcs_emulator import start_emulator

    emulator = start_emulator(BUCKET)
    yield emulator
    emulator.stop()
    os.environ.pop("STORAGE_EMULATOR_HOST", None)


@pytest.fixture(scope="module")
def remote_url(gcs) -> str:
    from pipelines.materialize import run

    url = f"gs://{BUCKET}/out"
    run(["--output", url, *ARGS])
    return url


def cache_files(root) -> dict[str, int]:
    """Every file under a cache directory (partial downloads included) -> bytes."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            try:
                out[path] = os.path.getsize(path)
            except FileNotFoundError:  # renamed or evicted by the prefetch thread meanwhile
                pass
    return out


def assert_same_stream(got, expected):
    assert [e["key"] for e in got] == [e["key"] for e in expected]
    for a, b in zip(got, expected, strict=True):
        assert sorted(a) == sorted(b)
        for name in a:
            np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))


def test_gs_dataset_has_the_bytes_of_the_local_run(remote_url, clm_dataset, tmp_path):
    remote = ShardedDataset(remote_url, cache_dir=str(tmp_path))
    local = ShardedDataset(clm_dataset)
    for split in local.manifest.splits:
        shards = [s.to_json() for s in local.manifest.shards(split)]
        assert [s.to_json() for s in remote.manifest.shards(split)] == shards


def test_gs_stream_equals_the_local_one_through_a_bounded_prefetching_cache(remote_url, clm_dataset, tmp_path):
    settings = {"batch_size": 8, "seed": 5, "shuffle": True, "shuffle_block_size": BLOCK}
    local = ShardedDataset(clm_dataset, **settings)
    sizes = {s.files["arrow"].path: s.files["arrow"].bytes for s in local.shards.shards}
    bound = 2 * max(sizes.values())
    assert sum(sizes.values()) > bound  # eviction must happen
    cache_dir = tmp_path / "cache"
    remote = ShardedDataset(remote_url, cache_dir=str(cache_dir), cache_size_bytes=bound, prefetch_shards=1,
                            **settings)
    assert remote.fingerprint() == local.fingerprint()
    expected = list(local)

    def in_use() -> dict[str, int]:
        return {remote.shards.shards[i].files["arrow"].path: sizes[remote.shards.shards[i].files["arrow"].path]
                for i in remote.shards._open}

    stream = iter(remote)
    got = [next(stream)]
    # While the first shard is read, the next one of the order is downloaded in the background.
    assert remote.shards.wait_prefetch(30)
    sequence = [remote.shards.shards[i].files["arrow"].path for i in remote.order(0).shard_sequence.tolist()]
    upcoming = next(p for p in sequence if p not in in_use())
    cached = {os.path.relpath(p, remote.location.cache_root) for p in cache_files(cache_dir)}
    assert upcoming in cached
    assert remote.cache.stats["prefetched"] >= 1

    for example in stream:
        got.append(example)
        on_disk = sum(cache_files(cache_dir).values())
        assert on_disk <= bound + sum(in_use().values()), (on_disk, bound, in_use())
    assert_same_stream(got, expected)
    stats = remote.cache.stats
    assert stats["evictions"] > 0 and stats["peak_excess"] <= 0, stats
    assert remote.shards.wait_prefetch(30)
    assert sum(cache_files(cache_dir).values()) <= bound + sum(in_use().values())
    assert not any(".partial-" in p or p.endswith(".lock") for p in cache_files(cache_dir))


def test_gs_webdataset_shards_and_dataloader_workers_share_one_bounded_cache(remote_url, clm_dataset, tmp_path):
    settings = {"batch_size": 4, "seed": 1, "shuffle_block_size": BLOCK}
    local = ShardedDataset(clm_dataset, **settings)
    expected = [e["key"] for e in local]
    largest = max(s.files["webdataset"].bytes for s in local.shards.shards)
    tar = ShardedDataset(remote_url, fmt="webdataset", cache_dir=str(tmp_path / "tar"), cache_size_bytes=largest,
                         **settings)
    assert [e["key"] for e in tar] == expected
    assert tar.cache.stats["evictions"] > 0 and tar.cache.stats["peak_excess"] <= 0
    # Two worker processes read through one cache directory holding about two shards.
    largest = max(s.files["arrow"].bytes for s in local.shards.shards)
    remote = ShardedDataset(remote_url, cache_dir=str(tmp_path / "shared"), cache_size_bytes=2 * largest, **settings)
    loader = make_dataloader(remote, collate_fn=batch_keys, num_workers=2)
    assert [k for batch in loader for k in batch] == expected


def test_corrupted_object_in_the_bucket_raises_naming_the_shard(gcs, remote_url, tmp_path):
    import gcsfs

    fs = gcsfs.core.GCSFileSystem(token="anon", endpoint_url=gcs.host)
    name = "train/arrow/data-00002-of-00004.arrow"
    for path in fs.find(f"{BUCKET}/out"):
        data = fs.cat_file(path)
        if path.endswith(name):
            data = bytearray(data)
            data[len(data) // 2] ^= 0xFF
            data = bytes(data)
        fs.pipe_file(path.replace(f"{BUCKET}/out/", f"{BUCKET}/bad/", 1), data)
    url = f"gs://{BUCKET}/bad"
    ds = ShardedDataset(url, shuffle=False, cache_dir=str(tmp_path), prefetch_shards=2)
    stream = iter(ds)
    keys = [next(stream)["key"]]
    assert ds.shards.wait_prefetch(30)  # shards 1 and 2 were fetched ahead; shard 2 was refused
    assert ds.shards._prefetcher.errors == 1 and ds.cache.stats["prefetched"] == 1
    assert not os.path.exists(ds.location.cache_path(name))
    with pytest.raises(ShardIntegrityError, match=f"shard {re.escape(name)} downloaded from {url}: sha256"):
        for example in stream:
            keys.append(example["key"])
    assert len(keys) == sum(ds.shards.rows[:2])  # shards 0 and 1 were read, then shard 2 was refused
    assert not any(n.endswith(".arrow") and "00002" in n for _, _, names in os.walk(tmp_path) for n in names)


# -- the cache itself (no server needed) ---------------------------------------------------------------------------
TAG = "0123456789abcdef"


def _writer(data: bytes):
    return lambda sink: sink.write(data)


def test_cache_evicts_least_recently_used_files_and_never_leased_ones(tmp_path):
    cache = ShardCache(str(tmp_path), max_bytes=250)
    paths = [str(tmp_path / TAG / f"f{i}") for i in range(4)]
    held = cache.acquire(paths[0], _writer(b"a" * 100), size=100)
    cache.acquire(paths[1], _writer(b"b" * 100), size=100).close()
    cache.acquire(paths[2], _writer(b"c" * 100), size=100).close()  # evicts f1 (f0 is leased)
    assert os.path.exists(paths[0]) and not os.path.exists(paths[1]) and os.path.exists(paths[2])
    assert not cache.prefetch(paths[3], _writer(b"d" * 100), size=100, protect={paths[2]})  # does not fit
    assert cache.stats["prefetch_skipped"] == 1
    held.close()  # f0 becomes the most recently used file
    assert cache.prefetch(paths[3], _writer(b"d" * 100), size=100)  # f2, the least recently used, goes
    assert os.path.exists(paths[0]) and not os.path.exists(paths[2]) and cache.size() == 200
    # Files outside the 16-hex-digit dataset directories are never counted nor deleted.
    (tmp_path / "mine.txt").write_bytes(b"x" * 1000)
    cache.acquire(paths[1], _writer(b"b" * 100), size=100).close()
    assert (tmp_path / "mine.txt").exists()


def test_a_file_leased_by_another_process_is_not_evicted(tmp_path):
    path = str(tmp_path / TAG / "shard.arrow")
    cache = ShardCache(str(tmp_path), max_bytes=100)
    cache.acquire(path, _writer(b"s" * 100), size=100).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from loaders.access.cache import ShardCache; "
         f"lease = ShardCache({str(tmp_path)!r}, None).acquire({path!r}, None); print('held', flush=True); "
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(ROOT),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        cache.discard(path)
        assert os.path.exists(path)
    finally:
        holder.communicate("", timeout=30)
    cache.discard(path)
    assert not os.path.exists(path)


def test_a_damaged_cached_copy_is_fetched_again(tmp_path):
    import fsspec
    from conftest import write_dataset

    local = write_dataset(tmp_path / "local", [5, 7])
    memory = fsspec.filesystem("memory")
    for dirpath, _, names in os.walk(local):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as handle:
                memory.pipe(f"memory://bucket/heal/{os.path.relpath(path, local)}", handle.read())
    cache_dir = str(tmp_path / "cache")
    first = ShardedDataset("memory://bucket/heal", cache_dir=cache_dir, shuffle=False)
    keys = [e["key"] for e in first]
    name = "train/arrow/data-00001-of-00002.arrow"
    path = first.location.cache_path(name)
    with open(path, "r+b") as handle:  # same size, other bytes
        data = bytearray(handle.read())
        data[-50] ^= 0xFF
        handle.seek(0)
        handle.write(bytes(data))
    stat = os.stat(path)  # a later write moves the mtime; this one may share the download's clock tick
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    again = ShardedDataset("memory://bucket/heal", cache_dir=cache_dir, shuffle=False)
    assert [e["key"] for e in again] == keys
    assert again.cache.stats["downloads"] == 1


def test_cache_arguments_are_checked(small_dataset):
    path, _ = small_dataset
    with pytest.raises(ValueError, match="cache_size_bytes"):
        ShardedDataset(path, cache_size_bytes=-1)
    with pytest.raises(ValueError, match="prefetch_shards"):
        ShardedDataset(path, prefetch_shards=-1)
