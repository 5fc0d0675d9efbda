"""Issue 17 for the readers: a manifest's paths are data (local and emulator-served datasets),
the cache deletes only its own files, every reader checks sha256, schema, rows, dtypes and
shapes, and a shard truncated under a running loader is a Python error naming it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile

import numpy as np
import pytest
from conftest import write_dataset
from gcs_emulator import start_emulator, upload

from loaders import ShardedDataset, ShardIntegrityError, open_dataset
from loaders.cache import ShardCache
from loaders.files import DatasetLocation, check_relative
from loaders.inspection.source import open_inspected

SHARD = "train/arrow/data-00000-of-00002.arrow"
TAR = "train/wds/data-00000-of-00002.tar"
BUCKET = "lmshards-hostile"


def _edit(root, edit) -> None:
    path = os.path.join(root, "manifest.json")
    with open(path) as handle:
        data = json.load(handle)
    edit(data)
    with open(path, "w") as handle:
        json.dump(data, handle)


def _set_path(data: dict, path: str, *, sha256: str | None = None, size: int | None = None) -> None:
    entry = data["splits"]["train"]["shards"][0]["files"]["arrow"]
    entry["path"] = path
    if sha256 is not None:
        entry["sha256"], entry["bytes"] = sha256, size


@pytest.fixture
def dataset(tmp_path):
    return write_dataset(tmp_path / "ds", [5, 4])


@pytest.mark.parametrize("path", ["/etc/hostname", "../../../../etc/hostname", "train/../../outside.arrow",
                                  "train\\arrow\\x.arrow", "gs://bucket/x.arrow", "C:/x.arrow", "./train/x.arrow",
                                  "train//x.arrow", ""])
def test_an_unsafe_shard_path_is_refused_naming_the_manifest(dataset, path):
    _edit(dataset, lambda data: _set_path(data, path))
    where = os.path.join(dataset, "manifest.json")
    for open_it in (lambda: ShardedDataset(dataset), lambda: open_dataset(dataset), lambda: open_inspected(dataset)):
        with pytest.raises(ShardIntegrityError) as caught:
            open_it()
        assert "manifest.json" in str(caught.value) and (where in str(caught.value) or dataset in str(caught.value))


def test_check_relative_accepts_the_writers_names():
    for name in ("train/arrow/data-00000-of-00002.arrow", "tokenizer.json", "rejected/rejected.jsonl"):
        assert check_relative(name, "m") == name


@pytest.fixture(scope="module")
def gcs():
    emulator = start_emulator(BUCKET)
    yield emulator
    emulator.stop()
    os.environ.pop("STORAGE_EMULATOR_HOST", None)


def _serve(root: str, url: str) -> None:
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            upload(path, f"{url}/{os.path.relpath(path, root)}")


def test_an_emulator_served_manifest_cannot_make_the_loader_write_or_delete_a_file(gcs, dataset, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the user's own file")
    payload = b"attacker's bytes"
    target = tmp_path / "created-by-attacker.txt"
    cache = tmp_path / "cache"
    for index, path in enumerate([str(victim), str(target), "../../../victim.txt"]):
        evil = f"gs://{BUCKET}/evil{index}"
        _edit(dataset, lambda data, p=path: _set_path(data, p, sha256=hashlib.sha256(payload).hexdigest(),
                                                       size=len(payload)))
        _serve(dataset, evil)
        with pytest.raises(ShardIntegrityError, match="manifest.json"):
            ShardedDataset(evil, cache_dir=str(cache))
        from pipelines.inspect import inspect_main, show_main, validate_main

        for command in (inspect_main, show_main, validate_main):
            assert command([evil]) == 1
    assert victim.read_bytes() == b"the user's own file" and not target.exists()
    assert not (tmp_path / "victim.txt.partial").exists()


def test_a_symlink_in_the_cache_is_never_written_through(gcs, dataset, tmp_path):
    url = f"gs://{BUCKET}/good"
    _serve(dataset, url)
    cache = tmp_path / "cache"
    location = DatasetLocation(url, str(cache))
    outside = tmp_path / "outside"
    outside.mkdir()
    os.makedirs(location.cache_root)
    os.symlink(outside, os.path.join(location.cache_root, "train"))  # planted: the cache's train/ is elsewhere
    with pytest.raises(ShardIntegrityError, match="resolves outside the cache"):
        list(ShardedDataset(url, cache_dir=str(cache), shuffle=False))
    assert list(outside.iterdir()) == []


def test_the_cache_deletes_only_its_own_regular_files(tmp_path):
    cache = ShardCache(str(tmp_path / "cache"))
    tag = tmp_path / "cache" / "0123456789abcdef"
    tag.mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    link = tag / "link.arrow"
    link.symlink_to(victim)
    cache.discard(str(link), damaged=True)
    cache.discard(str(victim), damaged=True)  # outside the cache
    assert victim.read_text() == "mine" and link.is_symlink()
    assert not cache._evict(str(link)) and victim.exists()
    own = tag / "own.arrow"
    own.write_bytes(b"x")
    cache.discard(str(own), damaged=True)
    assert not own.exists()


# --- every reader checks what it reads ----------------------------------------------------------


def _flip(path: str, offset: int = -100) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset, os.SEEK_END)
        value = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([value[0] ^ 0xFF]))


def test_open_dataset_checks_sha256_sizes_schema_and_rows(dataset):
    keys = [e["key"] for e in open_dataset(dataset).iter_examples()]
    assert len(keys) == 9
    broken = dataset + "-flipped"
    shutil.copytree(dataset, broken)
    _flip(os.path.join(broken, SHARD))
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: sha256"):
        list(open_dataset(broken).iter_examples())
    # verify="never" trusts the bytes (documented): only sizes are compared
    assert len(list(open_dataset(broken, verify="never").iter_examples())) == 9
    _edit(dataset, lambda d: d["splits"]["train"]["shards"][0].update(rows=6))
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: 5 rows, the manifest says 6"):
        list(open_dataset(dataset).iter_examples())
    _edit(dataset, lambda d: d["splits"]["train"]["shards"][0].update(rows=5))

    def int64(data):
        for column in data["schema"]["columns"]:
            if column["name"] == "input_ids":
                column["type"] = column["type"].replace("int32", "int64")

    _edit(dataset, int64)
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: schema"):
        list(open_dataset(dataset).iter_examples())
    with pytest.raises(ShardIntegrityError, match="member .* is a int32 array of shape \\(8,\\), the manifest's schema "
                                                  "says int64 array"):
        list(open_dataset(dataset).iter_examples(fmt="webdataset"))


def _rewrite_tar(root: str, relative: str, change) -> None:
    """Rewrite a tar shard through ``change(name, payload) -> [(name, payload), ...]`` and re-hash it."""
    path = os.path.join(root, relative)
    out = io.BytesIO()
    with tarfile.open(path) as source, tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as target:
        for member in source.getmembers():
            for name, payload in change(member.name, source.extractfile(member).read()):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                target.addfile(info, io.BytesIO(payload))
    data = out.getvalue()
    with open(path, "wb") as handle:
        handle.write(data)

    def rehash(manifest):
        for shard in manifest["splits"]["train"]["shards"]:
            entry = shard["files"]["webdataset"]
            if entry["path"] == relative:
                entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()

    _edit(root, rehash)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def test_webdataset_members_are_checked_for_dtype_and_shape(dataset):
    _rewrite_tar(dataset, TAR, lambda name, payload: [(name, _npy(np.arange(7, dtype=np.int64)))
                                                      if name.endswith(".input_ids.npy") else (name, payload)])
    with pytest.raises(ShardIntegrityError, match=r"input_ids\.npy is a int64 array of shape \(7,\), the manifest's "
                                                  r"schema says int32 array of shape \(8,\)"):
        list(ShardedDataset(dataset, fmt="webdataset", shuffle=False))
    with pytest.raises(ShardIntegrityError, match=r"int64 array of shape \(7,\)"):
        list(open_dataset(dataset).iter_examples(fmt="webdataset"))


def test_an_extra_tar_field_is_refused_by_every_reader(dataset):
    def extra(name, payload):
        out = [(name, payload)]
        if name.endswith(".input_ids.npy"):
            out.append((name.replace(".input_ids.npy", ".pixels.npy"), _npy(np.zeros(3, np.int32))))
        return out

    _rewrite_tar(dataset, TAR, extra)
    with pytest.raises(ShardIntegrityError, match="pixels"):
        list(ShardedDataset(dataset, fmt="webdataset", shuffle=False))
    with pytest.raises(ShardIntegrityError, match="pixels"):
        list(open_dataset(dataset).iter_examples(fmt="webdataset"))


def test_a_shard_truncated_under_a_running_loader_is_a_python_error(tmp_path):
    root = write_dataset(tmp_path / "big", [4000, 10], seq_len=256)
    dataset = ShardedDataset(root, batch_size=8, shuffle=False)
    stream = iter(dataset)
    first = [next(stream) for _ in range(16)]
    assert first[0]["key"] == "s0-r0"
    path = os.path.join(root, SHARD)
    os.truncate(path, os.path.getsize(path) // 3)  # the mapping now reaches past the end of the file
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: truncated while it was being read"):
        for _ in stream:
            pass


def test_a_shard_truncated_under_dataloader_workers_is_a_python_error(tmp_path):
    from loaders.dataloader import make_dataloader

    root = write_dataset(tmp_path / "big", [6000, 10], seq_len=256)
    loader = make_dataloader(ShardedDataset(root, batch_size=8, shuffle=False), num_workers=2)
    batches = iter(loader)
    next(batches)
    path = os.path.join(root, SHARD)
    os.truncate(path, os.path.getsize(path) // 4)
    # A worker that had the shard open finds it shrunk; one that opens it now finds the wrong size:
    # either way a Python error naming the shard, never a worker killed by SIGBUS.
    with pytest.raises(ShardIntegrityError, match=f"shard {SHARD}: (truncated while it was being read|"
                                                  r"\d+ bytes on disk, the manifest says)"):
        for _ in batches:
            pass
